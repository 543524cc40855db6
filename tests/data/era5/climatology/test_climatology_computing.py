"""The climatology computed from year files in dlscale's layout equals WeatherBench2's formula, computed here
directly with numpy: years stacked by plain day of year, day 366 filled from day 365, the axis padded by 30
days with wrap-around, the 61-day triangular window's weighted mean over (window, year) skipping missing
values, per hour of day. The data: a known seasonal and daily cycle plus noise, over years with a leap year and
a partial one, streamed in bands of one row as on a large grid, or all at once."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest

from dlscale.cli import main
from dlscale.data.era5.climatology.building import ClimatologyRequest, build_climatology

xarray = pytest.importorskip("xarray", reason="the era5 extra (xarray, zarr) reads the store")

CHANNELS = ("t2m", "z500")
LATITUDES = np.array([60.0, 0.0, -60.0])
LONGITUDES = np.array([0.0, 90.0, 180.0, 270.0])


def known_fields(times: pd.DatetimeIndex, seed: int) -> np.ndarray:
    """(T, C, H, W): a + b cos(2 pi doy / 365.25) + c cos(2 pi hour / 24) + noise, different per point."""
    rng = np.random.default_rng(seed)
    doy = times.day_of_year.to_numpy()[:, None, None, None]
    hour = times.hour.to_numpy()[:, None, None, None]
    offset = np.array([280.0, 5.5e4])[None, :, None, None] + np.arange(12).reshape(1, 1, 3, 4)
    seasonal = np.array([10.0, 800.0])[None, :, None, None] * np.cos(2 * np.pi * doy / 365.25)
    daily = np.array([3.0, 40.0])[None, :, None, None] * np.cos(2 * np.pi * hour / 24)
    noise = rng.standard_normal((len(times), 2, 3, 4)) * np.array([1.0, 50.0])[None, :, None, None]
    return (offset + seasonal + daily + noise).astype(np.float32)


def write_year(directory: Path, times: pd.DatetimeIndex, fields: np.ndarray) -> None:
    """One year file as ``dlscale data import-era5`` writes it."""
    directory.mkdir(parents=True, exist_ok=True)
    with h5py.File(directory / f"{times[0].year}.h5", "w") as handle:
        dataset = handle.create_dataset("fields", data=fields)
        dataset.attrs["channels"] = list(CHANNELS)
        handle.create_dataset("time", data=times.to_numpy().astype("datetime64[s]").astype(np.int64))
        handle.create_dataset("latitude", data=LATITUDES)
        handle.create_dataset("longitude", data=LONGITUDES)


def weatherbench2_climatology(times: pd.DatetimeIndex, fields: np.ndarray, hours: list[int]) -> np.ndarray:
    """(hours, 366, C, H, W): WeatherBench2's compute_hourly_stat, step by step, on the states ``fields``."""
    years = sorted(set(times.year))
    weights = np.concatenate([np.linspace(0, 1, 31), np.linspace(1, 0, 31)[1:]])
    weights = weights / weights.mean()
    result = np.empty((len(hours), 366, *fields.shape[1:]))
    for h, hour in enumerate(hours):
        stacked = np.full((len(years), 366, *fields.shape[1:]), np.nan)  # (year, dayofyear, ...)
        for t in np.flatnonzero(times.hour == hour):
            stacked[years.index(times[t].year), times[t].day_of_year - 1] = fields[t]
        stacked[:, 365] = np.where(np.isnan(stacked[:, 365]), stacked[:, 364], stacked[:, 365])
        padded = np.concatenate([stacked[:, -30:], stacked, stacked[:, :30]], axis=1)
        for day in range(366):
            window = padded[:, day : day + 61]  # (year, 61, ...), the window centred on `day`
            w = np.broadcast_to(weights.reshape(1, 61, 1, 1, 1), window.shape)
            present = ~np.isnan(window)
            total = np.where(present, w, 0.0).sum(axis=(0, 1))
            with np.errstate(invalid="ignore"):
                result[h, day] = np.where(present, w * np.nan_to_num(window), 0.0).sum(axis=(0, 1)) / total
    return result


def stored(path: Path, hours: list[int]) -> np.ndarray:
    """(hours, 366, C, H, W) from the store by WeatherBench2's names, rows and columns as the files'."""
    with xarray.open_zarr(path) as store:
        assert store.hour.values.tolist() == hours
        assert store.dayofyear.values.tolist() == list(range(1, 367))
        np.testing.assert_array_equal(store.latitude.values, LATITUDES)
        t2m = store["2m_temperature"].transpose("hour", "dayofyear", "latitude", "longitude").values
        z500 = store["geopotential"].sel(level=500).transpose("hour", "dayofyear", "latitude", "longitude")
        return np.stack([t2m, z500.values], axis=2)


@pytest.fixture(scope="module")
def years_with_a_leap_year(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, pd.DatetimeIndex, np.ndarray]:
    """2015, 2016 (leap; 11 January missing at one point), 2017 whole and 2018 until April, 6-hourly, in
    train/."""
    root = tmp_path_factory.mktemp("cycle")
    spans = [
        ("2015", "2015-12-31T18"),
        ("2016", "2016-12-31T18"),
        ("2017", "2017-12-31T18"),
        ("2018", "2018-04-30"),
    ]
    all_times, all_fields = [], []
    for seed, (first, last) in enumerate(spans):
        times = pd.date_range(first, last, freq="6h")
        fields = known_fields(times, seed)
        if first == "2016":
            fields[40:44, :, 1, 1] = np.nan  # a day missing at one point (an --allow-nan import): skipped
        write_year(root / "train", times, fields)
        all_times.append(times)
        all_fields.append(fields)
    return (
        root,
        pd.DatetimeIndex(np.concatenate([t.to_numpy() for t in all_times])),
        np.concatenate(all_fields),
    )


def test_the_climatology_is_weatherbench2s_formula_streamed_in_bands_of_one_row(years_with_a_leap_year):
    root, times, fields = years_with_a_leap_year
    result = build_climatology(ClimatologyRequest(root, memory_bytes=1), report=lambda line: None)
    assert result.years == (2015, 2018) and result.hours == [0, 6, 12, 18]
    assert result.days_without_data == []
    expected = weatherbench2_climatology(times, fields, [0, 6, 12, 18])
    np.testing.assert_allclose(stored(result.path, [0, 6, 12, 18]), expected, rtol=2e-7)
    # The cycle is there: January is colder than July at every hour (b cos(2 pi doy / 365.25), b = 10 K).
    january, july = expected[:, 14, 0], expected[:, 195, 0]
    assert (january - july > 15).all()


def test_chosen_years_only_and_a_partial_year_leaves_the_days_it_misses_nan(years_with_a_leap_year, tmp_path):
    root, times, fields = years_with_a_leap_year
    # 2018 alone: January to April, so from about June to October no window reaches a state.
    assert main(["data", "climatology", "--root", str(root), "--years", "2018"]) == 0
    chosen = times.year == 2018
    expected = weatherbench2_climatology(times[chosen], fields[chosen], [0, 6, 12, 18])
    got = stored(root / "stats" / "climatology.zarr", [0, 6, 12, 18])
    np.testing.assert_allclose(got, expected, rtol=2e-7, equal_nan=True)
    assert np.isnan(got[:, 200]).all() and np.isfinite(got[:, 100]).all()
    with xarray.open_zarr(root / "stats" / "climatology.zarr") as store:
        assert store.attrs["years"] == [2018, 2018] and store.attrs["window_days"] == 61
        assert 200 + 1 in store.attrs["days_without_data"] and 100 + 1 not in store.attrs["days_without_data"]
