"""A forecast in WeatherBench2's layout, opened for ``dlscale score``: ours (``dlscale forecast --write``) or one
made elsewhere (a WeatherBench2 baseline, another model's output), a zarr store or a netCDF file.

The layout: dimensions ``time`` (the initial time, dates), ``prediction_timedelta`` (the lead), ``latitude``
and ``longitude`` in any order, and ``level`` (hPa) for the pressure-level variables. Each variable on those
dimensions is one channel, or one per level (``geopotential`` at 500 hPa is ``z500``; see
:func:`dlscale.data.era5.importing.names.channel_of_field`); both WeatherBench2's long names and the short ones
(``z500``, ``t2m``: ``--names short``) are read. A level variable of ours names the levels that hold a channel
in its ``channels`` attribute (the others are NaN), so only those are channels. Variables on other dimensions
(an ensemble member's, a bounds variable) and level variables of a field with no short name are left out, and
listed in :attr:`ForecastFile.left_out`.

Opening reads coordinates only (lazily, without dask): :meth:`ForecastFile.read` reads the fields of a few
initial times at one lead, so a 10-day forecast of several GB is never in memory at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dlscale.data.era5.importing.names import channel_of_field
from dlscale.data.era5.importing.source import is_zarr_store
from dlscale.data.era5.optional_modules import require_era5_module
from dlscale.errors import DataError

TIME, LEAD, LATITUDE, LONGITUDE, LEVEL = "time", "prediction_timedelta", "latitude", "longitude", "level"
REQUIRED_DIMS = (TIME, LEAD, LATITUDE, LONGITUDE)
LAYOUT = (
    "WeatherBench2's forecast layout: dimensions time, prediction_timedelta, latitude, longitude (and level)"
)


@dataclass(frozen=True)
class ForecastChannel:
    """Where one channel lies in the file: its variable and the position on ``level`` (None: a surface one)."""

    name: str
    variable: str
    level_at: int | None
    unit: str
    long_name: str


class ForecastFile:
    """The channels, initial times, leads and grid of a forecast file, and reads of its fields."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._dataset = _open(self.path)
        dims = set(map(str, self._dataset.dims))
        missing = [dim for dim in REQUIRED_DIMS if dim not in dims]
        if missing:
            raise DataError(
                f"{self.path}: has no {missing[0]!r} dimension (it has {', '.join(sorted(dims)) or 'none'}); "
                f"expected {LAYOUT}"
            )
        self.times = np.asarray(self._dataset[TIME].values)
        if not np.issubdtype(self.times.dtype, np.datetime64):
            raise DataError(
                f"{self.path}: its initial times ('time') are not dates ({self.times.dtype}); scoring against a "
                "truth store finds each valid time, time + prediction_timedelta, by date"
            )
        self.times = self.times.astype("datetime64[ns]")
        leads = np.asarray(self._dataset[LEAD].values)
        if not np.issubdtype(leads.dtype, np.timedelta64):
            raise DataError(
                f"{self.path}: its leads ('prediction_timedelta') are not durations ({leads.dtype})"
            )
        self.leads = leads.astype("timedelta64[ns]")
        self.latitudes = np.array(
            self._dataset[LATITUDE].values, np.float64
        )  # a copy: xarray's may be read-only
        self.longitudes = np.array(self._dataset[LONGITUDE].values, np.float64)
        self.left_out: list[str] = []
        self.channels = self._channels()
        if not self.channels:
            raise DataError(
                f"{self.path}: no variable on (time, prediction_timedelta, [level,] latitude, longitude) that "
                f"names a field (left out: {', '.join(self.left_out) or 'none'}); expected {LAYOUT}"
            )

    def _channels(self) -> list[ForecastChannel]:
        found: list[ForecastChannel] = []
        allowed = {*REQUIRED_DIMS, LEVEL}
        for variable, array in self._dataset.data_vars.items():
            dims = set(map(str, array.dims))
            if not (set(REQUIRED_DIMS) <= dims <= allowed):
                self.left_out.append(f"{variable} (dimensions {', '.join(map(str, array.dims))})")
                continue
            unit = str(array.attrs.get("units", ""))
            long_name = str(array.attrs.get("long_name", variable))
            if LEVEL not in dims:
                name = channel_of_field(str(variable), None) or str(variable)
                found.append(ForecastChannel(name, str(variable), None, unit, long_name))
                continue
            listed = array.attrs.get("channels")  # ours: the levels that hold a channel
            kept = set(str(listed).split(",")) if listed else None
            for at, level in enumerate(np.asarray(array[LEVEL].values)):
                name = channel_of_field(str(variable), int(level))
                if name is None:
                    self.left_out.append(f"{variable} at {level:g} hPa (no channel name for it)")
                elif kept is None or name in kept:
                    found.append(
                        ForecastChannel(name, str(variable), at, unit, f"{long_name} at {level:g} hPa")
                    )
        return found

    @property
    def channel_names(self) -> tuple[str, ...]:
        return tuple(channel.name for channel in self.channels)

    def read(
        self,
        time_indices: Sequence[int],
        lead_index: int,
        channels: Sequence[str],
        rows: np.ndarray,
        columns: np.ndarray,
    ) -> np.ndarray:
        """float32 (N, C, H, W): ``channels`` at the initial times ``time_indices`` and the lead ``lead_index``,
        on the file's rows ``rows`` and columns ``columns`` (the scoring grid's, in its order)."""
        by_name = {channel.name: channel for channel in self.channels}
        out = np.empty((len(time_indices), len(channels), len(rows), len(columns)), np.float32)
        selection = {TIME: np.asarray(time_indices), LEAD: lead_index}
        for c, name in enumerate(channels):
            channel = by_name[name]
            array = self._dataset[channel.variable]
            chosen = dict(selection, **({LEVEL: channel.level_at} if channel.level_at is not None else {}))
            values = array.isel(chosen).transpose(TIME, LATITUDE, LONGITUDE).values
            out[:, c] = values[:, rows][:, :, columns]
        return out

    def close(self) -> None:
        self._dataset.close()


def check_forecast_path(path: Path) -> None:
    """A forecast must be a zarr store or a (netCDF) file: one line otherwise."""
    if not path.exists():
        raise DataError(f"{path}: no such forecast file or zarr store")
    if path.is_dir() and not is_zarr_store(path):
        raise DataError(
            f"{path}: is a directory but not a zarr store; expected a zarr store or a netCDF file"
        )


def _open(path: Path) -> Any:
    """The forecast as a lazily read xarray Dataset (no dask: a read pulls only the chunks it needs)."""
    xarray = require_era5_module("xarray", f"reading the forecast {path}")
    check_forecast_path(path)
    try:
        if path.is_dir():
            return xarray.open_zarr(path, chunks=None, consolidated=None)
        return xarray.open_dataset(path, chunks=None)
    except Exception as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(
            f"{path}: cannot be opened as a zarr store or a netCDF file with xarray: {first_line}"
        ) from exc
