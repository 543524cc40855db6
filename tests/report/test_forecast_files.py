"""The forecast file's layout (src/dlscale/report/forecast_files.py): WeatherBench2's variable names with a
``level`` dimension by default, the channels' own names with ``--names short``."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from dlscale.data.era5.importing.names import weatherbench2_name
from dlscale.data.trajectories import ForecastStart
from dlscale.errors import DataError
from dlscale.report.forecast_files import forecast_dataset

pytest.importorskip("xarray", reason="the era5 extra writes forecast files")

CHANNELS = ("u10", "t2m", "z850", "z500", "t850", "r500", "my_field")
N, STEPS, H, W = 2, 3, 4, 5


def trajectories(channels=CHANNELS, named=True):
    fields = SimpleNamespace(
        channel_names=channels,
        units=tuple(f"unit of {c}" for c in channels),
        long_names=tuple(f"long name of {c}" for c in channels),
        step_hours=6.0,
        latitudes=np.linspace(80.0, -80.0, H),
        longitudes=np.arange(W) * 72.0,
    )
    if named:
        fields.weatherbench2_names = tuple(weatherbench2_name(c) for c in channels)
    return fields


def forecasts(channels=CHANNELS):
    # each channel's values distinct: channel c holds 100 c + a pattern
    pattern = np.arange(N * STEPS * H * W, dtype=np.float32).reshape(N, STEPS, 1, H, W) / 1000
    return (pattern + 100.0 * np.arange(len(channels), dtype=np.float32).reshape(1, 1, -1, 1, 1)).astype(
        np.float32
    )


STARTS = [ForecastStart(0, s, np.datetime64("2018-01-01T00") + np.timedelta64(6 * s, "h")) for s in range(N)]


@pytest.mark.parametrize(
    ("channel", "field"),
    [("z500", ("geopotential", 500)), ("t2m", ("2m_temperature", None)), ("u10", ("10m_u_component_of_wind", None)),
     ("r850", ("relative_humidity", 850)), ("tcwv", ("total_column_water_vapour", None)), ("my_field", None),
     ("x500", None)],
)  # fmt: skip
def test_a_channel_has_weatherbench2s_variable_and_level(channel, field):
    assert weatherbench2_name(channel) == field


def test_wb2_names_group_the_levels_of_a_field_into_one_variable():
    values = forecasts()
    dataset = forecast_dataset(values, STARTS, trajectories(), {"workload": "era5_vit"})
    assert set(dataset.data_vars) == {
        "10m_u_component_of_wind", "2m_temperature", "geopotential", "temperature", "relative_humidity", "my_field",
    }  # fmt: skip
    assert list(dataset.level.values) == [500, 850]  # ascending, as WeatherBench2's stores
    assert dataset.level.attrs["units"] == "hPa"
    geopotential = dataset["geopotential"]
    assert geopotential.dims == ("time", "prediction_timedelta", "level", "latitude", "longitude")
    index = {c: i for i, c in enumerate(CHANNELS)}
    np.testing.assert_array_equal(geopotential.sel(level=500).values, values[:, :, index["z500"]])
    np.testing.assert_array_equal(geopotential.sel(level=850).values, values[:, :, index["z850"]])
    np.testing.assert_array_equal(dataset["temperature"].sel(level=850).values, values[:, :, index["t850"]])
    # a field the data lacks at a level of the coordinate is missing there, not zero or another level's values
    assert np.isnan(dataset["temperature"].sel(level=500).values).all()
    assert np.isnan(dataset["relative_humidity"].sel(level=850).values).all()
    np.testing.assert_array_equal(dataset["2m_temperature"].values, values[:, :, index["t2m"]])
    assert dataset["2m_temperature"].dims == ("time", "prediction_timedelta", "latitude", "longitude")
    np.testing.assert_array_equal(dataset["my_field"].values, values[:, :, index["my_field"]])  # its own name
    assert geopotential.attrs["units"] == "unit of z850" and geopotential.attrs["channels"] == "z500,z850"
    assert dataset["2m_temperature"].attrs["units"] == "unit of t2m"
    assert list(dataset.prediction_timedelta.values) == [np.timedelta64(h, "h") for h in (6, 12, 18)]


def test_short_names_keep_one_variable_per_channel_and_no_level():
    values = forecasts()
    for dataset in (
        forecast_dataset(values, STARTS, trajectories(), {}, names="short"),
        forecast_dataset(values, STARTS, trajectories(named=False), {}),  # data WeatherBench2 cannot name
    ):
        assert list(dataset.data_vars) == list(CHANNELS) and "level" not in dataset.coords
        for c, channel in enumerate(CHANNELS):
            np.testing.assert_array_equal(dataset[channel].values, values[:, :, c])


@pytest.mark.parametrize(
    ("channels", "clash"),
    [(("u10", "10m_u_component_of_wind"), "u10 and 10m_u_component_of_wind"),
     (("z500", "geopotential"), "z500 and geopotential")],
)  # fmt: skip
def test_two_channels_that_become_one_variable_are_refused_with_the_way_out(channels, clash):
    with pytest.raises(DataError, match=rf"channels {clash} both become WeatherBench2's .*--names short"):
        forecast_dataset(forecasts(channels), STARTS, trajectories(channels), {})


@pytest.mark.parametrize(("names", "members"), [("wb2", 1), ("short", 3)])
def test_the_size_said_before_the_write_is_the_data_the_file_holds(names, members, tmp_path):
    from dlscale.report.forecast_files import write_forecast_file, written_bytes, written_size_line

    values = forecasts()
    if members > 1:  # an ensemble: (N, M, K, C, H, W)
        values = np.stack([values + member for member in range(members)], axis=1)
    dataset = forecast_dataset(values, STARTS, trajectories(), {"workload": "era5_vit"}, names)
    data_bytes = sum(variable.nbytes for variable in dataset.data_vars.values())
    assert written_bytes(trajectories(), names, N, members, STEPS) == data_bytes
    # netCDF is written uncompressed: the file is that, and a few kB of coordinates and metadata
    path = tmp_path / "forecast.nc"
    write_forecast_file(dataset, path, "netcdf")
    assert data_bytes <= path.stat().st_size <= data_bytes + 64_000
    line = written_size_line("netcdf", names, N, members, STEPS, trajectories())
    fields = (
        9 if names == "wb2" else len(CHANNELS)
    )  # wb2: geopotential, temperature, r at 2 levels, 3 surface
    ensemble = f" x {members} members" if members > 1 else ""
    assert line.startswith(f"--write netcdf: forecast.nc will take {data_bytes / 1e3:.3g} kB ")
    assert f"({N} initial times{ensemble} x {STEPS} leads x {fields} fields of {H} x {W} in float32" in line
    assert "before zarr's compression" in written_size_line("zarr", names, N, members, STEPS, trajectories())
