"""A forecast in WeatherBench2's layout, opened for ``dlscale score``: ours (``dlscale forecast --write``) or one
made elsewhere (a WeatherBench2 baseline, another model's output), a zarr store or a netCDF file.

The layout: dimensions ``time`` (the initial time, dates), ``prediction_timedelta`` (the lead), ``latitude``
and ``longitude`` in any order, and ``level`` (hPa) for the pressure-level variables. Each variable on those
dimensions is one channel, or one per level (``geopotential`` at 500 hPa is ``z500``; see
:func:`dlscale.data.era5.importing.names.channel_of_field`); both WeatherBench2's long names and the short ones
(``z500``, ``t2m``: ``--names short``) are read. A level variable of ours names the levels that hold a channel
in its ``channels`` attribute (the others are NaN), so only those are channels. Variables on other dimensions
(a bounds variable) and level variables of a field with no short name are left out, and listed in
:attr:`ForecastFile.left_out` (the latter, fields meant as channels, in :attr:`ForecastFile.unnamed` too).

An ensemble has WeatherBench2's ensemble dimension ``number`` on its fields (anywhere among their dimensions;
ours and WeatherBench2's IFS ENS store put it after ``time``), and then every field must have it: a field
without members beside fields with them is one line, not a guess. The members are read in increasing
``number``; the first is the control where it is number 0 (ECMWF's numbering and ours), otherwise
(WeatherBench2's IFS ENS store numbers its perturbed members from 1 and holds no control) the first is only the
member scored alone, and :attr:`ForecastFile.control` says which it is.

Coordinates are scored by value, so each may come in any order, and none may hold a value twice (0 and 360
are one longitude) or a missing one (NaT, NaN): one line naming the file, the coordinate and the value. Levels
in Pa (a ``units`` attribute ``Pa``, or every level above :data:`~dlscale.data.era5.importing.names.MOST_HPA`) are read as hPa, and leads stored
as numbers with a ``units`` attribute (CF's ``hours``, which xarray leaves undecoded) as durations;
:attr:`ForecastFile.level_note` and :attr:`ForecastFile.lead_note` say so for the console. The fields are read
in the file's precision (:attr:`ForecastFile.dtype`: float32, or float64 for float64 or wide integer ones).

Opening reads coordinates only (lazily, without dask): :meth:`ForecastFile.read` reads the fields of a few
initial times at one lead, so a 10-day forecast of several GB is never in memory at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dlscale.data.era5.chunk_files import StoreChunks
from dlscale.data.era5.damaged_reads import read_values
from dlscale.data.era5.file_dates import minute_text
from dlscale.data.era5.grid_matching import on_grid
from dlscale.data.era5.importing.names import channel_of_field, levels_in_hpa
from dlscale.data.era5.importing.source import is_zarr_store
from dlscale.data.era5.optional_modules import require_era5_module
from dlscale.data.era5.store_metadata import check_local_zarr_metadata
from dlscale.errors import DataError

TIME, LEAD, LATITUDE, LONGITUDE, LEVEL = "time", "prediction_timedelta", "latitude", "longitude", "level"
MEMBER = "number"  # WeatherBench2's ensemble dimension (its evaluation's --ensemble_dim default)
REQUIRED_DIMS = (TIME, LEAD, LATITUDE, LONGITUDE)
# A lead given as numbers: its units attribute (CF's, and the short forms) -> numpy's unit
LEAD_UNITS = {
    **{name: "h" for name in ("hours", "hour", "h", "hrs")},
    **{name: "m" for name in ("minutes", "minute", "min")},
    **{name: "s" for name in ("seconds", "second", "s")},
    **{name: "D" for name in ("days", "day", "d")},
}
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
        # The chunk files each read is about to read, checked first (a local zarr store; nothing for netCDF)
        self._chunks = StoreChunks(self.path if self.path.is_dir() else None)
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
                f"{self.path}: its initial times ('time') are not dates ({self.times.dtype}, without units xarray "
                "decodes); scoring against a truth store finds each valid time, time + prediction_timedelta, by "
                "date: give 'time' CF units (e.g. 'hours since 2018-01-01') or dates"
            )
        self.times = self.times.astype("datetime64[ns]")
        _check_coordinate(self.path, TIME, self.times, np.isnat(self.times))
        self.leads, self.lead_note = self._leads()
        _check_coordinate(self.path, LEAD, self.leads, np.isnat(self.leads))
        # copies, in float64: xarray's may be read-only
        self.latitudes = np.array(self._dataset[LATITUDE].values, np.float64)
        self.longitudes = np.array(self._dataset[LONGITUDE].values, np.float64)
        _check_coordinate(self.path, LATITUDE, self.latitudes, ~np.isfinite(self.latitudes))
        # 0 and 360 are one longitude
        wrapped = np.where(np.isfinite(self.longitudes), self.longitudes % 360.0, self.longitudes)
        _check_coordinate(self.path, LONGITUDE, wrapped, ~np.isfinite(self.longitudes))
        self.left_out: list[str] = []
        # Fields on the forecast's dimensions that are no channel (a level variable without a channel name, a
        # level not in whole hPa): what score counts, beside the channels, as the forecast's fields.
        self.unnamed: list[str] = []
        # The levels in hPa, and how they were read when the file gives them in Pa (None: as they are).
        self.levels_hpa, self.level_note = self._levels()
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

    def _leads(self) -> tuple[np.ndarray, str | None]:
        """The leads as durations (timedelta64[ns]), and a note when the file gives them as numbers with their
        unit in a ``units`` attribute (``hours``, as CF writes them, which xarray leaves undecoded)."""
        coordinate = self._dataset[LEAD]
        leads = np.asarray(coordinate.values)
        if np.issubdtype(leads.dtype, np.timedelta64):
            return leads.astype("timedelta64[ns]"), None
        units = str(coordinate.attrs.get("units", "")).strip()
        unit = LEAD_UNITS.get(units.lower())
        if (
            not (np.issubdtype(leads.dtype, np.integer) or np.issubdtype(leads.dtype, np.floating))
            or unit is None
        ):
            raise DataError(
                f"{self.path}: its leads ('prediction_timedelta') are not durations ({leads.dtype}"
                f"{f', units {units!r}' if units else ', no units'}); give them as durations (numpy timedelta64) "
                f"or numbers with a units attribute, one of {', '.join(sorted(set(LEAD_UNITS)))}"
            )
        nanoseconds = np.asarray(leads, np.float64) * (np.timedelta64(1, unit) / np.timedelta64(1, "ns"))
        durations = np.where(np.isfinite(nanoseconds), nanoseconds, 0).round().astype("timedelta64[ns]")
        durations[~np.isfinite(nanoseconds)] = np.timedelta64("NaT")
        return (
            durations,
            f"{self.path}: its leads are numbers in {units} (its units attribute): read as durations",
        )

    def _levels(self) -> tuple[np.ndarray | None, str | None]:
        """The ``level`` coordinate in hPa, and a note when the file gives it in Pa (its ``units`` attribute
        says ``Pa``, or every level is above 1100, where no atmosphere's pressure in hPa is): read divided by
        100. Duplicated or non-finite levels are refused."""
        if LEVEL not in self._dataset.variables and LEVEL not in self._dataset.dims:
            return None, None
        coordinate = self._dataset[LEVEL]
        levels = np.asarray(coordinate.values, np.float64)
        _check_coordinate(self.path, LEVEL, levels, ~np.isfinite(levels))
        in_hpa, why = levels_in_hpa(levels, str(coordinate.attrs.get("units", "")))
        if why is None:
            return levels, None
        return np.asarray(in_hpa, np.float64), (
            f"{self.path}: its levels are in Pa ({why}): read as hPa, divided by 100 "
            f"({levels[0]:g} Pa is {levels[0] / 100:g} hPa)"
        )

    @property
    def dtype(self) -> np.dtype:
        """The precision the channels are read in: float32, or float64 where a channel's variable holds more
        (float64, or integers beyond float32's 24 bits); float16 is read as float32."""
        variables = {channel.variable for channel in self.channels}
        return np.result_type(np.float32, *(self._dataset[name].dtype for name in sorted(variables)))

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
            assert self.levels_hpa is not None  # a variable on `level` has the coordinate
            for at, level in enumerate(self.levels_hpa):
                name = channel_of_field(str(variable), int(level)) if float(level).is_integer() else None
                if name is None:
                    why = "no channel name for it" if float(level).is_integer() else "not a whole hPa"
                    self.left_out.append(f"{variable} at {level:g} hPa ({why})")
                    self.unnamed.append(f"{variable} at {level:g} hPa")
                elif kept is None or name in kept:
                    found.append(
                        ForecastChannel(name, str(variable), at, unit, f"{long_name} at {level:g} hPa")
                    )
        return found

    @property
    def channel_names(self) -> tuple[str, ...]:
        return tuple(channel.name for channel in self.channels)

    @property
    def time_chunk(self) -> int:
        """The initial times one chunk of the first channel's variable holds (1 where the file says none: a
        netCDF variable stored whole, a store without chunks): a reader that reads as many together, from a
        chunk's first, decodes each chunk once per read of its leads."""
        encoding = self._dataset[self.channels[0].variable].encoding
        preferred = (encoding.get("preferred_chunks") or {}).get(TIME)
        if preferred is None and encoding.get("chunksizes"):  # netCDF's chunks, in the variable's dims' order
            preferred = encoding["chunksizes"][self._dataset[self.channels[0].variable].dims.index(TIME)]
        return max(1, int(preferred or 1))

    def read(
        self,
        time_indices: Sequence[int],
        lead_index: int,
        channels: Sequence[str],
        rows: np.ndarray,
        columns: np.ndarray,
        dtype: np.dtype | None = None,
    ) -> np.ndarray:
        """(N, C, H, W) of ``dtype`` (default :attr:`dtype`): ``channels`` at the initial times ``time_indices``
        and the lead ``lead_index``, on the file's rows ``rows`` and columns ``columns`` (the scoring grid's, in its
        order); an ensemble's (N, M, C, H, W), every member, in increasing ``number``."""
        return self.read_leads(time_indices, [lead_index], channels, rows, columns, dtype)[:, 0]

    def read_leads(
        self,
        time_indices: Sequence[int],
        lead_indices: Sequence[int],
        channels: Sequence[str],
        rows: np.ndarray,
        columns: np.ndarray,
        dtype: np.dtype | None = None,
    ) -> np.ndarray:
        """(N, L, C, H, W), as :meth:`read` at each of the leads ``lead_indices``; an ensemble's (N, L, M, C, H,
        W). Each variable is read once, its levels together: a zarr chunk holds several initial times, leads and
        levels (xarray's default chunks split each axis in a few), so a read per channel and lead would decode
        each chunk once per channel and lead (up to 120 times per chunk of dlscale's demo forecast)."""
        by_name = {channel.name: channel for channel in self.channels}
        members = () if self.members is None else (len(self.members),)
        shape = (len(time_indices), len(lead_indices), *members, len(channels), len(rows), len(columns))
        out = np.empty(shape, self.dtype if dtype is None else dtype)
        selection: dict[str, Any] = {TIME: np.asarray(time_indices), LEAD: np.asarray(lead_indices)}
        order: tuple[str, ...] = (TIME, LEAD)
        if self.members is not None:
            selection[MEMBER] = self._member_order
            order = (TIME, LEAD, MEMBER)
        by_variable: dict[str, list[int]] = {}  # variable -> the positions of its channels among `channels`
        for c, name in enumerate(channels):
            by_variable.setdefault(by_name[name].variable, []).append(c)
        for variable, positions in by_variable.items():
            array = self._dataset[variable]
            levels = [by_name[channels[c]].level_at for c in positions]
            chosen, dims = dict(selection), (*order, LATITUDE, LONGITUDE)
            read_levels: list[int] = []
            if levels[0] is not None:
                read_levels = sorted({int(level) for level in levels if level is not None})
                chosen[LEVEL], dims = np.asarray(read_levels), (*order, LEVEL, LATITUDE, LONGITUDE)
            # Each chunk file this read needs, checked first (a link loop, a directory, a pipe: one line)
            checked = self._chunks.check(variable, array.dims, chosen, what := self._what(variable, chosen))
            values = read_values(array.isel(chosen).transpose(*dims), str(self.path), what + checked.text())
            values = on_grid(values, rows, columns)
            for c, level in zip(positions, levels, strict=True):
                out[..., c, :, :] = values if level is None else values[..., read_levels.index(level), :, :]
        return out

    def _what(self, variable: str, chosen: dict[str, Any]) -> str:
        """The read of ``variable`` at ``chosen`` in a message: 'variable 't2m' at lead 6 h, initial times
        2018-01-01T00:00 .. 2018-01-02T00:00' (leads 6 h .. 24 h where it reads several)."""
        leads = self.leads[np.atleast_1d(chosen[LEAD])] / np.timedelta64(1, "h")
        hours = " .. ".join(dict.fromkeys(f"{float(h):g} h" for h in (leads.min(), leads.max())))
        times = self.times[np.atleast_1d(chosen[TIME])]
        span = " .. ".join(dict.fromkeys(minute_text(t) for t in (times.min(), times.max())))
        return f"variable {variable!r} at lead{'s' if len(leads) > 1 else ''} {hours}, initial times {span}"

    def close(self) -> None:
        self._dataset.close()


def _check_coordinate(path: Path, name: str, values: np.ndarray, invalid: np.ndarray) -> None:
    """A coordinate scored by value holds no missing value (NaT, NaN) and no value twice: one line naming the
    file, the coordinate and the value otherwise."""
    if invalid.any():
        at = int(np.argmax(invalid))
        raise DataError(
            f"{path}: its {name!r} coordinate holds {values[at]} at position {at}; every {name} must be a value"
        )
    unique, counts = np.unique(values, return_counts=True)
    if (counts > 1).any():
        raise DataError(
            f"{path}: its {name!r} coordinate holds {_value_text(unique[np.argmax(counts > 1)])} "
            f"{int(counts.max())} times; each {name} must appear once (a forecast is scored by value: drop the "
            "repeats, e.g. with xarray's drop_duplicates)"
        )


def _value_text(value: Any) -> str:
    """A coordinate's value as a user reads it: a date to the minute, a lead in hours, a number in short."""
    if isinstance(value, np.datetime64):
        return str(np.datetime_as_string(value, unit="m"))
    if isinstance(value, np.timedelta64):
        return f"{value / np.timedelta64(1, 'h'):g} h"
    return f"{float(value):g}"


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
    if path.is_dir():
        check_local_zarr_metadata(path)  # before xarray reads it: a codec that could run code is refused
    try:
        if path.is_dir():
            return xarray.open_zarr(path, chunks=None, consolidated=None)
        return xarray.open_dataset(path, chunks=None)
    except Exception as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(
            f"{path}: cannot be opened as a zarr store or a netCDF file with xarray: {first_line}"
        ) from exc
