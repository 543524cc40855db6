"""The forecasts themselves as a file xarray opens: netCDF (h5netcdf engine) or zarr.

Layout (WeatherBench2's forecast convention): dimensions ``time`` (the initial time), ``prediction_timedelta``
(the lead), ``latitude`` (north to south, as the data) and ``longitude``; one float32 variable per channel
(``z500``, ``t2m``, ...) with ``units`` and ``long_name``. The valid time of a value is ``time +
prediction_timedelta``, so ``forecast.sel(time=t, prediction_timedelta=lead)`` lines up with the truth at
``t + lead``. Data without dates gets ``time`` as the position of each initial time in the split.

xarray is imported here only (the ``era5`` extra): a forecast that writes no file needs it not.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dlscale.data.trajectories import ForecastStart, Trajectories
from dlscale.errors import ConfigError

FORMATS = {"netcdf": "forecast.nc", "zarr": "forecast.zarr"}


def require_xarray(what: str) -> Any:
    """The xarray module, or one line saying how to install it."""
    try:
        import xarray
    except ImportError:
        raise ConfigError(
            f"{what} needs xarray, which is not installed: pip install 'dlscale[era5]' (xarray, h5netcdf, zarr)"
        ) from None
    return xarray


def check_writable_format(fmt: str) -> None:
    """Refuse, before the rollout, a format dlscale cannot write here (unknown, or its library missing)."""
    if fmt not in FORMATS:
        raise ConfigError(f"--write {fmt!r}: expected one of {', '.join(FORMATS)}")
    require_xarray(f"--write {fmt}")
    module = "h5netcdf" if fmt == "netcdf" else "zarr"
    try:
        __import__(module)
    except ImportError:
        raise ConfigError(
            f"--write {fmt} needs {module}, which is not installed: pip install 'dlscale[era5]'"
        ) from None


def forecast_dataset(
    forecasts: np.ndarray,
    starts: Sequence[ForecastStart],
    trajectories: Trajectories,
    attributes: dict[str, Any],
) -> Any:
    """An xarray Dataset of ``forecasts`` (N initial times, leads 1..K, C, H, W) in the layout above."""
    xarray = require_xarray("writing the forecast")
    steps = forecasts.shape[1]
    minutes = np.round(np.arange(1, steps + 1) * trajectories.step_hours * 60).astype(np.int64)
    leads = minutes.astype("timedelta64[m]").astype("timedelta64[ns]")
    if all(start.time is not None for start in starts):
        times = np.asarray([start.time for start in starts]).astype("datetime64[ns]")
    else:
        times = np.arange(len(starts))
    coords = {
        "time": ("time", times, {"long_name": "initial time"}),
        "prediction_timedelta": ("prediction_timedelta", leads, {"long_name": "lead time"}),
        "latitude": ("latitude", np.asarray(trajectories.latitudes, np.float64), {"units": "degrees_north"}),
        "longitude": (
            "longitude",
            np.asarray(trajectories.longitudes, np.float64),
            {"units": "degrees_east"},
        ),
    }
    dims = ("time", "prediction_timedelta", "latitude", "longitude")
    variables = {
        name: (dims, forecasts[:, :, c], {"units": unit, "long_name": long_name})
        for c, (name, unit, long_name) in enumerate(
            zip(trajectories.channel_names, trajectories.units, trajectories.long_names, strict=True)
        )
    }
    return xarray.Dataset(variables, coords=coords, attrs=_netcdf_attributes(attributes))


def _netcdf_attributes(attributes: dict[str, Any]) -> dict[str, Any]:
    """Global attributes netCDF can hold (strings and numbers; None left out)."""
    return {
        key: value if isinstance(value, (int, float, str)) else str(value)
        for key, value in attributes.items()
        if value is not None
    }


def write_forecast_file(dataset: Any, path: Path, fmt: str) -> None:
    """Write ``dataset`` to ``path`` as ``fmt`` (netcdf or zarr)."""
    if fmt == "netcdf":
        dataset.to_netcdf(path, engine="h5netcdf")
        return
    with warnings.catch_warnings():
        # zarr 3 warns that consolidated metadata (one file listing every array, which xarray writes so that
        # opening a store is one read) is not yet in the zarr 3 specification; zarr and xarray read it.
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        dataset.to_zarr(path, mode="w")
