"""An ensemble forecast's file (src/dlscale/report/forecast_files.py) in WeatherBench2's ensemble layout, a
``number`` dimension after ``time``, and its reading for ``dlscale score``
(src/dlscale/data/era5/forecast_reading.py): every member, in increasing number, through netCDF and zarr."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from dlscale.data.era5.forecast_reading import ForecastFile
from dlscale.data.era5.importing.names import weatherbench2_name
from dlscale.data.trajectories import ForecastStart
from dlscale.errors import DataError
from dlscale.report.forecast_files import FORMATS, forecast_dataset, write_forecast_file

xarray = pytest.importorskip("xarray", reason="the era5 extra writes forecast files")

CHANNELS = ("t2m", "z850", "z500")
N, M, STEPS, H, W = 2, 3, 2, 4, 5
STARTS = [ForecastStart(0, s, np.datetime64("2018-01-01T00") + np.timedelta64(6 * s, "h")) for s in range(N)]


def trajectories():
    return SimpleNamespace(
        channel_names=CHANNELS,
        units=tuple(f"unit of {c}" for c in CHANNELS),
        long_names=tuple(f"long name of {c}" for c in CHANNELS),
        step_hours=6.0,
        latitudes=np.linspace(80.0, -80.0, H),
        longitudes=np.arange(W) * 72.0,
        weatherbench2_names=tuple(weatherbench2_name(c) for c in CHANNELS),
    )


def ensemble():
    """(N, M, STEPS, C, H, W): every value distinct, so that a member, lead or channel read from the wrong place
    shows."""
    return np.random.default_rng(0).standard_normal((N, M, STEPS, len(CHANNELS), H, W)).astype(np.float32)


@pytest.mark.parametrize("names", ["wb2", "short"])
def test_an_ensemble_gets_weatherbench2s_number_dimension_after_time(names):
    values = ensemble()
    dataset = forecast_dataset(values, STARTS, trajectories(), {}, names=names)
    assert list(dataset["number"].values) == list(range(M))
    assert "control" in dataset["number"].attrs["description"]
    surface = "2m_temperature" if names == "wb2" else "t2m"
    assert dataset[surface].dims == ("time", "number", "prediction_timedelta", "latitude", "longitude")
    np.testing.assert_array_equal(dataset[surface].values, values[:, :, :, 0])
    if names == "wb2":  # the levels of a field together, before the grid, as WeatherBench2's IFS ENS store
        geopotential = dataset["geopotential"]
        assert geopotential.dims == (
            "time",
            "number",
            "prediction_timedelta",
            "level",
            "latitude",
            "longitude",
        )
        np.testing.assert_array_equal(geopotential.sel(level=850).values, values[:, :, :, 1])
        np.testing.assert_array_equal(geopotential.sel(level=500).values, values[:, :, :, 2])
    else:
        np.testing.assert_array_equal(dataset["z500"].isel(number=2).values, values[:, 2, :, 2])


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_member_reads_back_from_netcdf_and_zarr(tmp_path, fmt):
    pytest.importorskip("h5netcdf" if fmt == "netcdf" else "zarr")
    values = ensemble()
    path = tmp_path / FORMATS[fmt]
    write_forecast_file(forecast_dataset(values, STARTS, trajectories(), {}), path, fmt)
    file = ForecastFile(path)
    try:
        assert list(file.members) == list(range(M)) and file.control.startswith("number 0, the control")
        rows, columns = np.arange(H)[::-1], np.arange(W)  # rows in another order than the file's
        for lead in range(STEPS):
            got = file.read([1, 0], lead, ["z500", "t2m"], rows, columns)
            assert got.shape == (2, M, 2, H, W)
            expected = values[[1, 0], :, lead][:, :, [2, 0]][..., rows, :]
            np.testing.assert_array_equal(got, expected)
    finally:
        file.close()


def members_file(tmp_path, numbers, **dims_of):
    """A zarr store of two surface fields whose members carry ``numbers`` (in the file's order); member k's
    values are all ``numbers[k]``; ``dims_of`` gives a variable other dimensions."""
    times = np.array(["2018-01-01T00", "2018-01-01T06"], dtype="datetime64[ns]")
    leads = np.array([6, 12], dtype="timedelta64[h]").astype("timedelta64[ns]")
    dims = ("time", "number", "prediction_timedelta", "latitude", "longitude")
    shape = (len(times), len(numbers), len(leads), H, W)
    member_values = np.asarray(numbers, np.float32).reshape(1, -1, 1, 1, 1) * np.ones(shape, np.float32)
    variables = {}
    for name in ("2m_temperature", "10m_u_component_of_wind"):
        variable_dims = dims_of.get(name, dims)
        index = tuple(slice(None) if dim in variable_dims else 0 for dim in dims)
        variables[name] = (variable_dims, member_values[index])
    coords = {
        "time": times,
        "number": np.asarray(numbers),
        "prediction_timedelta": leads,
        "latitude": np.linspace(80.0, -80.0, H),
        "longitude": np.arange(W) * 72.0,
    }
    path = tmp_path / "members.zarr"
    write_forecast_file(xarray.Dataset(variables, coords=coords), path, "zarr")
    return path


def test_members_are_read_in_increasing_number_and_a_file_without_number_0_says_so(tmp_path):
    pytest.importorskip("zarr")
    file = ForecastFile(members_file(tmp_path, [3, 1, 2]))  # as WeatherBench2's IFS ENS: no control, from 1
    try:
        assert list(file.members) == [1, 2, 3]
        got = file.read([0], 1, ["t2m"], np.arange(H), np.arange(W))
        assert [float(got[0, m, 0, 0, 0]) for m in range(3)] == [1.0, 2.0, 3.0]
        assert "number 1" in file.control and "no number 0" in file.control
    finally:
        file.close()


@pytest.mark.parametrize(
    ("numbers", "dims_of", "message"),
    [
        ([0, 1], {"10m_u_component_of_wind": ("time", "prediction_timedelta", "latitude", "longitude")},
         r"members.zarr: its variable '10m_u_component_of_wind' has no 'number' dimension, while the file's "
         r"other fields are an ensemble of 2 members"),
        ([0, 1, 1], {}, r"members.zarr: its 'number' coordinate names member 1 twice"),
        ([0.0, 0.5], {}, r"members.zarr: its members \('number'\) are numbered by float64 values"),
    ],
)  # fmt: skip
def test_a_malformed_ensemble_is_one_line_naming_the_file(tmp_path, numbers, dims_of, message):
    pytest.importorskip("zarr")
    with pytest.raises(DataError, match=message) as raised:
        ForecastFile(members_file(tmp_path, numbers, **dims_of))
    assert "\n" not in str(raised.value)
