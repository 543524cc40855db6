"""``dlscale data climatology`` on synthetic data, then ``dlscale forecast`` scored against it: the ACC and the
climatology forecaster use the climatology of each valid time's day of year and hour (checked against numpy on
the store and the year file), ``--climatology time-mean`` keeps the one mean field, scores.json and scores.csv
say which, and a store that cannot serve the forecast is one line, exit status 2, nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from era5_stores import ZARR_FORMAT_2
from run_configs import tiny_run_config

import dlscale
from dlscale.cli import main
from dlscale.run.training import train

xarray = pytest.importorskip(
    "xarray", reason="the era5 extra (xarray, zarr) writes and reads the climatology"
)
CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.fixture(scope="module")
def run_with_climatology(tiny_era5: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the data root, now with stats/climatology.zarr of its train years 1979-1980, a one-epoch run on it)."""
    root = tmp_path_factory.mktemp("clim") / "era5"
    shutil.copytree(tiny_era5, root)  # the session's data set stays without a climatology store
    assert main(["data", "climatology", "--root", str(root)]) == 0
    expdir = root.parent / "runs"
    assert train(tiny_run_config(CONFIGS / "vit_era5.yaml", root, expdir, "train.num_epochs=1")) == 0
    return root, expdir / "tiny" / "00"


@pytest.mark.slow
def test_the_acc_uses_each_valid_times_climatology_by_day_of_year_and_hour(run_with_climatology):
    root, run = run_with_climatology
    assert main(["forecast", str(run), "--lead", "12h", "--init", "every:6h", "--no-figures"]) == 0
    directory = run / "forecast" / "test-ckpt_latest-lead12h-every6h"
    document = json.loads((directory / "scores.json").read_text())
    assert document["climatology"]["kind"] == "day_of_year_and_hour"
    assert document["climatology"]["years"] == [1979, 1980] and document["climatology"]["window_days"] == 61
    assert document["climatology"]["path"] == str(root / "stats" / "climatology.zarr")
    assert (
        (directory / "scores.csv")
        .read_text()
        .splitlines()[1]
        .endswith('"by day of year and hour, 1979-1980, 61-day window"')
    )

    channels = document["channels"]
    with h5py.File(root / "test" / "1982.h5", "r") as handle:  # 6-hourly from 1982-01-01T00
        states = handle["fields"][:, : len(channels), :16, :32].astype(np.float64)
    with xarray.open_zarr(root / "stats" / "climatology.zarr") as store:
        t2m = store["2m_temperature"].values  # (hour, dayofyear, latitude, longitude)
        z500 = store["geopotential"].sel(level=500).values
    weights = np.cos(np.deg2rad(np.linspace(90, -90, 16)))[:, None]
    for lead in (1, 2):
        initial = np.arange(len(states) - 2)  # every start that reaches 12 h
        valid = initial + lead
        hour, day = (valid % 4), valid // 4  # 6-hourly from 1 January: day of year = 1 + index // 4
        for name, climatology in (("t2m", t2m), ("z500", z500)):
            c = channels.index(name)
            reference = climatology[hour, day]  # (N, H, W): each valid time's hour and day (index 0 = day 1)
            truth, persisted = states[valid, c], states[initial, c]
            f, o = persisted - reference, truth - reference
            acc = (weights * f * o).sum((-2, -1)) / np.sqrt(
                (weights * f * f).sum((-2, -1)) * (weights * o * o).sum((-2, -1))
            )
            scores = document["scores"]
            assert scores["persistence"]["acc"][name][lead] == pytest.approx(acc.mean(), rel=1e-5, abs=1e-6)
            mse = (weights / weights.mean() * (reference - truth) ** 2).mean((-2, -1))
            assert scores["climatology"]["rmse"][name][lead] == pytest.approx(np.sqrt(mse.mean()), rel=1e-5)

    # The same store named with --climatology: the same scores, in a directory of its own.
    store = root / "stats" / "climatology.zarr"
    named = dlscale.forecast(run, lead="12h", init="every:6h", climatology=store, figures=False)
    assert named["climatology"]["chosen_by"] == "--climatology"
    assert named["scores"]["persistence"]["acc"] == document["scores"]["persistence"]["acc"]
    assert Path(named["output_dir"]).name.startswith("test-ckpt_latest-lead12h-every6h-clim-")


def test_time_mean_keeps_the_one_mean_field_in_a_directory_of_its_own(run_with_climatology):
    root, run = run_with_climatology
    assert (
        main(
            [
                "forecast",
                str(run),
                "--lead",
                "12h",
                "--init",
                "every:6h",
                "--climatology",
                "time-mean",
                "--no-figures",
            ]
        )
        == 0
    )
    directory = run / "forecast" / "test-ckpt_latest-lead12h-every6h-clim-timemean"
    document = json.loads((directory / "scores.json").read_text())
    assert document["climatology"]["kind"] == "time_mean"
    mean = np.load(root / "stats" / "time_means.npy")[0, document["channels"].index("t2m"), :16, :32]
    with h5py.File(root / "test" / "1982.h5", "r") as handle:
        truth = handle["fields"][1:-1, document["channels"].index("t2m"), :16, :32].astype(np.float64)
    weights = np.cos(np.deg2rad(np.linspace(90, -90, 16)))[:, None]
    mse = (weights / weights.mean() * (mean - truth) ** 2).mean((-2, -1))
    assert document["scores"]["climatology"]["rmse"]["t2m"][1] == pytest.approx(np.sqrt(mse.mean()), rel=1e-5)


def test_a_store_that_cannot_serve_the_forecast_is_one_line_and_nothing_is_written(
    run_with_climatology, tmp_path, capsys
):
    root, run = run_with_climatology
    other_grid = tmp_path / "other.zarr"
    with xarray.open_zarr(root / "stats" / "climatology.zarr") as store:
        store.assign_coords(latitude=store.latitude + 1.0).to_zarr(
            other_grid, **ZARR_FORMAT_2, consolidated=True
        )
    (tmp_path / "plain").mkdir()
    for path, message in (
        (other_grid, "has no latitude within"),
        (tmp_path / "plain", "is not a zarr store"),
    ):
        capsys.readouterr()
        before = sorted((run / "forecast").glob("*"))
        assert main(["forecast", str(run), "--lead", "12h", "--climatology", str(path)]) == 2
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and message in error[0] and str(path) in error[0], error
        assert sorted((run / "forecast").glob("*")) == before


def test_the_same_command_before_and_after_data_climatology_writes_two_directories(
    run_with_climatology, capsys
):
    root, run = run_with_climatology
    store = root / "stats" / "climatology.zarr"
    aside = root.parent / "climatology-aside.zarr"
    store.rename(aside)  # the data as it was before `dlscale data climatology`
    try:
        command = ["forecast", str(run), "--lead", "6h", "--init-count", "2", "--no-figures"]
        capsys.readouterr()
        assert main(command) == 0
        printed = capsys.readouterr()
        before_log = printed.out + printed.err
        assert main(["data", "climatology", "--root", str(root)]) == 0
        assert main(command) == 0
    finally:
        if store.exists():
            shutil.rmtree(aside)
        else:
            aside.rename(store)
    before = run / "forecast" / "test-ckpt_latest-lead6h-init2-clim-timemean"
    after = run / "forecast" / "test-ckpt_latest-lead6h-init2"
    kinds = [
        json.loads((directory / "scores.json").read_text())["climatology"]["kind"]
        for directory in (before, after)
    ]
    assert kinds == ["time_mean", "day_of_year_and_hour"]  # neither replaced the other
    # Before, the log said what the ACC is not, and the command that builds WeatherBench2's reference.
    warning = next(line for line in before_log.splitlines() if " WARNING " in line and "Climatology" in line)
    assert "not comparable with published ones" in warning
    assert f"`dlscale data climatology --root {root}` builds WeatherBench2's climatology" in warning
    assert "not comparable" in next(
        line for line in before_log.splitlines() if "(ACC and the climatology" in line
    )
