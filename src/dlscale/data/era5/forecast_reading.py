"""A forecast in WeatherBench2's layout, opened for ``dlscale score``: ours (``dlscale forecast --write``) or one
made elsewhere (a WeatherBench2 baseline, another model's output), a zarr store or a netCDF file.

The layout: dimensions ``time`` (the initial time, dates), ``prediction_timedelta`` (the lead), ``latitude``
and ``longitude`` in any order, and ``level`` (hPa) for the pressure-level variables. Each variable on those
dimensions is one channel, or one per level (``geopotential`` at 500 hPa is ``z500``; see
:func:`dlscale.data.era5.importing.names.channel_of_field`); both WeatherBench2's long names and the short ones
(``z500``, ``t2m``: ``--names short``) are read. A level variable of ours names the levels that hold a channel
in its ``channels`` attribute (the others are NaN), so only those are channels. Variables on other dimensions
(a bounds variable) and level variables of a field with no short name are left out, and listed in
:attr:`ForecastFile.left_out`.

An ensemble has WeatherBench2's ensemble dimension ``number`` on its fields (anywhere among their dimensions;
ours and WeatherBench2's IFS ENS store put it after ``time``), and then every field must have it: a field
without members beside fields with them is one line, not a guess. The members are read in increasing
``number``; the first is the control where it is number 0 (ECMWF's numbering and ours), otherwise
(WeatherBench2's IFS ENS store numbers its perturbed members from 1 and holds no control) the first is only the
member scored alone, and :attr:`ForecastFile.control` says which it is.

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
MEMBER = "number"  # WeatherBench2's ensemble dimension (its evaluation's --ensemble_dim default)
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
        # An ensemble's member numbers in increasing order and their positions along the file's `number`
        # (None: a deterministic forecast)
        self.members, self._member_order = self._members()
        # How the members differ, as dlscale forecast --write records it (None in another's file)
        self.perturbation = (
            self._dataset.attrs.get("ensemble_perturbation") if self.members is not None else None
        )
        self.channels = self._channels()
        if not self.channels:
            raise DataError(
                f"{self.path}: no variable on (time, prediction_timedelta, [level,] latitude, longitude) that "
                f"names a field (left out: {', '.join(self.left_out) or 'none'}); expected {LAYOUT}"
            )

    def _members(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The member numbers, increasing, and where each lies along ``number``; (None, None) when no field
        has that dimension."""
        fields = [
            array for array in self._dataset.data_vars.values() if set(REQUIRED_DIMS) <= set(array.dims)
        ]
        if not any(MEMBER in array.dims for array in fields):
            return None, None
        numbers = np.asarray(self._dataset[MEMBER].values)
        if numbers.size == 0:
            raise DataError(f"{self.path}: its ensemble dimension {MEMBER!r} holds no member")
        if not np.issubdtype(numbers.dtype, np.integer):
            raise DataError(
                f"{self.path}: its members ({MEMBER!r}) are numbered by {numbers.dtype} values "
                f"({', '.join(map(str, numbers[:3]))} ..); expected integers (0: the control)"
            )
        repeated = [int(n) for n in np.unique(numbers) if (numbers == n).sum() > 1]
        if repeated:
            raise DataError(f"{self.path}: its {MEMBER!r} coordinate names member {repeated[0]} twice")
        order = np.argsort(numbers, kind="stable")
        return numbers[order].astype(np.int64), order

    @property
    def member_count(self) -> int:
        """M, the ensemble's members; 1 for a deterministic forecast."""
        return 1 if self.members is None else len(self.members)

    @property
    def control(self) -> str | None:
        """What the first member, the one scored alone as ``model``, is; None for a deterministic forecast."""
        if self.members is None:
            return None
        if self.members[0] == 0:
            return "number 0, the control (the forecast from the unperturbed state)"
        return (
            f"number {self.members[0]}, the lowest: the file has no number 0 (the control in ECMWF's numbering "
            "and dlscale's), so one perturbed member is scored alone in its place"
        )

    def _channels(self) -> list[ForecastChannel]:
        found: list[ForecastChannel] = []
        allowed = {*REQUIRED_DIMS, LEVEL, *([MEMBER] if self.members is not None else [])}
        for variable, array in self._dataset.data_vars.items():
            dims = set(map(str, array.dims))
            if not (set(REQUIRED_DIMS) <= dims <= allowed):
                self.left_out.append(f"{variable} (dimensions {', '.join(map(str, array.dims))})")
                continue
            if self.members is not None and MEMBER not in dims:
                raise DataError(
                    f"{self.path}: its variable {variable!r} has no {MEMBER!r} dimension, while the file's other "
                    f"fields are an ensemble of {len(self.members)} members; expected every field of an ensemble "
                    f"on (time, {MEMBER}, prediction_timedelta, [level,] latitude, longitude)"
                )
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
        on the file's rows ``rows`` and columns ``columns`` (the scoring grid's, in its order); an ensemble's
        (N, M, C, H, W), every member, in increasing ``number``."""
        by_name = {channel.name: channel for channel in self.channels}
        members = () if self.members is None else (len(self.members),)
        out = np.empty((len(time_indices), *members, len(channels), len(rows), len(columns)), np.float32)
        selection: dict[str, Any] = {TIME: np.asarray(time_indices), LEAD: lead_index}
        order = (TIME, LATITUDE, LONGITUDE)
        if self.members is not None:
            selection[MEMBER] = self._member_order
            order = (TIME, MEMBER, LATITUDE, LONGITUDE)
        for c, name in enumerate(channels):
            channel = by_name[name]
            array = self._dataset[channel.variable]
            chosen = dict(selection, **({LEVEL: channel.level_at} if channel.level_at is not None else {}))
            values = array.isel(chosen).transpose(*order).values
            out[..., c, :, :] = values[..., rows, :][..., columns]
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
