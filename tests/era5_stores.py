"""Tiny ERA5 sources in the exact schemas users download, written from known fields, for the importer's tests.

``truth`` maps each of the tutorial's 20 channels to an array (T, H, W) at 6-hourly steps, latitude north to
south. The writers put those values where each source keeps them:

- ARCO-ERA5 (gs://gcp-public-data-arco-era5/ar/...zarr): long names, ``level`` dimension (int64 hPa, more
  levels than needed), hourly ``time`` (the hours between the 6-hourly steps hold other values, so a wrong
  time selection shows), latitude 90 -> -90, dims (time, [level], latitude, longitude), zarr format 2;
- WeatherBench2 (gs://weatherbench2/datasets/era5/...zarr): long names, 6-hourly, latitude ascending (south
  to north), dims (time, [level], longitude, latitude), zarr format 2;
- new CDS netCDF: short names, ``valid_time``, ``pressure_level`` (float64), single-level and pressure-level
  fields in separate files, one pair per year, plus CDS's ``number`` and ``expver`` coordinates;
- old CDS netCDF: short names, ``time``, ``level`` (int32 millibars, increasing), one file.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from dlscale.data.era5.importing.names import PRESSURE_LEVEL_VARIABLES, SURFACE_VARIABLES, channel_request
from dlscale.data.era5.layout import ERA5_CHANNELS

LEVELS = (50, 250, 500, 850, 1000)  # more than the channels need, in ARCO's increasing order
LONG_ATTRS = {  # a few of ARCO-ERA5's variable attributes, as the stores carry them
    "10m_u_component_of_wind": {
        "long_name": "10 metre U wind component",
        "short_name": "u10",
        "units": "m s**-1",
    },
    "geopotential": {
        "long_name": "Geopotential",
        "short_name": "z",
        "standard_name": "geopotential",
        "units": "m**2 s**-2",
    },
}


def six_hourly_times(years: list[int], steps_per_year: int) -> np.ndarray:
    return np.concatenate(
        [pd.date_range(f"{year}-01-01", periods=steps_per_year, freq="6h").values for year in years]
    )


def random_truth(steps: int, height: int, width: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Fields with a large offset per channel (as ERA5's: 1e5 Pa, 250 K) and a distinct pattern each."""
    rng = np.random.default_rng(seed)
    return {
        name: (1000.0 * index + rng.standard_normal((steps, height, width))).astype(np.float32)
        for index, name in enumerate(ERA5_CHANNELS)
    }


def grid(height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Latitudes north to south (poles included) and longitudes from 0 east, as ERA5's grids."""
    return np.linspace(90, -90, height), np.arange(width) * (360.0 / width)


def _fields_by_variable(truth: dict[str, np.ndarray], names: str) -> dict[str, tuple[np.ndarray, bool]]:
    """variable name (``long`` or ``short`` scheme) -> (T, [level,] H, W) values, has levels."""
    steps, height, width = next(iter(truth.values())).shape
    rng = np.random.default_rng(1)
    column = 0 if names == "long" else 1
    result: dict[str, tuple[np.ndarray, bool]] = {}
    for candidates in PRESSURE_LEVEL_VARIABLES.values():
        levels = [channel for channel in truth if channel_request(channel).candidates == candidates]
        if not levels:
            continue
        values = rng.standard_normal((steps, len(LEVELS), height, width)).astype(np.float32) - 5000
        for channel in levels:
            values[:, LEVELS.index(channel_request(channel).level_hpa)] = truth[channel]
        result[candidates[column]] = (values, True)
    for channel, candidates in SURFACE_VARIABLES.items():
        if channel in truth:
            result[candidates[column]] = (truth[channel], False)
    return result


# ``to_zarr`` keywords for zarr format 2, as ARCO-ERA5 and WeatherBench2 are, where this xarray can say so
# (older ones, the floor 2024.1 among them, have no ``zarr_format`` and write format 2 with zarr 2 anyway).
ZARR_FORMAT_2 = (
    {"zarr_format": 2} if "zarr_format" in inspect.signature(xr.Dataset.to_zarr).parameters else {}
)


def _to_zarr(dataset: xr.Dataset, path: Path) -> Path:
    """Zarr format 2 (:data:`ZARR_FORMAT_2`), a chunk per time step."""
    keywords = ZARR_FORMAT_2
    for variable in dataset.data_vars.values():  # one chunk per time step, as both stores are chunked
        variable.encoding["chunks"] = (1, *variable.shape[1:])
    dataset.to_zarr(path, mode="w", consolidated=True, **keywords)
    return path


def write_arco(path: Path, truth: dict[str, np.ndarray], times: np.ndarray, hourly: bool = True) -> Path:
    steps, height, width = next(iter(truth.values())).shape
    latitude, longitude = grid(height, width)
    hours = 6 if hourly else 1
    all_times = (
        np.concatenate([time + np.arange(hours) * np.timedelta64(1, "h") for time in times])
        if hourly
        else times
    )
    data_vars = {}
    for name, (values, has_levels) in _fields_by_variable(truth, "long").items():
        # hour h of step t: the truth at h = 0, the truth + 100 * h between (never a valid value)
        expanded = np.repeat(values, hours, axis=0) + np.tile(np.arange(hours) * 100.0, steps).reshape(
            (-1,) + (1,) * (values.ndim - 1)
        ).astype(np.float32)
        dims = ("time", "level", "latitude", "longitude") if has_levels else ("time", "latitude", "longitude")
        data_vars[name] = (dims, expanded, LONG_ATTRS.get(name, {}))
    dataset = xr.Dataset(
        data_vars,
        coords={
            "time": all_times,
            "level": np.array(LEVELS, dtype=np.int64),
            "latitude": ("latitude", latitude.astype(np.float32), {"units": "degrees_north"}),
            "longitude": ("longitude", longitude.astype(np.float32), {"units": "degrees_east"}),
        },
    )
    dataset.time.encoding.update({"units": "hours since 1900-01-01", "dtype": "int64"})
    return _to_zarr(dataset, path)


def write_wb2(
    path: Path,
    truth: dict[str, np.ndarray],
    times: np.ndarray,
    latitude: np.ndarray | None = None,
    longitude: np.ndarray | None = None,
) -> Path:
    """``latitude``, ``longitude``: the rows of ``truth``, north to south, and its columns (default: ERA5's grid,
    poles included, from 0 east); the store keeps the rows south to north, as WeatherBench2's."""
    steps, height, width = next(iter(truth.values())).shape
    era5_latitude, era5_longitude = grid(height, width)
    latitude = era5_latitude if latitude is None else latitude
    longitude = era5_longitude if longitude is None else longitude
    data_vars = {}
    for name, (values, has_levels) in _fields_by_variable(truth, "long").items():
        south_to_north = values[..., ::-1, :]
        lon_lat = np.swapaxes(south_to_north, -1, -2)  # WeatherBench2 keeps (longitude, latitude)
        dims = ("time", "level", "longitude", "latitude") if has_levels else ("time", "longitude", "latitude")
        data_vars[name] = (dims, np.ascontiguousarray(lon_lat))
    dataset = xr.Dataset(
        data_vars,
        coords={
            "time": times,
            "level": np.array(LEVELS, dtype=np.int64),
            "latitude": latitude[::-1].copy(),
            "longitude": longitude,
        },
    )
    return _to_zarr(dataset, path)


def write_cds(directory: Path, truth: dict[str, np.ndarray], times: np.ndarray, new: bool = True) -> Path:
    """New CDS: a single-level and a pressure-level file per year; old CDS: one file with everything."""
    directory.mkdir(parents=True, exist_ok=True)
    steps, height, width = next(iter(truth.values())).shape
    latitude, longitude = grid(height, width)
    time_name, level_name = ("valid_time", "pressure_level") if new else ("time", "level")
    # the new CDS lists 1000 hPa first; the old files here keep them increasing (both orders get read)
    levels = np.array(LEVELS[::-1], dtype=np.float64) if new else np.array(LEVELS, dtype=np.int32)
    fields = _fields_by_variable(truth, "short")
    kinds = {
        "single": {name: value for name, value in fields.items() if not value[1]},
        "pressure": {name: value for name, value in fields.items() if value[1]},
    }
    years = times.astype("datetime64[Y]").astype(int) + 1970
    groups = (
        [(year, years == year) for year in np.unique(years)] if new else [("all", np.ones(len(times), bool))]
    )
    for label, rows in groups:
        merged = {}
        for kind, variables in kinds.items():
            data_vars = {}
            for name, (values, has_levels) in variables.items():
                chosen = values[rows]
                if has_levels:
                    chosen = chosen[:, ::-1] if new else chosen
                    data_vars[name] = ((time_name, level_name, "latitude", "longitude"), chosen)
                else:
                    data_vars[name] = ((time_name, "latitude", "longitude"), chosen)
            coords = {time_name: times[rows], "latitude": latitude, "longitude": longitude}
            if kind == "pressure":
                coords[level_name] = levels
            dataset = xr.Dataset(data_vars, coords=coords)
            if new:
                dataset = dataset.assign_coords(number=0, expver=(time_name, np.array(["0001"] * rows.sum())))
                dataset.to_netcdf(directory / f"era5_{kind}_{label}.nc", engine="h5netcdf")
            else:
                merged.update(dataset.data_vars)
                merged_coords = {**coords, level_name: levels}
        if not new:
            xr.Dataset(merged, coords=merged_coords).to_netcdf(directory / "era5_all.nc", engine="h5netcdf")
    return directory
