"""``dlscale forecast`` end to end on a tiny trained ERA5 run: persistence's error is exactly zero at lead 0 and
grows, the lead-1 rollout scores what ``dlscale evaluate`` and a direct computation score, the forecasts written
as netCDF and zarr open in xarray, line up with the truth and equal the rollout's, and bad input is one line with
exit status 2 and nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from run_configs import tiny_run_config

import dlscale
from dlscale.checkpoint.files import load_checkpoint
from dlscale.cli import main
from dlscale.config import load_run_config
from dlscale.data.era5.dataset import ERA5Dataset
from dlscale.data.era5.trajectories import ERA5Trajectories
from dlscale.errors import DataError
from dlscale.run.forecast import ForecastOptions, forecast_checkpoint
from dlscale.run.training import train
from dlscale.workloads import get_workload
from dlscale.workloads.references import as_workload

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
xarray = pytest.importorskip("xarray", reason="the era5 extra (xarray) writes and reads the forecast files")


@pytest.fixture(scope="module")
def era5_run(tiny_era5: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny ERA5 run (one epoch)."""
    expdir = tmp_path_factory.mktemp("forecast_runs")
    assert train(tiny_run_config(CONFIGS / "vit_era5.yaml", tiny_era5, expdir, "train.num_epochs=1")) == 0
    return expdir / "tiny" / "00"


def scores(run: Path, name: str) -> dict:
    return json.loads((run / "forecast" / name / "scores.json").read_text())


@pytest.mark.slow
def test_persistence_is_exact_at_lead_0_and_its_error_grows(era5_run):
    assert main(["forecast", str(era5_run), "--lead", "1d", "--init", "every:6h"]) == 0
    document = scores(era5_run, "test-ckpt_latest-lead1d-every6h-clim-timemean")
    assert document["lead_hours"] == [0.0, 6.0, 12.0, 18.0, 24.0]
    assert document["initial_time_count"] == 20  # 24 states, of which the last 4 cannot reach 1 day
    persistence, model = document["scores"]["persistence"], document["scores"]["model"]
    for name in document["channels"]:
        assert persistence["rmse"][name][0] == 0.0
        assert model["rmse"][name][0] == 0.0
        assert persistence["acc"][name][0] == pytest.approx(1.0)
    for name in ("z500", "t850", "t2m", "u10"):
        errors = persistence["rmse"][name]
        assert all(later > earlier for earlier, later in zip(errors[:-1], errors[1:], strict=True)), name
    assert document["scores"]["climatology"]["acc"]["z500"] == [None] * 5  # no anomaly, no correlation
    # A 1-day rollout's table: its leads (not only the 1-day one) for WeatherBench2's four channels.
    assert document["headline_channels"] == ["z500", "t850", "t2m", "u10"]
    assert [row["lead_hours"] for row in document["headline"]] == [6.0, 12.0, 18.0, 24.0] * 4
    directory = era5_run / "forecast" / "test-ckpt_latest-lead1d-every6h-clim-timemean"
    assert sorted(p.name for p in directory.iterdir()) == sorted(document["files"])
    assert {"scores.csv", "skill_vs_lead.png", "rollout_maps.png"} <= set(document["files"])
    rows = (directory / "scores.csv").read_text().splitlines()
    assert rows[0] == "forecaster,channel,lead_hours,rmse,acc,bias,unit,climatology"
    assert rows[1].endswith(",time mean")  # the session's data set has no climatology by day of year
    assert all(value == 0.0 for value in model["bias"]["z500"][:1])  # lead 0 is the truth itself
    assert len(rows) == 1 + 3 * 20 * 5


def test_the_lead_1_rollout_scores_what_evaluate_scores_for_the_same_initial_time(era5_run):
    document = dlscale.forecast(
        era5_run, split="valid", lead="6h", init="every:6h", init_count=1, figures=False
    )
    assert document["initial_times"] == [document["initial_times"][0]]
    assert main(["evaluate", str(era5_run), "--set", "data.limit_nsamples_val=1"]) == 0
    (limited,) = (era5_run / "eval").glob("valid-ckpt_latest-set-*")  # the --set change names its directory
    evaluated = json.loads((limited / "metrics.json").read_text())
    assert evaluated["samples"] == 1
    stds = ERA5Dataset(load_run_config(era5_run / "config.yaml", "tiny").data, "valid").stds
    for c, name in enumerate(document["channels"]):
        # evaluate's RMSE is on normalized fields; the forecast's in physical units
        normalized = document["scores"]["model"]["rmse"][name][1] / float(stds[c])
        assert normalized == pytest.approx(evaluated["metrics"][f"RMSE/{name}"], rel=1e-4), name


def test_the_lead_1_rmse_is_the_square_root_of_the_mean_weighted_error_over_initial_times(era5_run):
    result = forecast_checkpoint(
        era5_run, ForecastOptions(split="test", lead="6h", init="every:12h", figures=False)
    )
    cfg = load_run_config(era5_run / "config.yaml", "tiny")
    workload = get_workload(cfg.workload)
    model = workload.build_model(cfg.model, cfg.data).eval()
    model.load_state_dict(load_checkpoint(era5_run / "checkpoints" / "ckpt_latest.pt")["model"])
    data = ERA5Dataset(cfg.data, "test")
    raw = ERA5Dataset(cfg.data, "test", normalize=False)
    indices = [start.step for start in result.starts]  # one test file: a state's index is its sample's
    with torch.no_grad():
        predicted = model(torch.stack([data[i][0] for i in indices])).double().numpy()
    means, stds = data.means.reshape(1, -1, 1, 1), data.stds.reshape(1, -1, 1, 1)
    forecast = predicted * stds + means
    truth = np.stack([raw[i][1].numpy() for i in indices]).astype(np.float64)
    weights = np.cos(np.deg2rad(data.latitudes))
    weights = (weights / weights.mean()).reshape(1, 1, -1, 1)
    expected = np.sqrt(((forecast - truth) ** 2 * weights).mean(axis=(-2, -1)).mean(axis=0))
    got = [result.document["scores"]["model"]["rmse"][name][1] for name in result.document["channels"]]
    np.testing.assert_allclose(got, expected, rtol=1e-4)


@pytest.mark.parametrize("fmt", ["netcdf", "zarr"])
def test_the_written_forecast_opens_in_xarray_lines_up_with_the_truth_and_equals_the_rollout(
    fmt, era5_run, tiny_era5
):
    result = forecast_checkpoint(
        era5_run,
        ForecastOptions(split="test", lead="12h", init="every:12h", write=fmt, names="short", figures=False),
    )
    name = "forecast.nc" if fmt == "netcdf" else "forecast.zarr"
    path = era5_run / "forecast" / f"test-ckpt_latest-lead12h-{fmt}-short-clim-timemean" / name
    opened = xarray.open_dataset(path, engine="h5netcdf") if fmt == "netcdf" else xarray.open_zarr(path)
    with opened as written:
        assert tuple(written["z500"].dims) == ("time", "prediction_timedelta", "latitude", "longitude")
        assert written["z500"].attrs["units"] == "m^2/s^2"
        assert written["t2m"].attrs["long_name"] == "2 m temperature"
        assert list(written.prediction_timedelta.values) == [np.timedelta64(6, "h"), np.timedelta64(12, "h")]
        assert written.latitude.values[0] > written.latitude.values[-1]  # north to south, as the data
        channels = result.document["channels"]
        stacked = np.stack([written[c].values for c in channels], axis=2)  # (time, lead, C, H, W)
        np.testing.assert_array_equal(stacked, result.rollout.forecasts)
        # The value at (time t, lead 12 h) is compared with the truth at t + 12 h in the test file.
        first = written.time.values[0]
        assert first == np.datetime64(result.starts[0].time, "ns")
        with h5py.File(sorted((tiny_era5 / "test").glob("*.h5"))[0], "r") as handle:
            hours = (
                written.time.values - np.datetime64(f"{str(first)[:4]}-01-01T00:00", "ns")
            ) / np.timedelta64(1, "h")
            truth = handle["fields"][[int(h) // 6 + 2 for h in hours], :20, :16, :32]
    weights = np.cos(np.deg2rad(written.latitude.values))
    weights = (weights / weights.mean()).reshape(1, 1, -1, 1)
    mse = ((stacked[:, 1].astype(np.float64) - truth) ** 2 * weights).mean(axis=(-2, -1)).mean(axis=0)
    expected = [result.document["scores"]["model"]["rmse"][c][2] for c in channels]
    np.testing.assert_allclose(np.sqrt(mse), expected, rtol=1e-4)


def test_the_python_api_returns_what_scores_json_holds(era5_run):
    document = dlscale.forecast(str(era5_run), lead="1d", init="every:12h", init_count=3, figures=False)
    assert document == scores(era5_run, "test-ckpt_latest-lead1d-init3-clim-timemean")
    assert document["initial_time_count"] == 3


@pytest.mark.parametrize(
    ("case", "message"),
    [
        (
            ["--lead", "10d"],
            "--lead 10 d reaches beyond the data: no rollout in the test split is that long, the longest reaches 5 d 18 h",
        ),
        (["--lead", "9h"], "--lead 9h: expected a positive multiple of the model's step of 6 h"),
        (["--lead", "10"], "--lead '10': expected a positive duration with its unit"),
        (["--split", "train"], "no 'train' split to evaluate"),
        (["--init", "1999-01-01T00", "--lead", "1d"], "is not a state of the data in the test split"),
        (["--init-count", "0"], "--init-count 0: expected a number of initial times >= 1"),
        (["--batch-size", "0"], "--batch-size 0: expected a number of initial times >= 1"),
        (["--set", "data.n_out_channels=19"], "data.n_out_channels"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(case, message, era5_run, tmp_path, capsys):
    target = tmp_path / "run"
    (target / "checkpoints").mkdir(parents=True)
    for name in ("config.yaml",):
        (target / name).write_bytes((era5_run / name).read_bytes())
    (target / "checkpoints" / "ckpt_latest.pt").write_bytes(
        (era5_run / "checkpoints" / "ckpt_latest.pt").read_bytes()
    )
    capsys.readouterr()
    assert main(["forecast", str(target), *case]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("dlscale: error: ") and message in error[0], error
    assert not (target / "forecast").exists()


def test_a_run_without_a_checkpoint_is_one_line(tmp_path, capsys):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    assert main(["forecast", str(tmp_path / "run")]) == 2
    assert "dlscale forecast takes a run directory" in capsys.readouterr().err


def test_a_workload_without_forecast_data_cannot_roll_out():
    workload = as_workload(get_workload("cnn_mnist"), "cnn_mnist")
    with pytest.raises(
        DataError, match="workload 'cnn_mnist' cannot roll out: it has no forecast_data member"
    ):
        workload.forecast_data(None, "test")


def test_headline_channels_the_data_lacks_stop_the_forecast_before_it_rolls_out(
    era5_run, tmp_path, monkeypatch, capsys
):
    target = tmp_path / "run"
    (target / "checkpoints").mkdir(parents=True)
    shutil.copy(era5_run / "config.yaml", target / "config.yaml")
    shutil.copy(era5_run / "checkpoints" / "ckpt_latest.pt", target / "checkpoints" / "ckpt_latest.pt")
    monkeypatch.setattr(ERA5Trajectories, "headline_channels", ("z500", "q700"), raising=False)
    capsys.readouterr()
    assert main(["forecast", str(target), "--lead", "6h"]) == 2
    output = capsys.readouterr()
    error = output.err.strip().splitlines()
    assert len(error) == 1 and "ERA5Trajectories.headline_channels names 'q700'" in error[0], error
    assert "their channels: u10, v10, t2m" in error[0]
    assert "Forecasting with" not in output.out + output.err  # before the model is even loaded
    assert not (target / "forecast").exists()


def test_a_model_that_predicts_fewer_channels_than_it_reads_cannot_roll_out(tiny_era5):
    cfg = load_run_config(
        CONFIGS / "vit_era5.yaml", "tiny", [f"data.root={tiny_era5}", "data.n_out_channels=19"]
    )
    with pytest.raises(DataError, match="reads 20 channels .* and predicts 19"):
        ERA5Trajectories(cfg.data, "test")


def test_dates_come_from_a_files_time_dataset_else_from_its_year(tiny_era5, tmp_path):
    data = tmp_path / "era5"
    shutil.copytree(tiny_era5, data)
    cfg = load_run_config(CONFIGS / "vit_era5.yaml", "tiny", [f"data.root={data}"]).data
    assert ERA5Trajectories(cfg, "test").starts()[1].time == np.datetime64("1982-01-01T06:00")
    (path,) = sorted((data / "test").glob("*.h5"))
    first = np.datetime64("2020-03-01T06:00", "s").astype(np.int64)
    with h5py.File(path, "r+") as handle:  # as dlscale data import-era5 writes it: seconds since 1970
        handle["time"] = first + 6 * 3600 * np.arange(handle["fields"].shape[0], dtype=np.int64)
    starts = ERA5Trajectories(cfg, "test").starts()
    assert [start.time for start in starts[:2]] == [
        np.datetime64("2020-03-01T06:00"),
        np.datetime64("2020-03-01T12:00"),
    ]


# --- data.dt > 1: a model step is dt states of the files -----------------------------------------------------


def test_with_dt_2_a_model_step_is_12_hours_and_lead_l_is_the_state_2l_indices_on(tiny_era5):
    cfg = load_run_config(CONFIGS / "vit_era5.yaml", "tiny", [f"data.root={tiny_era5}", "data.dt=2"]).data
    trajectories = ERA5Trajectories(cfg, "test")
    assert (trajectories.hours_per_state, trajectories.step_hours) == (6.0, 12.0)
    starts = trajectories.starts()
    assert len(starts) == 24
    assert starts[4].time == np.datetime64("1982-01-02T00:00")  # the states stay 6 h apart
    picked = [starts[1], starts[4]]
    assert [trajectories.reach(start) for start in picked] == [11, 9]  # to state 23 and to state 22, of 0..23
    with h5py.File(tiny_era5 / "test" / "1982.h5", "r") as handle:
        fields = handle["fields"][:, :20, :16, :32]
    # Lead 9 of state 4 is state 22, which only a sample's target holds (the last input is state 21).
    for lead in (0, 1, 3, 9):
        expected = fields[[start.step + 2 * lead for start in picked]]
        assert np.array_equal(trajectories.states(picked, lead).numpy(), expected), f"lead {lead}"


def test_with_dt_2_the_forecast_scores_leads_12_hours_apart_against_the_truth_2l_states_on(
    era5_run, tiny_era5
):
    options = ForecastOptions(split="test", lead="1d", init="every:12h", init_count=3, figures=False)
    result = forecast_checkpoint(era5_run, options, overrides=["data.dt=2"])
    document = result.document
    assert document["lead_hours"] == [0.0, 12.0, 24.0]
    # Persistence at lead 2 (24 h) is the initial state's error against the state 4 indices (of 6 h) later.
    initial = np.array([start.step for start in result.starts])
    with h5py.File(tiny_era5 / "test" / "1982.h5", "r") as handle:
        fields = handle["fields"][:, :20, :16, :32].astype(np.float64)
    latitudes = ERA5Dataset(load_run_config(era5_run / "config.yaml", "tiny").data, "test").latitudes
    weights = np.cos(np.deg2rad(latitudes))
    weights = (weights / weights.mean()).reshape(1, 1, -1, 1)
    error = (fields[initial + 4] - fields[initial]) ** 2 * weights
    expected = np.sqrt(error.mean(axis=(-2, -1)).mean(axis=0))
    got = [document["scores"]["persistence"]["rmse"][name][2] for name in document["channels"]]
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_write_says_how_large_its_file_will_be_before_the_rollout(era5_run, capsys):
    capsys.readouterr()
    argv = [
        "forecast",
        str(era5_run),
        "--lead",
        "6h",
        "--init-count",
        "2",
        "--write",
        "netcdf",
        "--no-figures",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr()
    lines = (printed.out + printed.err).splitlines()
    said = next(i for i, line in enumerate(lines) if "--write netcdf: forecast.nc will take" in line)
    assert said < next(i for i, line in enumerate(lines) if "Forecasting with" in line)  # before the rollout
    value, unit = lines[said].split("will take ")[1].split()[:2]
    stated = float(value) * {"kB": 1e3, "MB": 1e6}[unit]
    path = era5_run / "forecast" / "test-ckpt_latest-lead6h-init2-netcdf-clim-timemean" / "forecast.nc"
    assert stated * 0.99 <= path.stat().st_size <= stated * 1.01 + 64_000  # netCDF: uncompressed


def test_a_netcdf_file_larger_than_the_free_space_is_refused_before_the_rollout(
    era5_run, tmp_path, capsys, monkeypatch
):
    from types import SimpleNamespace

    from dlscale.runtime import storage

    full = SimpleNamespace(total=10**9, used=10**9 - 500, free=500)
    monkeypatch.setattr(storage.shutil, "disk_usage", lambda path: full)
    before = sorted((era5_run / "forecast").glob("*"))
    capsys.readouterr()
    argv = ["forecast", str(era5_run), "--lead", "12h", "--init-count", "3", "--write", "netcdf"]
    assert main(argv) == 74
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "cannot write forecast.nc" in error[0] and "500 B free" in error[0], error
    assert sorted((era5_run / "forecast").glob("*")) == before
