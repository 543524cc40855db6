"""Whole training runs of the `tiny` config, in-process: outputs, determinism, and exact resume."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from run_configs import tiny_run_config

from dlscale.checkpoint.files import load_checkpoint
from dlscale.config import load_run_config
from dlscale.errors import CheckpointError
from dlscale.run.training import train
from dlscale.training.observer import Observer

CONFIG_FILE = Path(__file__).resolve().parents[2] / "configs" / "vit_era5.yaml"

TUTORIAL_LINES = (
    "Starting Training Loop...",
    "Time taken for epoch 1 is",
    "Time taken for epoch 2 is",
    "  Avg train loss=",
    "  Avg val loss=",
    "  Total validation time:",
)


class StopAtStep(Observer):
    """Asks the run to stop after a given global step, exactly as a SIGTERM arriving during that step would."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, trainer, loss) -> None:
        if trainer.progress.global_step == self.step:
            trainer.stop.request("SIGTERM")


class CrashAtStep(Observer):
    """Kills the run without any chance to save (a node failure, an OOM kill)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, trainer, loss) -> None:
        if trainer.progress.global_step == self.step:
            raise RuntimeError("simulated crash")


def run_dir(cfg) -> Path:
    return Path(cfg.log.expdir) / cfg.name / cfg.log.run_num


def final_state(cfg) -> dict:
    return load_checkpoint(run_dir(cfg) / "checkpoints" / "ckpt_latest.pt")


def assert_bitwise_equal(a: dict, b: dict, what: str) -> None:
    assert a.keys() == b.keys(), what
    for key in a:
        if isinstance(a[key], dict):
            assert_bitwise_equal(a[key], b[key], f"{what}.{key}")
        elif isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), f"{what}.{key} differs"
        else:
            assert a[key] == b[key], f"{what}.{key}: {a[key]!r} != {b[key]!r}"


def test_run_writes_logs_config_checkpoints_tensorboard_and_figures(tiny_config):
    cfg = tiny_config()
    assert train(cfg) == 0
    directory = run_dir(cfg)
    log = (directory / "out.log").read_text()
    for line in TUTORIAL_LINES:
        assert line in log
    assert "Val RMSE(u10m)=" in log and "persistence" in log

    # The saved config reproduces the run's config.
    saved = load_run_config(directory / "config.yaml", "tiny")
    assert saved.to_dict() == cfg.to_dict()

    summary = json.loads((directory / "summary.json").read_text())
    assert summary["outcome"] == "finished"
    assert summary["epochs_completed"] == 2 and len(summary["history"]) == 2
    assert summary["global_step"] == summary["total_steps"] == 2 * (46 // 4)
    assert summary["final"]["headline"] == "RMSE(u10m)"
    assert summary["final"]["baseline_headline"] > 0
    # each row says the headline's unit and the scale to it (the loss figure draws RMSE(u10m) in m/s)
    unit, scale = summary["history"][-1]["headline_unit"]
    assert unit == "m/s" and scale == pytest.approx(float(np.load(cfg.data.path("global_stds_path")).flat[0]))

    assert (directory / "checkpoints" / "ckpt_latest.pt").is_file()
    assert (directory / "checkpoints" / "ckpt_best.pt").is_file()
    for figure in ("loss_curves.png", "prediction_vs_target.png"):
        assert (directory / "figures" / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory / "tensorboard")).Reload()
    tags = set(events.Tags()["scalars"])
    expected = {"Loss/train", "Loss/valid", "RMSE(u10m)/valid", "Learning Rate", "Avg iters per sec"}
    assert expected | {"Avg samples per sec", "RMSE(u10m)/persistence", "RMSE/t2m/valid"} <= tags
    assert [e.step for e in events.Scalars("Loss/valid")] == [11, 22]
    assert "Visualization, t2m" in events.Tags()["images"]


@pytest.mark.slow
def test_same_seed_gives_the_same_run_and_another_seed_does_not(tiny_config, tmp_path):
    runs = [
        tiny_config(expdir=tmp_path / name, **flags)
        for name, flags in (("a", {}), ("b", {}), ("c", {"train.seed": 1}))
    ]
    for cfg in runs:
        train(cfg)
    histories = [json.loads((run_dir(cfg) / "summary.json").read_text())["history"] for cfg in runs]
    losses = [[(row["train_loss"], row["val_loss"]) for row in history] for history in histories]
    assert losses[0] == losses[1]
    assert losses[0] != losses[2]
    assert_bitwise_equal(final_state(runs[0])["model"], final_state(runs[1])["model"], "model")


@pytest.mark.parametrize(
    ("stop_steps", "overrides"),
    [
        pytest.param([3], [], id="mid-epoch"),
        pytest.param([11], [], id="after-last-step-before-validation"),
        pytest.param([5, 15], ["model.dropout=0.1"], id="twice-with-dropout"),
        pytest.param([7], ["loader.num_data_workers=2"], id="with-workers"),
        pytest.param([6], ["train.amp_mode=fp16"], id="fp16-with-its-grad-scaler"),
        pytest.param([4], ["loader.data_loader_config=gpu", "loader.num_data_workers=2"], id="gpu-pipeline"),
    ],
)
@pytest.mark.slow
def test_interrupted_and_resumed_run_equals_uninterrupted_run_bitwise(
    tiny_config, tmp_path, stop_steps, overrides
):
    reference = tiny_config(*overrides, expdir=tmp_path / "reference")
    train(reference)

    resumed = tiny_config(*overrides, expdir=tmp_path / "resumed")
    for step in stop_steps:
        train(resumed, extra_observers=[StopAtStep(step)])
        position = final_state(resumed)["progress"]
        assert position["global_step"] == step and not position["completed"]
    train(resumed)

    expected, actual = final_state(reference), final_state(resumed)
    assert actual["progress"]["completed"]
    assert_bitwise_equal(expected["model"], actual["model"], "model")
    assert_bitwise_equal(expected["optimizer"], actual["optimizer"], "optimizer")
    assert expected["grad_scaler"] == actual["grad_scaler"]
    expected_history = [
        (r["epoch"], r["global_step"], r["val_loss"]) for r in expected["progress"]["history"]
    ]
    actual_history = [(r["epoch"], r["global_step"], r["val_loss"]) for r in actual["progress"]["history"]]
    assert actual_history == expected_history
    for a, b in zip(expected["progress"]["history"], actual["progress"]["history"], strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-12)


@pytest.mark.slow
def test_the_gpu_pipeline_trains_exactly_like_the_pytorch_loader(tiny_config, tmp_path):
    pytorch = tiny_config(expdir=tmp_path / "pytorch")
    threaded = tiny_config(
        "loader.data_loader_config=dali", "loader.num_data_workers=3", expdir=tmp_path / "gpu"
    )
    train(pytorch)
    train(threaded)
    expected, actual = final_state(pytorch), final_state(threaded)
    assert_bitwise_equal(expected["model"], actual["model"], "model")
    assert [r["val_loss"] for r in expected["progress"]["history"]] == [
        r["val_loss"] for r in actual["progress"]["history"]
    ]


@pytest.mark.slow
def test_crash_without_saving_resumes_from_the_last_periodic_checkpoint(tiny_config, tmp_path):
    reference = tiny_config(expdir=tmp_path / "reference")
    train(reference)
    crashed = tiny_config("checkpoint.save_every_steps=4", expdir=tmp_path / "crashed")
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(crashed, extra_observers=[CrashAtStep(6)])
    assert not [t for t in threading.enumerate() if t.name == "dlscale-monitor"]  # stopped with the run
    assert final_state(crashed)["progress"]["global_step"] == 4
    train(crashed)
    assert_bitwise_equal(final_state(reference)["model"], final_state(crashed)["model"], "model")


def test_a_finished_run_is_not_trained_again(tiny_config, caplog):
    cfg = tiny_config()
    train(cfg)
    before = (run_dir(cfg) / "checkpoints" / "ckpt_latest.pt").stat().st_mtime_ns
    assert train(cfg) == 0
    assert (run_dir(cfg) / "checkpoints" / "ckpt_latest.pt").stat().st_mtime_ns == before
    assert "already finished" in (run_dir(cfg) / "out.log").read_text()


@pytest.mark.slow
def test_resume_never_refuses_to_overwrite_a_checkpoint(tiny_config):
    train(tiny_config(num_epochs=1))
    with pytest.raises(CheckpointError, match="already holds a checkpoint"):
        train(tiny_config(**{"checkpoint.resume": "never"}))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("model.embed_dim=64", r"give the saved weights another meaning \(model.embed_dim: 32 -> 64\)"),
        # Same shapes, other meaning: each head would read other features of the saved q, k and v.
        ("model.num_heads=2", r"another meaning \(model.num_heads: 4 -> 2\).*--resume_weights_only"),
        ("data.n_out_channels=19", r"data.n_out_channels: 20 -> 19"),
        ("train.global_batch_size=2", "global batch size 4, this run uses 2"),
    ],
)
def test_resuming_into_an_incompatible_run_fails_clearly(tiny_config, change, message):
    train(tiny_config(), extra_observers=[StopAtStep(3)])
    with pytest.raises(CheckpointError, match=message):
        train(tiny_config(change))


def test_a_checkpoint_of_another_workload_is_not_resumed(tiny_config):
    from dlscale.checkpoint.files import load_checkpoint, save_checkpoint

    cfg = tiny_config()
    train(cfg, extra_observers=[StopAtStep(3)])
    latest = run_dir(cfg) / "checkpoints" / "ckpt_latest.pt"
    payload = load_checkpoint(latest)
    payload["meta"]["workload"] = "cnn_mnist"  # as if an MNIST config of the same name had run here
    save_checkpoint(payload, latest)
    with pytest.raises(CheckpointError, match="written by a 'cnn_mnist' run.*trains 'era5_vit'.*--run_num"):
        train(cfg)


def test_resume_from_an_explicit_checkpoint_path(tiny_config, tmp_path):
    first = tiny_config(expdir=tmp_path / "first")
    train(first, extra_observers=[StopAtStep(5)])
    source = run_dir(first) / "checkpoints" / "ckpt_latest.pt"
    second = tiny_config(expdir=tmp_path / "second", **{"checkpoint.resume": str(source)})
    train(second)
    log = (run_dir(second) / "out.log").read_text()
    assert f"Resuming from {source}: epoch 1, step 5 of the epoch (global step 5 of 22)" in log
    config = yaml.safe_load((run_dir(second) / "config.yaml").read_text())
    assert config["tiny"]["checkpoint"]["resume"] == str(source)


@pytest.mark.parametrize(
    "checkpointing",
    [
        pytest.param(
            ["checkpoint.save_every_epochs=2", "checkpoint.keep_best=false"], id="restart-from-scratch"
        ),
        pytest.param([], id="resume-from-the-epoch-1-checkpoint"),
    ],
)
def test_tensorboard_shows_each_step_once_after_a_crash_and_restart(tiny_config, checkpointing):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = tiny_config(*checkpointing)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(cfg, extra_observers=[CrashAtStep(15)])  # in epoch 2, after epoch 1's events were written
    train(cfg)
    events = EventAccumulator(str(run_dir(cfg) / "tensorboard")).Reload()
    assert [e.step for e in events.Scalars("Loss/valid")] == [11, 22]


def test_a_run_without_checkpoints_says_that_a_stop_saved_nothing(tiny_config):
    cfg = tiny_config("checkpoint.enabled=false", "log.tensorboard=false")
    assert train(cfg, extra_observers=[StopAtStep(3)]) == 0
    log = (run_dir(cfg) / "out.log").read_text()
    assert "Stopped by SIGTERM at epoch 1, step 3" in log and "nothing was saved" in log
    assert not (run_dir(cfg) / "checkpoints").exists() and not (run_dir(cfg) / "tensorboard").exists()


@pytest.fixture
def all_cores():
    """Run this in-process test with both cores (the suite defaults to one thread for its forked processes),
    unless pytest-xdist's other worker has the second core (two threads there would only wait on each other)."""
    threads = torch.get_num_threads()
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) <= 1:
        torch.set_num_threads(max(2, threads))
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_the_tutorial_short_config_trains_at_full_size_on_the_real_grid(tmp_path, all_cores):
    """The real tutorial's shapes end to end: 361 x 720 files cropped to 360 x 720, the 23.8 M parameter ViT."""
    from dlscale.data.era5.synth import SynthERA5Spec, write_synthetic_era5

    spec = SynthERA5Spec(height=361, width=720, steps_per_year=3, train_years=1, valid_years=1, test_years=0)
    data = write_synthetic_era5(tmp_path / "era5", spec)
    flags = {"train.local_batch_size": 1, "train.num_iters": 1}
    cfg = tiny_run_config(
        CONFIG_FILE, data, tmp_path / "runs", "limit_nsamples_val=1", name="short", tensorboard=True, **flags
    )
    assert train(cfg) == 0
    log = (run_dir(cfg) / "out.log").read_text()
    assert "ViT with 23,832,960 parameters: embed 384, depth 12, patch 8, 4050 tokens (45x90)" in log
    assert "crop=360x720" in log
    summary = json.loads((run_dir(cfg) / "summary.json").read_text())
    assert summary["outcome"] == "finished" and summary["global_step"] == 1
