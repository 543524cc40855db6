"""The AFNO and SFNO mixers through dlscale's commands on the tiny ERA5 data: a short ``afno_tiny`` and
``sfno_tiny`` run each (with dropout) trains, forecasts and exports (the .pt2 program runs in a Python without
dlscale), evaluates, forecasts an ensemble of dropout members that ``dlscale score`` scores from its file;
``dlscale plan`` plans them; their keys' wrong values and tensor/context parallelism are one line with exit status
2, before anything runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from run_configs import tiny_run_config

import dlscale
from dlscale.cli import main
from dlscale.config import load_run_config
from dlscale.data.era5.dataset import ERA5Dataset
from dlscale.errors import ConfigError
from dlscale.run.training import train

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "vit_era5.yaml"
# One epoch of 2 steps: the commands, not the training, are under test. Dropout (in the blocks' MLPs, and
# drop-path), so that the forecast's ensemble has dropout members.
SHORT = ("data.limit_nsamples=8", "data.limit_nsamples_val=4", "train.num_epochs=1", "model.dropout=0.2")


@pytest.fixture(scope="module", params=["afno", "sfno"])
def spectral_run(request, tiny_era5: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    expdir = tmp_path_factory.mktemp(f"{request.param}_runs")
    name = f"{request.param}_tiny"
    assert train(tiny_run_config(CONFIG, tiny_era5, expdir, *SHORT, name=name)) == 0
    return expdir / name / "00"


# The exported program in a Python without dlscale (isolated mode, no site: only torch's directory is added).
WITHOUT_DLSCALE = """
import importlib.util, sys
site_packages, program, inputs, outputs = sys.argv[1:]
sys.path.append(site_packages)
assert importlib.util.find_spec("dlscale") is None, "dlscale is importable"
import numpy, torch
torch.set_num_threads(1)
module = torch.export.load(program).module()
with torch.no_grad():
    numpy.save(outputs, module(torch.from_numpy(numpy.load(inputs))).numpy())
print("ran without dlscale")
"""


@pytest.mark.slow
def test_a_run_trains_forecasts_and_exports_a_program_that_runs_without_dlscale(spectral_run, tmp_path):
    afno_run = spectral_run  # afno or sfno
    mixer = afno_run.parent.name.split("_")[0]
    log = (afno_run / "out.log").read_text()
    assert f"mixer {mixer}" in log
    summary = json.loads((afno_run / "summary.json").read_text())
    assert summary["outcome"] == "finished" and np.isfinite(summary["history"][-1]["train_loss"])

    assert main(["forecast", str(afno_run), "--lead", "12h", "--init", "every:12h", "--no-figures"]) == 0
    (scores_file,) = (afno_run / "forecast").glob("*/scores.json")
    model = json.loads(scores_file.read_text())["scores"]["model"]["rmse"]
    assert model["z500"][0] == 0.0 and all(np.isfinite(model["z500"][1:])) and model["z500"][-1] > 0

    out = tmp_path / "export"
    assert main(["export", str(afno_run), "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["program"]["matches_model"] is True
    cfg = load_run_config(afno_run / "config.yaml", f"{mixer}_tiny")
    inputs = torch.stack([ERA5Dataset(cfg.data, "valid")[i][0] for i in range(3)])
    with torch.no_grad():
        expected = dlscale.load_model(out).model(inputs).numpy()
    np.save(tmp_path / "inputs.npy", inputs.numpy())
    command = [sys.executable, "-I", "-S", "-c", WITHOUT_DLSCALE, str(Path(torch.__file__).parents[1]),
               str(out / "model.pt2"), "inputs.npy", "outputs.npy"]  # fmt: skip
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "ran without dlscale" in done.stdout, done.stderr[-3000:]
    np.testing.assert_allclose(np.load(tmp_path / "outputs.npy"), expected, rtol=1e-5, atol=1e-5)


def test_a_run_evaluates_and_its_dropout_ensemble_is_forecast_written_and_scored(spectral_run, tiny_era5):
    final = json.loads((spectral_run / "summary.json").read_text())["final"]
    # the valid split and the last checkpoint: the run's last validation
    evaluated = dlscale.evaluate(spectral_run)
    assert evaluated["loss"] == pytest.approx(final["val_loss"], rel=1e-6)
    assert evaluated["metrics"] == pytest.approx(final["metrics"], rel=1e-6)

    short = {"lead": "12h", "init_count": 2, "figures": False}
    deterministic = dlscale.forecast(spectral_run, **short)
    ensemble = dlscale.forecast(spectral_run, **short, members=3, perturb="dropout", write="zarr")
    assert ensemble["members"] == 3 and "dropout kept on" in ensemble["ensemble"]["perturbation"]
    # member 0, the control, keeps dropout off: the deterministic forecast to the bit, in a batch of its own size
    assert ensemble["scores"]["model"] == deterministic["scores"]["model"]
    spread = ensemble["ensemble"]["spread"]["t2m"]
    assert spread[0] < 1e-4 and spread[1] > 1e3 * spread[0]  # the members differ from the first step on

    directory = Path(ensemble["output_dir"])
    assert main(["score", str(directory / "forecast.zarr"), "--truth", str(tiny_era5), "--no-figures"]) == 0
    scored = json.loads((directory / "score-forecast" / "scores.json").read_text())
    assert scored["forecasters"][:2] == ["model", "ensemble"] and scored["ensemble"]["members"] == 3
    for forecaster in ("model", "ensemble", "persistence"):
        for channel in ensemble["channels"]:
            # lead 1 on: the file starts at the first step; float32 fields, to their precision
            got, expected = (doc["scores"][forecaster]["rmse"][channel][1:] for doc in (scored, ensemble))
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7, err_msg=f"{forecaster} {channel}")
    for channel in ensemble["channels"]:
        got, expected = (doc["ensemble"]["crps"][channel][1:] for doc in (scored, ensemble))
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7, err_msg=f"crps {channel}")


@pytest.mark.parametrize("mixer", ["afno", "sfno"])
def test_plan_traces_a_spectral_config_without_its_data_and_lists_no_model_parallel_layouts(
    mixer, tmp_path, capsys
):
    settings = ["--set", f"data.root={tmp_path / 'absent'}", "--set", f"log.expdir={tmp_path}"]
    assert (
        main(["plan", "--yaml_config", str(CONFIG), "--config", f"{mixer}_tiny", "--gpus", "2", *settings])
        == 0
    )
    out = capsys.readouterr().out
    assert "one sample is input float32 (20, 16, 32), target float32 (20, 16, 32)" in out
    assert "DDP dp=2" in out and "FSDP2 dp=2" in out
    assert f"model.mixer '{mixer}' has no tensor/context-parallel form" in out


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            "model.afno_hard_thresholding_fraction=0",
            "model.afno_hard_thresholding_fraction: must be in (0, 1]",
        ),
        (
            "model.afno_hard_thresholding_fraction=1.5",
            "model.afno_hard_thresholding_fraction: must be in (0, 1]",
        ),
        (
            "model.afno_hard_thresholding_fraction=nan",
            "model.afno_hard_thresholding_fraction: must be in (0, 1]",
        ),
        ("model.afno_num_blocks=5", "model.afno_num_blocks: 5 blocks do not divide embed_dim 32"),
        ("model.afno_num_blocks=0", "model.afno_num_blocks: must be at least 1"),
        ("model.afno_sparsity_threshold=-0.1", "model.afno_sparsity_threshold: must be a finite number >= 0"),
        ("model.mixer=fno", "'fno' is not one of attention, afno, sfno"),
        ("parallel.tensor_parallel=2", "parallel.tensor_parallel: 2 with model.mixer 'afno'"),
        ("parallel.context_parallel=4", "parallel.context_parallel: 4 with model.mixer 'afno'"),
    ],
)
def test_wrong_afno_settings_are_one_line_before_anything_runs(setting, message, tmp_path, capsys):
    assert_refused("afno_tiny", setting, message, tmp_path, capsys)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("model.sfno_num_blocks=5", "model.sfno_num_blocks: 5 blocks do not divide embed_dim 32"),
        ("model.sfno_num_blocks=0", "model.sfno_num_blocks: must be at least 1"),
        ("parallel.tensor_parallel=2", "parallel.tensor_parallel: 2 with model.mixer 'sfno'"),
        ("parallel.context_parallel=2", "parallel.context_parallel: 2 with model.mixer 'sfno'"),
    ],
)
def test_wrong_sfno_settings_are_one_line_before_anything_runs(setting, message, tmp_path, capsys):
    assert_refused("sfno_tiny", setting, message, tmp_path, capsys)


def assert_refused(config: str, setting: str, message: str, tmp_path: Path, capsys) -> None:
    argv = ["train", "--yaml_config", str(CONFIG), "--config", config, "--set", f"log.expdir={tmp_path}"]
    assert main([*argv, "--set", setting]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dlscale: error: ") and err.count("\n") == 1 and message in err, err
    assert not any(tmp_path.iterdir())  # nothing written


def test_an_afno_width_need_not_be_a_multiple_of_the_heads(tmp_path):
    overrides = ["model.num_heads=5", f"log.expdir={tmp_path}"]
    assert load_run_config(CONFIG, "afno_tiny", overrides).model.num_heads == 5
    with pytest.raises(ConfigError, match="model.embed_dim: 32 is not a multiple of num_heads=5"):
        load_run_config(CONFIG, "tiny", overrides)
