"""CRPS training through dlscale's commands on the tiny ERA5 data: ``crps_tiny`` (4 noise channels, 4 members a
sample) trains, one-step and on rollouts; its ensemble forecast draws the model's own noise by default, its
members differ and are the same again from the same seed; evaluate and export run it as the deterministic
(zero-noise) model; and the wrong combinations are one line with exit status 2, before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from run_configs import tiny_run_config

import dlscale
from dlscale.cli import main
from dlscale.run.training import train

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "vit_era5.yaml"
SHORT = ("data.limit_nsamples=8", "data.limit_nsamples_val=4", "train.num_epochs=1")


@pytest.fixture(scope="module")
def crps_run(tiny_era5: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    expdir = tmp_path_factory.mktemp("crps_runs")
    assert train(tiny_run_config(CONFIG, tiny_era5, expdir, *SHORT, name="crps_tiny")) == 0
    return expdir / "crps_tiny" / "00"


def test_a_crps_run_trains_and_its_ensemble_draws_the_models_noise_reproducibly(crps_run):
    summary = json.loads((crps_run / "summary.json").read_text())
    assert summary["outcome"] == "finished" and np.isfinite(summary["history"][-1]["train_loss"])
    short = {"lead": "12h", "init_count": 3, "figures": False}
    deterministic = dlscale.forecast(crps_run, **short)
    ensemble = dlscale.forecast(crps_run, **short, members=4)  # no --perturb: the model's own noise
    assert ensemble["members"] == 4 and "noise inputs" in ensemble["ensemble"]["perturbation"]
    assert "ens4-noise" in ensemble["output_dir"]
    # the control reads zero noise: the deterministic forecast
    assert ensemble["scores"]["model"] == deterministic["scores"]["model"]
    assert ensemble["ensemble"]["calibration_band"] == [0.8, 1.25]
    assert ensemble["ensemble"]["calibrated"]["t2m"][0] is None  # lead 0: no spread/skill
    assert all(isinstance(v, bool) for v in ensemble["ensemble"]["calibrated"]["t2m"][1:])
    spread = ensemble["ensemble"]["spread"]["t2m"]
    assert spread[0] == 0 and spread[1] > 0 and spread[2] > 0  # the same start, then members of their own
    again = dlscale.forecast(crps_run, **short, members=4, perturb="noise")
    assert again["ensemble"]["crps"] == ensemble["ensemble"]["crps"]  # the same seed draws the same members
    other_seed = dlscale.forecast(crps_run, **short, members=4, overrides=["train.seed=1"])
    assert other_seed["ensemble"]["crps"] != ensemble["ensemble"]["crps"]


def test_evaluate_and_export_run_the_model_on_zero_noise(crps_run, tmp_path):
    final = json.loads((crps_run / "summary.json").read_text())["final"]
    evaluated = dlscale.evaluate(crps_run)
    assert evaluated["loss"] == pytest.approx(final["val_loss"], rel=1e-6)  # as its last validation
    assert main(["export", str(crps_run), "--out", str(tmp_path / "export")]) == 0
    manifest = json.loads((tmp_path / "export" / "manifest.json").read_text())
    assert manifest["program"]["matches_model"] is True


def test_crps_trains_on_rollouts(tiny_era5, tmp_path):
    cfg = tiny_run_config(CONFIG, tiny_era5, tmp_path, *SHORT, "train.rollout_steps=2", name="crps_tiny")
    assert train(cfg) == 0
    log = (tmp_path / "crps_tiny" / "00" / "out.log").read_text()
    assert "2-step rollouts" in log or "rollout" in log


@pytest.mark.parametrize(
    ("config", "settings", "message"),
    [
        (
            "tiny",
            ["train.loss=crps", "train.ensemble_members=4"],
            "train.loss: crps trains the members of a model",
        ),
        ("crps_tiny", ["train.ensemble_members=1"], "train.ensemble_members: 1 with train.loss crps"),
        ("tiny", ["train.ensemble_members=4"], "only train.loss crps trains an ensemble"),
        ("tiny", ["model.noise_channels=4"], "model.noise_channels: 4 with train.loss 'workload'"),
        ("crps_tiny", ["train.loss=mse"], "train.loss"),
        (
            "crps_tiny",
            ["parallel.tensor_parallel=2"],
            "parallel.tensor_parallel: 2 with model.noise_channels 4",
        ),
        ("crps_tiny", ["model.noise_channels=-1"], "model.noise_channels: must be 0"),
    ],
)
def test_wrong_crps_settings_are_one_line_before_anything_runs(config, settings, message, tmp_path, capsys):
    argv = ["train", "--yaml_config", str(CONFIG), "--config", config, "--set", f"log.expdir={tmp_path}"]
    for setting in settings:
        argv += ["--set", setting]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("dlscale: error: ") and err.count("\n") == 1 and message in err, err
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.slow
def test_noise_members_of_a_model_without_noise_are_one_line(tiny_era5, tmp_path, capsys):
    assert train(tiny_run_config(CONFIG, tiny_era5, tmp_path, *SHORT)) == 0
    run = tmp_path / "tiny" / "00"
    argv = ["forecast", str(run), "--lead", "12h", "--init-count", "2", "--no-figures", "--members", "3"]
    assert main([*argv, "--perturb", "noise"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--perturb noise: the model reads no noise" in err, err
    assert main(argv) == 2  # no --perturb on a model without noise: the gaussian scale must be chosen
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "an ensemble needs --perturb" in err, err
    assert not (run / "forecast").exists()
    # the deterministic run's weights start a CRPS fine-tune: the noise channels' input weights at zero
    argv = ["train", "--yaml_config", str(CONFIG), "--config", "crps_tiny", "--set", f"data.root={tiny_era5}",
            "--set", f"log.expdir={tmp_path}", "--set", "data.limit_nsamples=8", "--set", "data.limit_nsamples_val=4",
            "--set", "train.num_epochs=1", "--resume", str(run / "checkpoints" / "ckpt_latest.pt"),
            "--resume_weights_only"]  # fmt: skip
    assert main(argv) == 0
    log = (tmp_path / "crps_tiny" / "00" / "out.log").read_text()
    assert "patch_embed.proj.weight widened from 20 to 24 input channels" in log
