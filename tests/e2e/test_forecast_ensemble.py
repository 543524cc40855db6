"""``dlscale forecast --members N --perturb ...`` end to end on a tiny trained ERA5 run: the ensemble's scores
beside the control's (the deterministic forecast, to the bit), in scores.json, scores.csv, the log and figures of
a directory of its own; dropout members for a model with dropout; bad input one line, exit 2, nothing written."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from run_configs import tiny_run_config

import dlscale
from dlscale.cli import main
from dlscale.run.training import train

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SHORT = {"lead": "12h", "init_count": 4}


@pytest.fixture(scope="module")
def era5_run(tiny_era5: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny ERA5 run (one epoch) with dropout, which a forecast switches off unless asked."""
    expdir = tmp_path_factory.mktemp("ensemble_runs")
    overrides = ("train.num_epochs=1", "model.dropout=0.2")
    assert train(tiny_run_config(CONFIGS / "vit_era5.yaml", tiny_era5, expdir, *overrides)) == 0
    return expdir / "tiny" / "00"


@pytest.fixture(scope="module")
def deterministic(era5_run: Path) -> dict:
    return dlscale.forecast(era5_run, **SHORT, figures=False)


@pytest.mark.slow
def test_the_ensemble_is_scored_beside_its_control_in_a_directory_of_its_own(era5_run, deterministic, capsys):
    capsys.readouterr()
    document = dlscale.forecast(era5_run, **SHORT, members=5, perturb="gaussian:0.2:800")
    logged = capsys.readouterr()
    logged = logged.out + logged.err
    directory = Path(document["output_dir"])
    assert directory.name == "test-ckpt_latest-lead12h-init4-clim-timemean-ens5-gaussian0.2-800km"
    assert Path(deterministic["output_dir"]) != directory  # neither replaces the other
    assert document["members"] == 5 and document["options"]["perturb"] == "gaussian:0.2:800"
    assert document["forecasters"][:2] == ["model", "ensemble"]
    # member 0 is the control: the deterministic forecast's scores
    assert document["scores"]["model"] == deterministic["scores"]["model"]
    ensemble = document["ensemble"]
    assert ensemble["members"] == 5
    assert ensemble["perturbation"] == (
        "Gaussian initial-state noise of 0.2 standard deviations, correlated over 800 km"
    )
    for channel in document["channels"]:
        spread, crps, mae = (ensemble[key][channel] for key in ("spread", "crps", "deterministic_crps"))
        assert all(value > 0 for value in spread)  # the members differ from lead 0 on
        assert all(math.isfinite(value) for value in crps + mae)
        ratio = ensemble["spread_skill"][channel]
        rmse = document["scores"]["ensemble"]["rmse"][channel]
        for lead in range(len(rmse)):
            assert ratio[lead] == pytest.approx(math.sqrt(6 / 5) * spread[lead] / rmse[lead], rel=1e-9)
    # a rollout shorter than a day keeps its histograms at the leads its table shows
    assert [histogram["lead_hours"] for histogram in ensemble["rank_histograms"]] == [6.0, 12.0]
    for histogram in ensemble["rank_histograms"]:
        for counts in histogram["counts"].values():
            assert len(counts) == 6 and sum(counts) == 4 * 16 * 32  # 6 ranks, every point of 4 initial times
    rows = list(csv.DictReader((directory / "scores.csv").open()))
    assert list(rows[0])[-3:] == ["crps", "spread", "spread_skill"]
    z500_ensemble = [row for row in rows if row["forecaster"] == "ensemble" and row["channel"] == "z500"]
    assert [float(row["crps"]) for row in z500_ensemble] == pytest.approx(ensemble["crps"]["z500"])
    control = [row for row in rows if row["forecaster"] == "model" and row["channel"] == "z500"]
    assert [float(row["crps"]) for row in control] == pytest.approx(ensemble["deterministic_crps"]["z500"])
    assert {row["spread"] for row in rows if row["forecaster"] == "persistence"} == {""}
    assert {"ensemble.png", "scores.json"} <= set(document["files"])
    assert json.loads((directory / "scores.json").read_text()) == document
    assert "Ensemble of 5 members (Gaussian initial-state noise of 0.2" in logged
    assert "spr/skill" in logged


def test_dropout_members_differ_and_their_control_is_the_deterministic_forecast(era5_run, deterministic):
    document = dlscale.forecast(era5_run, **SHORT, members=3, perturb="dropout", figures=False)
    assert document["files"] == ["scores.json", "scores.csv"]  # figures=False: the scores alone
    assert sorted(path.name for path in Path(document["output_dir"]).iterdir()) == [
        "scores.csv",
        "scores.json",
    ]
    assert Path(document["output_dir"]).name.endswith("-ens3-dropout")
    assert document["scores"]["model"] == deterministic["scores"]["model"]
    spread = document["ensemble"]["spread"]["t2m"]
    # dropout acts in the model's steps: the members start alike (to the rounding of normalizing and back)
    assert spread[0] < 1e-4
    assert spread[1] > 1e3 * spread[0]
    assert "dropout kept on" in document["ensemble"]["perturbation"]
    assert "perturbation_std" not in document["ensemble"]  # no initial-state noise to size


def test_the_perturbation_is_logged_and_recorded_in_each_channels_unit(era5_run, tiny_era5, capsys):
    capsys.readouterr()
    document = dlscale.forecast(
        era5_run, lead="6h", init_count=1, members=2, perturb="gaussian:0.5", figures=False
    )
    printed = capsys.readouterr()
    line = next(line for line in (printed.out + printed.err).splitlines() if "Ensemble of 2 members:" in line)
    # gaussian:0.5 is half of each channel's standard deviation over the training data, in its unit
    stds = np.load(tiny_era5 / "stats" / "global_stds.npy").reshape(-1)
    channels, units = document["channels"], document["units"]
    expected = {name: 0.5 * float(stds[c]) for c, name in enumerate(channels)}
    assert document["ensemble"]["perturbation_std"] == pytest.approx(expected, rel=1e-6)
    assert "in the channels' units, its standard deviation at each point:" in line
    for name in document["headline_channels"]:  # z500, t850, t2m, u10
        assert f"{name} {float(f'{expected[name]:.3g}'):g} {units[name]}" in line, line  # 1430, not 1.43e+03


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--members", "0", "--perturb", "gaussian:0.1"], "--members 0: expected a number of members >= 1"),
        (["--members", "4", "--perturb", "gaussian:-0.5"], "SCALE must be a number above 0"),
        (["--members", "4", "--perturb", "gaussian:nan"], "SCALE must be a finite number"),
        (["--members", "4", "--perturb", "gaussian:1e30"], "SCALE 1e+30 is beyond 10 standard deviations"),
        (
            # once a numpy MemoryError traceback after the model was loaded: the rank histograms alone are 48 GB
            ["--members", "100000000", "--perturb", "gaussian:0.1"],
            "--members 100000000: the ensemble needs ",
        ),
        (["--members", "4"], "an ensemble needs --perturb"),
        (["--perturb", "gaussian:0.1"], "add --members N"),
        (
            ["--members", "4", "--perturb", "dropout", "--set", "model.dropout=0.0"],
            "--perturb dropout: the model has no dropout",
        ),
    ],
)
def test_bad_ensemble_input_is_one_line_exit_2_and_nothing_written(
    options, message, era5_run, tmp_path, capsys
):
    target = tmp_path / "run"
    shutil.copytree(era5_run, target, ignore=shutil.ignore_patterns("forecast"))
    assert main(["forecast", str(target), "--lead", "12h", *options]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "Traceback" not in err
    assert not (target / "forecast").exists()


def test_members_that_blow_up_are_named_in_the_warning_and_the_control_stays_the_models(
    era5_run, deterministic, capsys, monkeypatch
):
    import dlscale.run.forecast as forecast_module

    made = forecast_module.ensemble_members

    def with_member_2_infinite(*args, **kwargs):
        members = made(*args, **kwargs)

        def perturb(starts, state):
            states = members.perturb(starts, state).clone()
            states[:, 1] = float("inf")  # member 2 (the control is member 0, not perturbed)
            return states

        return dataclasses.replace(members, perturb=perturb)

    monkeypatch.setattr(forecast_module, "ensemble_members", with_member_2_infinite)
    capsys.readouterr()
    document = dlscale.forecast(era5_run, **SHORT, members=4, perturb="gaussian:0.1", figures=False)
    logged = capsys.readouterr()
    logged = logged.out + logged.err
    assert document["ensemble"]["nonfinite_members"] == [2]
    assert document["ensemble"]["nonfinite_members_from_lead_hours"] == 0.0
    assert document["nonfinite_from_lead_hours"] is None  # the model's own forecast is finite
    assert document["scores"]["model"] == deterministic["scores"]["model"]
    assert "The ensemble's member 2 holds NaN or infinite values from lead 0d on (of 4 members)" in logged
    assert "while the control (member 0, the model's own forecast) stays finite" in logged
    assert "The model's forecast holds NaN" not in logged
