"""The forecasts themselves as a file xarray opens: netCDF (h5netcdf engine) or zarr.

Layout (WeatherBench2's forecast convention): dimensions ``time`` (the initial time), ``prediction_timedelta``
(the lead), ``latitude`` (north to south, as the data) and ``longitude``; float32 variables with ``units`` and
``long_name``. The valid time of a value is ``time + prediction_timedelta``, so ``forecast.sel(time=t,
prediction_timedelta=lead)`` lines up with the truth at ``t + lead``. Data without dates gets ``time`` as the
position of each initial time in the split.

An ensemble (``dlscale forecast --members M``) has WeatherBench2's ensemble dimension ``number`` (its evaluation's
``--ensemble_dim`` default) between ``time`` and ``prediction_timedelta``, as its IFS ENS store orders them:
``(time, number, prediction_timedelta, [level,] latitude, longitude)``. ``number`` runs 0 .. M - 1 and member 0
is the control, the forecast from the unperturbed state (ECMWF's numbering: its control is number 0, and the IFS
ENS store of WeatherBench2, which holds only the perturbed members, numbers them from 1).

Variable names (``--names``):

* ``wb2`` (the default): as WeatherBench2's and ARCO-ERA5's stores name them, where the data says how
  (``Trajectories.weatherbench2_names``): ``2m_temperature``, ``10m_u_component_of_wind``, and the
  pressure-level fields as one variable each with a ``level`` dimension in hPa (``geopotential`` at levels 50,
  500, 850, 1000 for the tutorial's z50, z500, z850, z1000), levels in ascending order. A field the data lacks at
  a level of that coordinate (temperature at 50 hPa when only t500 and t850 are channels) is NaN there. A
  channel WeatherBench2 has no name for keeps its own. So WeatherBench2's evaluation code, earth2studio and a
  plain ``xarray`` ``sel(level=500)`` read the file as they read the field's own forecasts.
* ``short``: one variable per channel, named as the channel (``z500``, ``t2m``), without ``level``.

xarray is imported here only (the ``era5`` extra): a forecast that writes no file needs it not.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dlscale.data.era5.optional_modules import require_era5_module
from dlscale.data.era5.zarr_writes import zarr_writes_finished_on_failure
from dlscale.data.trajectories import ForecastStart, Trajectories
from dlscale.errors import ConfigError, DataError

FORMATS = {"netcdf": "forecast.nc", "zarr": "forecast.zarr"}
NAMES = (
    "wb2",
    "short",
)  # --names: WeatherBench2's variables (default), or one per channel named as the channel
MEMBER = "number"  # WeatherBench2's ensemble dimension
MEMBER_ATTRIBUTES = {
    "long_name": "ensemble member",
    "description": "member 0 is the control: the forecast from the unperturbed initial state, dlscale forecast's "
    "deterministic forecast; the others start from perturbed states or run with the model's dropout on",
}


def require_xarray(what: str) -> Any:
    """The xarray module, or one line saying how to install it."""
    return require_era5_module("xarray", what)


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
    names: str = "wb2",
) -> Any:
    """An xarray Dataset of ``forecasts`` (N initial times, leads 1..K, C, H, W), or of an ensemble's (N, M
    members, leads 1..K, C, H, W), in the layout above, its variables named as ``names`` says (``wb2`` or
    ``short``)."""
    xarray = require_xarray("writing the forecast")
    if forecasts.ndim not in (5, 6):
        raise ValueError(
            f"forecasts of shape {forecasts.shape}: expected (N, K, C, H, W), or (N, M, K, C, H, W) for an ensemble"
        )
    steps = forecasts.shape[-4]
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
    dims: tuple[str, ...] = ("time", "prediction_timedelta", "latitude", "longitude")
    if forecasts.ndim == 6:
        dims = ("time", MEMBER, *dims[1:])
        coords[MEMBER] = (MEMBER, np.arange(forecasts.shape[1], dtype=np.int64), MEMBER_ATTRIBUTES)
    field_names = getattr(trajectories, "weatherbench2_names", None) if names == "wb2" else None
    if field_names is None:
        variables = {
            name: (dims, forecasts[..., c, :, :], {"units": unit, "long_name": long_name})
            for c, (name, unit, long_name) in enumerate(
                zip(trajectories.channel_names, trajectories.units, trajectories.long_names, strict=True)
            )
        }
    else:
        variables, levels = _weatherbench2_variables(forecasts, trajectories, field_names, dims)
        if levels:
            coords["level"] = (
                "level",
                np.asarray(levels, np.int64),
                {"units": "hPa", "long_name": "pressure level"},
            )
    return xarray.Dataset(variables, coords=coords, attrs=_netcdf_attributes(attributes))


def _weatherbench2_variables(
    forecasts: np.ndarray,
    trajectories: Trajectories,
    field_names: Sequence[tuple[str, int | None] | None],
    dims: tuple[str, ...],
) -> tuple[dict[str, Any], list[int]]:
    """The variables of the ``wb2`` layout (a surface field on ``dims``, a pressure-level one with ``level``
    before the grid) and the ``level`` coordinate (ascending hPa; empty without pressure-level fields).
    ``forecasts``: (..., C, H, W), the dimensions before the channels' those of ``dims`` before the grid's."""
    channels = trajectories.channel_names
    index, on_levels, levels = _weatherbench2_layout(channels, field_names)
    level_dims = (*dims[:-2], "level", *dims[-2:])
    variables: dict[str, Any] = {}
    for variable, levelled in on_levels.items():
        if not levelled:
            c = index[(variable, None)]
            attrs = {"units": trajectories.units[c], "long_name": trajectories.long_names[c]}
            variables[variable] = (dims, forecasts[..., c, :, :], attrs)
            continue
        per_level = {level: c for (name, level), c in index.items() if name == variable}  # channels' order
        shape = (*forecasts.shape[:-3], len(levels), *forecasts.shape[-2:])
        values = np.full(shape, np.nan, dtype=forecasts.dtype)
        for level, c in per_level.items():
            values[..., levels.index(level), :, :] = forecasts[..., c, :, :]
        attrs = {
            "units": trajectories.units[next(iter(per_level.values()))],
            "long_name": variable.replace("_", " "),
            "channels": ",".join(channels[per_level[level]] for level in sorted(per_level)),
        }
        variables[variable] = (level_dims, values, attrs)
    return variables, levels


def _weatherbench2_layout(
    channels: Sequence[str], field_names: Sequence[tuple[str, int | None] | None]
) -> tuple[dict[tuple[str, int | None], int], dict[str, bool], list[int]]:
    """Which channel becomes which (variable, level) of the ``wb2`` layout, whether each variable has levels
    (in the channels' order), and the ``level`` coordinate (ascending hPa); a DataError where two channels
    would become one field."""
    if len(field_names) != len(channels):
        raise DataError(
            f"the data names {len(field_names)} WeatherBench2 fields for its {len(channels)} channels; "
            "write with --names short"
        )
    index: dict[tuple[str, int | None], int] = {}  # (variable, level or None) -> the channel that became it
    on_levels: dict[str, bool] = {}  # variable -> whether it has a pressure level (in the channels' order)
    for c, (channel, field) in enumerate(zip(channels, field_names, strict=True)):
        variable, level = field if field is not None else (channel, None)
        # one channel per (variable, level), and a variable is a surface field or on levels, not both
        clash = index.get((variable, level))
        if clash is None and on_levels.get(variable, level is not None) != (level is not None):
            clash = next(other for (name, _), other in index.items() if name == variable)
        if clash is not None:
            raise DataError(
                f"channels {channels[clash]} and {channel} both become WeatherBench2's {variable!r}; write the "
                "forecast with --names short"
            )
        index[(variable, level)] = c
        on_levels[variable] = level is not None
    levels = sorted({level for _, level in index if level is not None})
    return index, on_levels, levels


def written_fields(trajectories: Trajectories, names: str = "wb2") -> int:
    """How many (H, W) fields the file holds per initial time, member and lead: one per channel, or with
    WeatherBench2's names one per variable and level of the ``level`` coordinate (a field missing at a level,
    NaN there, takes its room all the same)."""
    field_names = getattr(trajectories, "weatherbench2_names", None) if names == "wb2" else None
    if field_names is None:
        return len(trajectories.channel_names)
    _, on_levels, levels = _weatherbench2_layout(trajectories.channel_names, field_names)
    return sum(len(levels) if levelled else 1 for levelled in on_levels.values())


def written_bytes(
    trajectories: Trajectories, names: str, initial_times: int, members: int, steps: int
) -> int:
    """The bytes of the forecasts ``--write`` writes, uncompressed: float32 values of every initial time, member
    and lead 1..steps (the coordinates and metadata add a few kB)."""
    grid = len(trajectories.latitudes) * len(trajectories.longitudes)
    return 4 * initial_times * members * steps * written_fields(trajectories, names) * grid


def written_size_line(
    fmt: str, names: str, initial_times: int, members: int, steps: int, trajectories: Trajectories
) -> str:
    """What ``--write`` will write and how large it is, for the log before the rollout: netCDF is written
    uncompressed (its size is this), zarr's chunks compressed (less, on a grid of any size)."""
    size = written_bytes(trajectories, names, initial_times, members, steps)
    ensemble = f" x {members} members" if members > 1 else ""
    fields = written_fields(trajectories, names)
    shape = (
        f"{initial_times} initial time{'s' if initial_times != 1 else ''}{ensemble} x {steps} "
        f"lead{'s' if steps != 1 else ''} x {fields} field{'s' if fields != 1 else ''} of "
        f"{len(trajectories.latitudes)} x {len(trajectories.longitudes)} in float32"
    )
    how = "uncompressed" if fmt == "netcdf" else "before zarr's compression of its chunks"
    return f"--write {fmt}: {FORMATS[fmt]} will take {_megabytes(size)} ({shape}, {how})"


def _megabytes(count: int) -> str:
    """``673 MB``, ``1.55 GB``, ``12 kB``: three significant digits in powers of 1000, as df -H."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count} B"


def _netcdf_attributes(attributes: dict[str, Any]) -> dict[str, Any]:
    """Global attributes netCDF can hold (strings and numbers; None left out)."""
    return {
        key: value if isinstance(value, (int, float, str)) else str(value)
        for key, value in attributes.items()
        if value is not None
    }


def write_forecast_file(dataset: Any, path: Path, fmt: str) -> None:
    """Write ``dataset`` to ``path`` as ``fmt`` (netcdf or zarr). A zarr write that fails (a full disk) returns
    only once zarr's writer threads are done, so that the temporary directory it is in can be removed."""
    if fmt == "netcdf":
        dataset.to_netcdf(path, engine="h5netcdf")
        return
    with warnings.catch_warnings(), zarr_writes_finished_on_failure():
        # zarr 3 warns that consolidated metadata (one file listing every array, which xarray writes so that
        # opening a store is one read) is not yet in the zarr 3 specification; zarr and xarray read it.
        warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
        dataset.to_zarr(path, mode="w")
