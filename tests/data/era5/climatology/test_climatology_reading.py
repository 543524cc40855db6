"""Reading a climatology store in WeatherBench2's layout for a forecast's grid and channels: WeatherBench2's own
(latitude south to north, dims (hour, dayofyear, level, longitude, latitude), more levels and variables than
needed) lines up by coordinates and by plain day of year and hour; another grid, a missing channel, level or
dimension, a path that is not a zarr store, an hour it lacks and a day without data are one line each, and so
are a damaged chunk (truncated, garbage, a link loop, a directory in its place...) and a codec that runs code."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from damaged_stores import UNREADABLE, damage, name_pickle_codec
from era5_stores import ZARR_FORMAT_2

from dlscale.data.era5.climatology.reading import ClimatologyStore
from dlscale.errors import DataError

xarray = pytest.importorskip("xarray", reason="the era5 extra (xarray, zarr) reads the store")

SOUTH_TO_NORTH = np.array([-60.0, -20.0, 20.0, 60.0])
LONGITUDES = np.array([0.0, 90.0, 180.0, 270.0, 315.0])
LEVELS = [50, 250, 500, 850, 1000]
CHANNELS = ("z500", "t2m", "z850")
FIELDS = (("geopotential", 500), ("2m_temperature", None), ("geopotential", 850))


def value(variable: int, hour, day, level, latitude, longitude):
    """A distinct whole number for every coordinate (exact in float32): variable, day, hour, and the store's
    index of the latitude, longitude and level."""
    lat = np.searchsorted(SOUTH_TO_NORTH, latitude)
    lon = np.searchsorted(LONGITUDES, longitude)
    lev = np.searchsorted(LEVELS, level)
    return variable * 1e6 + day * 1000 + hour // 6 * 200 + lat * 40 + lon * 8 + lev


def write_weatherbench2_store(path: Path, days_without_data: tuple[int, ...] = ()) -> Path:
    hours, days = np.array([0, 6, 12, 18]), np.arange(1, 367)
    h, d, lv, lo, la = np.meshgrid(hours, days, LEVELS, LONGITUDES, SOUTH_TO_NORTH, indexing="ij")
    geopotential = value(1, h, d, lv, la, lo).astype(np.float32)
    surface = value(2, h[:, :, 0], d[:, :, 0], 50, la[:, :, 0], lo[:, :, 0]).astype(np.float32)
    for day in days_without_data:
        geopotential[:, day - 1] = np.nan
    dims = ("hour", "dayofyear", "longitude", "latitude")
    xarray.Dataset(
        {
            "geopotential": (("hour", "dayofyear", "level", "longitude", "latitude"), geopotential),
            "2m_temperature": (dims, surface),
            "10m_wind_speed": (dims, surface),  # a variable no channel needs
        },
        coords={
            "hour": hours,
            "dayofyear": days,
            "level": LEVELS,
            "longitude": LONGITUDES,
            "latitude": SOUTH_TO_NORTH,
        },
    ).to_zarr(path, mode="w", **ZARR_FORMAT_2, consolidated=True)
    return path


@pytest.fixture(scope="module")
def weatherbench2_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_weatherbench2_store(tmp_path_factory.mktemp("wb2") / "1990-2019_6h_5x4_equiangular.zarr")


def open_store(
    path: Path, latitudes=SOUTH_TO_NORTH[::-1], longitudes=LONGITUDES, channels=CHANNELS, fields=FIELDS
):
    return ClimatologyStore(path, channels, fields, np.asarray(latitudes), np.asarray(longitudes))


def test_fields_line_up_by_coordinates_day_of_year_and_hour(weatherbench2_store):
    store = open_store(weatherbench2_store, longitudes=[-45.0, 90.0])  # -45 E is the store's 315 E
    times = np.array(
        ["2016-02-29T06", "2016-03-01T12", "2017-03-01T18", "2016-12-31T00"], dtype="datetime64[m]"
    )
    got = store.at(times)
    assert got.shape == (4, 3, 4, 2) and got.dtype == np.float32
    for row, (hour, day) in enumerate([(6, 60), (12, 61), (18, 60), (0, 366)]):
        for c, (variable, level) in enumerate([(1, 500), (2, 50), (1, 850)]):
            for i, latitude in enumerate([60.0, 20.0, -20.0, -60.0]):  # our rows: north to south
                for j, longitude in enumerate([315.0, 90.0]):
                    expected = np.float32(value(variable, hour, day, level, latitude, longitude))
                    assert got[row, c, i, j] == expected, (row, c, i, j)
    assert store.years == (1990, 2019)  # from the store's name, as WeatherBench2 names its stores


def test_latitudes_within_the_tolerance_are_the_stores(weatherbench2_store):
    store = open_store(weatherbench2_store, latitudes=SOUTH_TO_NORTH[::-1] + 1e-5)
    assert store.at(np.array(["2017-01-01T00"], dtype="datetime64[m]")).shape == (1, 3, 4, 5)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"latitudes": SOUTH_TO_NORTH[::-1] + 0.5}, "has no latitude within 0.001 degrees of 60.5"),
        ({"longitudes": LONGITUDES + 1.0}, "has no longitude within 0.001 degrees of 1"),
        (
            {"channels": ("u10",), "fields": (("10m_u_component_of_wind", None),)},
            "has no variable '10m_u_component_of_wind' for channel u10",
        ),
        (
            {"channels": ("z700",), "fields": (("geopotential", 700),)},
            "has no level 700 hPa for channel z700",
        ),
        (
            {"channels": ("z",), "fields": (("geopotential", None),)},
            "has pressure levels; channel z is a surface field",
        ),
    ],
)
def test_another_grid_or_a_missing_channel_is_one_line(weatherbench2_store, change, message):
    with pytest.raises(DataError, match=message) as raised:
        open_store(weatherbench2_store, **change)
    assert str(weatherbench2_store) in str(raised.value) and "\n" not in str(raised.value)


def test_a_path_that_is_not_a_climatology_store_is_one_line(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "empty.zarr").mkdir()
    (tmp_path / "file.zarr").write_bytes(b"\x89HDF\r\n\x1a\n")
    (tmp_path / "loop.zarr").symlink_to("loop.zarr")
    for path, message in (
        (tmp_path / "missing.zarr", "no such climatology store"),
        (tmp_path / "plain", "is not a zarr store"),
        (tmp_path / "empty.zarr", "is not a zarr store"),
        (tmp_path / "file.zarr", "is not a zarr store"),
        (tmp_path / "loop.zarr", "is a symbolic link loop"),
    ):
        with pytest.raises(DataError, match=message):
            open_store(path)
    no_hours = tmp_path / "no_hours.zarr"
    xarray.Dataset({"t": (("dayofyear", "latitude"), np.zeros((2, 4)))}).to_zarr(no_hours, **ZARR_FORMAT_2)
    with pytest.raises(DataError, match="has no 'hour' dimension"):
        open_store(no_hours)


def test_an_hour_the_store_lacks_and_a_day_without_data_are_one_line_naming_the_time(tmp_path):
    store = open_store(write_weatherbench2_store(tmp_path / "gap.zarr", days_without_data=(200,)))
    with pytest.raises(DataError, match="no hour of day for the valid time 2017-01-01T03:00"):
        store.at(np.array(["2017-01-01T03"], dtype="datetime64[m]"))
    day_200 = np.datetime64("2017-01-01T00", "m") + np.timedelta64(199, "D")
    with pytest.raises(DataError, match=f"no climatology for channel z500 at the valid time {day_200}"):
        store.at(np.array([day_200]))


def damaged_copy(store: Path, tmp_path: Path, chunk: str, kind: str) -> Path:
    copy = tmp_path / store.name
    shutil.copytree(store, copy, symlinks=True)
    damage(copy / chunk, kind)
    return copy


@pytest.mark.parametrize("kind", UNREADABLE)
def test_an_unreadable_chunk_is_one_line_naming_store_variable_and_chunk(weatherbench2_store, tmp_path, kind):
    store = open_store(damaged_copy(weatherbench2_store, tmp_path, "geopotential/0.0.0.0.0", kind))
    with pytest.raises(DataError) as raised:
        store.at(np.array(["2017-01-01T00"], dtype="datetime64[m]"))
    message = str(raised.value)
    assert message.startswith(
        f"{store.path}: variable 'geopotential' for channel z500 at the valid time 2017-01-01"
    )
    assert "geopotential/0.0.0.0.0" in message and "\n" not in message


def test_a_missing_chunk_is_named_where_the_climatology_is_missing(weatherbench2_store, tmp_path):
    store = open_store(damaged_copy(weatherbench2_store, tmp_path, "2m_temperature/0.0.0.0", "missing"))
    with pytest.raises(
        DataError, match=r"no climatology for channel t2m .*its chunk 2m_temperature/0.0.0.0 is missing"
    ):
        store.at(np.array(["2017-01-01T00"], dtype="datetime64[m]"))


def test_a_store_naming_the_pickle_codec_is_refused_without_running_it(weatherbench2_store, tmp_path):
    copy = tmp_path / weatherbench2_store.name
    shutil.copytree(weatherbench2_store, copy)
    marker = tmp_path / "code-ran"
    name_pickle_codec(copy, "2m_temperature", marker)
    with pytest.raises(DataError, match=r"variable '2m_temperature' names the codec 'pickle'.*runs any code"):
        open_store(copy).at(np.array(["2017-01-01T00"], dtype="datetime64[m]"))
    assert not marker.exists()
