"""``dlscale evaluate`` end to end on finished tiny runs: the valid split with the last epoch's checkpoint gives
the run's own final validation, ``--checkpoint best`` the best epoch's, the ERA5 test split and MNIST's test set
work, and bad input is one line with exit status 2 and nothing written."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from run_configs import tiny_run_config

import dlscale
from dlscale.checkpoint.files import load_checkpoint, save_checkpoint
from dlscale.cli import main
from dlscale.config import load_run_config
from dlscale.run.training import train
from dlscale.training.observer import Observer
from dlscale.workloads import get_workload

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


class SpoilWeightsFrom(Observer):
    """From epoch ``first`` (1-based) on, every weight shifts before the epoch trains: the best checkpoint is
    then epoch ``first - 1``'s by construction, and the latest another one (see test_best_checkpoint.py)."""

    def __init__(self, first: int):
        self.first = first

    def on_epoch_start(self, trainer) -> None:
        if trainer.progress.epoch + 1 >= self.first:
            with torch.no_grad():
                for parameter in trainer.setup.model.parameters():
                    parameter.add_(0.5)


@pytest.fixture(scope="module")
def era5_run(tiny_era5: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny ERA5 run of 2 epochs whose best checkpoint is epoch 1's and latest epoch 2's."""
    expdir = tmp_path_factory.mktemp("era5_runs")
    assert (
        train(
            tiny_run_config(CONFIGS / "vit_era5.yaml", tiny_era5, expdir),
            extra_observers=[SpoilWeightsFrom(2)],
        )
        == 0
    )
    return expdir / "tiny" / "00"


@pytest.fixture(scope="module")
def mnist_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny MNIST run (it validates on the test images, MNIST's t10k files)."""
    data = tmp_path_factory.mktemp("data") / "mnist_tiny"
    assert main(["data", "synth-mnist", "--out", str(data), "--preset", "tiny"]) == 0
    expdir = tmp_path_factory.mktemp("mnist_runs")
    assert train(tiny_run_config(CONFIGS / "cnn_mnist.yaml", data, expdir)) == 0
    return expdir / "tiny" / "00"


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def written(run: Path, name: str) -> dict:
    return json.loads((run / "eval" / name / "metrics.json").read_text())


@pytest.mark.slow
def test_the_last_checkpoint_on_the_valid_split_gives_the_runs_final_validation(era5_run, capsys):
    final = summary(era5_run)["final"]
    assert main(["evaluate", str(era5_run)]) == 0
    document = written(era5_run, "valid-ckpt_latest")
    assert (document["split"], document["epochs_completed"], document["samples"]) == ("valid", 2, 23)
    assert document["loss"] == pytest.approx(final["val_loss"], rel=1e-6)
    assert document["headline_value"] == pytest.approx(final["headline_value"], rel=1e-6)
    assert document["baseline_loss"] == pytest.approx(final["baseline_loss"], rel=1e-6)
    assert document["metrics"] == pytest.approx(final["metrics"], rel=1e-6)
    assert document["baseline_metrics"] == pytest.approx(final["baseline_metrics"], rel=1e-6)
    assert document["channel_skill"]["not_beating_baseline"] == final["channel_skill"]["not_beating_baseline"]
    # the lines the end of the run printed, and the figures it drew
    out = capsys.readouterr().out
    assert "Evaluation (valid split, 23 samples, ckpt_latest): loss " in out
    unit, scale = final["headline_unit"]
    headline = f"{final['headline_value'] * scale:.3g} {unit} ({final['headline_value']:.4f} normalized)"
    assert f"RMSE(u10m) {headline}; persistence: loss {final['baseline_loss']:.4f}" in out
    assert document["headline_unit"] == [unit, pytest.approx(scale)] and unit == "m/s"
    assert "Skill per channel against persistence" in out and " m/s" in out
    directory = era5_run / "eval" / "valid-ckpt_latest"
    assert (
        sorted(p.name for p in directory.iterdir())
        == sorted(document["files"])
        == [
            "metrics.csv",
            "metrics.json",
            "prediction_vs_target.png",
            "skill_vs_persistence.png",
        ]
    )
    rows = (directory / "metrics.csv").read_text().splitlines()
    assert rows[0] == "metric,value,baseline,unit" and rows[1].startswith(f"loss,{document['loss']!r},")
    # metrics.csv gives each RMSE in its channel's unit: the normalized value times the channel's std
    data = load_run_config(era5_run / "config.yaml", "tiny").data
    stds = np.load(data.path("global_stds_path")).reshape(-1)
    cells = {row[0]: row[1:] for row in csv.reader(rows)}
    for channel, index, unit in (("u10", 0, "m/s"), ("z500", 14, "m^2/s^2")):
        metric = f"RMSE/{channel}"
        physical = [
            document["metrics"][metric] * stds[index],
            document["baseline_metrics"][metric] * stds[index],
        ]
        assert [float(cell) for cell in cells[metric][:2]] == pytest.approx(physical, rel=1e-6)
        assert cells[metric][2] == unit
    # the Python API returns the same document (the command is a thin layer over it)
    again = dlscale.evaluate(era5_run, split="valid", checkpoint="latest")
    assert {k: v for k, v in again.items() if k != "seconds"} == {
        k: v for k, v in document.items() if k != "seconds"
    }


def test_the_best_checkpoint_gives_the_best_epochs_validation(era5_run):
    history = summary(era5_run)["history"]
    assert main(["evaluate", str(era5_run), "--checkpoint", "best"]) == 0
    document = written(era5_run, "valid-ckpt_best")
    assert document["epochs_completed"] == 1
    assert document["loss"] == pytest.approx(history[0]["val_loss"], rel=1e-6)
    assert document["loss"] != pytest.approx(history[1]["val_loss"], rel=1e-3)


def test_the_era5_test_split_reads_the_test_years(era5_run, tiny_era5):
    document = dlscale.evaluate(era5_run, split="test")
    assert "split='test'" in document["dataset"] and document["samples"] == 23
    valid = dlscale.evaluate(era5_run, split="valid")
    assert document["loss"] != pytest.approx(valid["loss"], rel=1e-3)  # other years, other numbers
    assert written(era5_run, "test-ckpt_latest")["loss"] == document["loss"]


@pytest.mark.slow
def test_mnist_test_accuracy_equals_the_runs_validation_accuracy(mnist_run):
    final = summary(mnist_run)["final"]
    assert final["headline"] == "accuracy"
    document = dlscale.evaluate(mnist_run, split="test")
    assert document["headline_value"] == final["headline_value"]  # counts of right answers: exactly
    assert document["loss"] == pytest.approx(final["val_loss"], rel=1e-6)
    assert document["samples"] == 256 and sum(map(sum, document["classes"]["confusion"])) == 256
    files = document["files"]
    assert "class_accuracy.png" in files and "confusion_matrix.png" in files


def test_a_checkpoint_file_alone_uses_its_run_directory_or_its_recorded_config(era5_run, tmp_path):
    inside = dlscale.evaluate(era5_run / "checkpoints" / "ckpt_latest.pt")
    assert inside["run_dir"] == str(era5_run) and inside["config_file"] == str(era5_run / "config.yaml")
    alone = tmp_path / "ckpt_latest.pt"
    shutil.copy(era5_run / "checkpoints" / "ckpt_latest.pt", alone)
    document = dlscale.evaluate(alone)
    assert document["run_dir"] is None and "recorded config" in document["config_file"]
    assert document["loss"] == inside["loss"]
    assert (tmp_path / "eval" / "valid-ckpt_latest" / "metrics.json").is_file()


def other_shape_checkpoint(run: Path, path: Path) -> Path:
    """The run's checkpoint with the weights (and recorded config) of a ViT of embed_dim 64, not 32."""
    cfg = load_run_config(run / "config.yaml", "tiny", ["model.embed_dim=64"])
    payload = load_checkpoint(run / "checkpoints" / "ckpt_latest.pt")
    payload["model"] = get_workload("era5_vit").build_model(cfg.model, cfg.data).state_dict()
    payload["config"] = cfg.to_dict()
    return save_checkpoint(payload, path)


def files_under(directory: Path) -> set[Path]:
    return {p for p in directory.rglob("*")}


@pytest.mark.parametrize(
    "case",
    [
        "another workload",
        "another shape",
        "a weight key set",
        "a split the workload has not",
        "a split the data has not",
        "no checkpoint",
        "no best",
        "a data file",
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(case, era5_run, mnist_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(era5_run, run, ignore=shutil.ignore_patterns("eval"))
    args, expected = {
        "another workload": (
            ["--checkpoint", str(mnist_run / "checkpoints" / "ckpt_latest.pt")],
            "is a checkpoint of workload 'cnn_mnist'",
        ),
        "another shape": (
            ["--checkpoint", str(other_shape_checkpoint(run, tmp_path / "other.pt"))],
            "model.embed_dim: 64 -> 32",
        ),
        "a weight key set": (["--set", "model.depth=3"], "model.depth: 2 -> 3"),
        "a split the workload has not": (["--split", "extrapolation"], "offers valid, test"),
        "a split the data has not": (
            ["--split", "test", "--set", "data.inf_data_path=no_such_years"],
            "no 'test' split to evaluate: ",
        ),
        "no checkpoint": ([], "no checkpoint to evaluate (no checkpoints/ckpt_latest.pt): it holds"),
        "no best": (
            ["--checkpoint", "best"],
            "has no checkpoints/ckpt_best.pt for --checkpoint best; it holds",
        ),
        "a data file": ([], "is not a dlscale checkpoint (an HDF5 file"),
    }[case]
    target = run
    if case == "no checkpoint":
        shutil.rmtree(run / "checkpoints")
    if case == "no best":
        (run / "checkpoints" / "ckpt_best.pt").unlink()
    if case == "a data file":
        target = sorted(Path(era5_data(run)).rglob("*.h5"))[0]
    before = files_under(tmp_path)
    capsys.readouterr()
    assert main(["evaluate", str(target), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dlscale: error: ") and expected in err, err
    assert files_under(tmp_path) == before
    if case == "no checkpoint":
        assert "config.yaml" in err and str(run) in err  # names the directory and what it holds
    if case == "no best":
        assert "ckpt_latest.pt" in err  # which checkpoints exist
    if case in ("a split the workload has not", "a split the data has not"):
        assert "'era5_vit' offers valid, test" in err


def era5_data(run: Path) -> str:
    """The data root of a run, from its config."""
    return load_run_config(run / "config.yaml", "tiny").data.root
