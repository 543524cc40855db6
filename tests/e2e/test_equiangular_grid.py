"""A grid without pole rows (WeatherBench2's 64 x 32 equiangular one): every coordinate and score comes from
the store's own latitudes and longitudes, not from the tutorial's +90..-90 formula."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from run_configs import tiny_run_config

from dlscale.cli import main
from dlscale.config import load_run_config
from dlscale.data.era5.dataset import ERA5Dataset
from dlscale.run.training import train

xarray = pytest.importorskip("xarray", reason="the era5 extra (xarray, zarr) reads the store")
from era5_stores import random_truth, six_hourly_times, write_wb2  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
HEIGHT, WIDTH, STEPS_PER_YEAR = 32, 64, 12
# WeatherBench2's 64 x 32 equiangular grid: 32 rows at the centres of 5.625-degree bands, +-87.1875 at the
# ends, and no pole row; north to south as the imported files keep them.
LATITUDES = (87.1875 - 5.625 * np.arange(HEIGHT)).astype(np.float64)
# Columns at the centres of their cells, so they differ from the formula's (0, 5.625, ...) too.
LONGITUDES = 2.8125 + 5.625 * np.arange(WIDTH)


@pytest.fixture(scope="module")
def equiangular(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """(the imported data, a one-epoch run on it, the truth) for a WeatherBench2-style store on that grid."""
    root = tmp_path_factory.mktemp("equiangular")
    truth = random_truth(3 * STEPS_PER_YEAR, HEIGHT, WIDTH)
    times = six_hourly_times([2016, 2017, 2018], STEPS_PER_YEAR)
    store = write_wb2(root / "wb2.zarr", truth, times, LATITUDES, LONGITUDES)
    data = root / "era5"
    split = "2016:train,2017:valid,2018:test"
    assert main(["data", "import-era5", str(store), "--out", str(data), "--split", split]) == 0
    cfg = tiny_run_config(CONFIGS / "vit_era5.yaml", data, root / "runs", "data.img_size=[32,64]")
    assert train(cfg) == 0
    return data, root / "runs" / "tiny" / "00", truth


@pytest.mark.slow
def test_the_dataset_reads_the_rows_and_columns_where_the_store_has_them(equiangular, caplog):
    data, run, _ = equiangular
    cfg = load_run_config(run / "config.yaml", "tiny").data
    with caplog.at_level("INFO"):
        dataset = ERA5Dataset(cfg, "train")
    np.testing.assert_array_equal(dataset.latitudes, LATITUDES)
    np.testing.assert_array_equal(dataset.longitudes, LONGITUDES)
    assert "from the files' latitude/longitude datasets" in caplog.text
    assert "rows at 87.19 to -87.19 N, columns at 2.812 to 357.2 E" in caplog.text


@pytest.mark.slow
def test_the_forecast_file_and_its_scores_use_the_stores_coordinates(equiangular):
    data, run, truth = equiangular
    args = [
        "forecast",
        str(run),
        "--lead",
        "12h",
        "--init",
        "every:6h",
        "--write",
        "netcdf",
        "--names",
        "short",
    ]
    assert main(args) == 0
    directory = run / "forecast" / "test-ckpt_latest-lead12h-every6h-netcdf-short"
    document = json.loads((directory / "scores.json").read_text())
    with xarray.open_dataset(directory / "forecast.nc", engine="h5netcdf") as written:
        np.testing.assert_array_equal(written.latitude.values, LATITUDES)
        np.testing.assert_array_equal(written.longitude.values, LONGITUDES)
        channels = document["channels"]
        forecasts = np.stack([written[c].values for c in channels], axis=2).astype(np.float64)
        initial = (
            (written.time.values - np.datetime64("2018-01-01", "ns")) // np.timedelta64(6, "h")
        ).astype(int)

    # The truth from the store itself (the test year's states), weighted by cos(latitude) of its rows.
    test_year = np.stack([truth[c][2 * STEPS_PER_YEAR :] for c in channels], axis=1).astype(np.float64)
    weights = np.cos(np.deg2rad(LATITUDES))
    weights = (weights / weights.mean()).reshape(1, 1, -1, 1)
    # The import's climatology by day of year and hour (its train year, 2016), at each valid time: 6-hourly
    # states from 1 January, so state t is hour index t % 4 of day index t // 4.
    assert document["climatology"]["kind"] == "day_of_year_and_hour"
    with xarray.open_zarr(data / "stats" / "climatology.zarr") as store:
        by_day = np.stack(
            [
                store[variable].sel(level=level) if level else store[variable]
                for variable, level in _names(channels)
            ],
            axis=2,
        ).astype(np.float64)  # (hour, dayofyear, C, latitude, longitude)
    for lead in (1, 2):
        target = test_year[initial + lead]
        climatology = by_day[(initial + lead) % 4, (initial + lead) // 4]
        for forecaster, predicted in (("model", forecasts[:, lead - 1]), ("persistence", test_year[initial])):
            mse = ((predicted - target) ** 2 * weights).mean(axis=(-2, -1))  # (initial time, channel)
            expected_rmse = np.sqrt(mse.mean(axis=0))
            f, o = predicted - climatology, target - climatology
            acc = (weights * f * o).sum((-2, -1)) / np.sqrt(
                (weights * f**2).sum((-2, -1)) * (weights * o**2).sum((-2, -1))
            )
            scores = document["scores"][forecaster]
            got_rmse = [scores["rmse"][c][lead] for c in channels]
            got_acc = [scores["acc"][c][lead] for c in channels]
            expected_bias = ((predicted - target) * weights).mean(axis=(-2, -1)).mean(axis=0)
            got_bias = [scores["bias"][c][lead] for c in channels]
            np.testing.assert_allclose(got_rmse, expected_rmse, rtol=1e-5, err_msg=forecaster)
            # the bias is small beside each channel's offset (1000 x index): compared with that scale
            np.testing.assert_allclose(got_bias, expected_bias, rtol=1e-5, atol=1e-3, err_msg=forecaster)
            np.testing.assert_allclose(got_acc, acc.mean(axis=0), rtol=1e-5, atol=1e-7, err_msg=forecaster)


def test_the_forecast_file_has_weatherbench2s_names_and_lines_up_with_the_store_by_coordinates(equiangular):
    """Opened with xarray alone and lined up with the source store by its coordinates (valid time = initial time +
    lead, latitude, longitude, level), the written forecast gives the RMSE scores.json reports."""
    data, run, _ = equiangular
    assert (
        main(["forecast", str(run), "--lead", "12h", "--init", "every:6h", "--write", "zarr", "--no-figures"])
        == 0
    )
    directory = run / "forecast" / "test-ckpt_latest-lead12h-every6h-zarr"
    document = json.loads((directory / "scores.json").read_text())
    store = xarray.open_zarr(
        data.parent / "wb2.zarr"
    )  # south to north, (longitude, latitude), as WeatherBench2
    forecast = xarray.open_zarr(directory / "forecast.zarr")
    assert set(forecast.data_vars) == set(store.data_vars)  # the store's own variable names
    assert forecast["geopotential"].dims == ("time", "prediction_timedelta", "level", "latitude", "longitude")
    assert set(forecast.level.values) <= set(store.level.values)
    weights = np.cos(np.deg2rad(forecast.latitude))
    weights = weights / weights.mean()
    for variable, level, channel in (("geopotential", 500, "z500"), ("2m_temperature", None, "t2m")):
        for lead_index, hours in ((1, 6), (2, 12)):
            lead = np.timedelta64(hours, "h")
            predicted = forecast[variable].sel(prediction_timedelta=lead)
            truth = store[variable].sel(time=forecast.time + lead)  # valid time, by coordinate
            if level is not None:
                predicted, truth = predicted.sel(level=level), truth.sel(level=level)
            truth = truth.drop_vars("time").rename(time="initial")
            predicted = predicted.rename(time="initial").drop_vars("initial")
            # xarray lines the two up by latitude and longitude, whatever order each keeps them in
            error = (predicted.astype(np.float64) - truth.sel(latitude=forecast.latitude)) ** 2
            rmse = float(np.sqrt((error * weights).mean(("latitude", "longitude")).mean("initial")))
            expected = document["scores"]["model"]["rmse"][channel][lead_index]
            np.testing.assert_allclose(rmse, expected, rtol=1e-5, err_msg=f"{channel} at {hours} h")


def _names(channels: list[str]) -> list[tuple[str, int | None]]:
    """Each channel's variable and level in WeatherBench2's stores."""
    from dlscale.data.era5.importing.names import weatherbench2_name

    return [weatherbench2_name(channel) for channel in channels]
