"""A climatology store in WeatherBench2's layout, read for a forecast's grid and channels: ours
(``dlscale data climatology``) or one WeatherBench2 publishes (``1990-2019_6h_64x32_equiangular_conservative.zarr``
and its siblings, whose latitudes run south to north and which hold more levels and variables than a forecast
needs).

Opening checks everything that needs no values: the store is zarr and has ``hour`` and ``dayofyear``
dimensions; each channel's variable (as WeatherBench2 names it) and level are there; every row and column of
the forecast's grid is a latitude and longitude of the store (within ``TOLERANCE_DEGREES``; longitudes modulo
360), so a store on another grid is refused, not interpolated. Each is one line naming the store and the
channel or coordinate.

:meth:`ClimatologyStore.at` gives the fields at valid times: hour of day and plain day of year of each time
(:mod:`dlscale.data.era5.climatology.calendar`). An hour the store lacks is one line. A field that is NaN at a
valid time (a day the store's years did not cover: the synthetic data's years cover January to April) is one
line naming the date: the ACC against a missing climatology is not defined, and scoring only the other times
would change what the number averages without saying so. The fields of recent (hour, day) pairs are cached
(consecutive leads and batches of a forecast share days), up to ``CACHE_BYTES``.
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dlscale.data.era5.chunk_files import StoreChunks
from dlscale.data.era5.climatology.calendar import day_of_year, minutes_of_day
from dlscale.data.era5.climatology.store_layout import DAY, HOUR, LATITUDE, LEVEL, LONGITUDE
from dlscale.data.era5.damaged_reads import is_read_failure, read_values
from dlscale.data.era5.grid_matching import TOLERANCE_DEGREES, coordinate_positions
from dlscale.data.era5.store_metadata import check_local_zarr_metadata
from dlscale.errors import ConfigError, DataError, exception_line
from dlscale.runtime.file_status import why_not_a_file

CACHE_BYTES = 1 << 30
_ZARR_MARKERS = (".zgroup", ".zmetadata", "zarr.json")
_YEARS_IN_NAME = re.compile(r"(?<!\d)(\d{4})-(\d{4})(?!\d)")


class ClimatologyStore:
    """The fields of ``channels`` on the grid ``latitudes`` x ``longitudes`` from a climatology store."""

    def __init__(
        self,
        path: Path,
        channel_names: Sequence[str],
        fields: Sequence[tuple[str, int | None]],
        latitudes: np.ndarray,
        longitudes: np.ndarray,
    ):
        """``fields``: each channel's (WeatherBench2 variable, level in hPa or None)."""
        self.path = Path(path)
        dataset = _open(self.path)
        self.name = str(self.path)
        missing_dims = [dim for dim in (HOUR, DAY) if dim not in dataset.dims]
        if missing_dims:
            raise DataError(
                f"{self.path}: has no {' or '.join(repr(d) for d in missing_dims)} dimension (it has "
                f"{', '.join(map(str, dataset.dims)) or 'none'}); expected a climatology by hour of day and day "
                "of year in WeatherBench2's layout"
            )
        self._dataset = dataset
        self.channel_names = tuple(channel_names)
        self.hours = np.asarray(dataset[HOUR].values).astype(np.int64)
        self._day_position = {int(day): i for i, day in enumerate(np.asarray(dataset[DAY].values))}
        self._rows = _positions(self.path, dataset, LATITUDE, np.asarray(latitudes, np.float64), wrap=False)
        self._columns = _positions(
            self.path, dataset, LONGITUDE, np.asarray(longitudes, np.float64), wrap=True
        )
        self._sources = [self._source(name, field) for name, field in zip(channel_names, fields, strict=True)]
        self.years = self._years()
        self.window_days = dataset.attrs.get("window_days")
        self._cache: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        self._chunks = StoreChunks(self.path)
        field_bytes = len(self._sources) * len(self._rows) * len(self._columns) * 4
        self._cache_size = max(8, CACHE_BYTES // max(field_bytes, 1))

    def describe(self) -> dict[str, Any]:
        """For scores.json: what the store is."""
        return {
            "kind": "day_of_year_and_hour",
            "path": str(self.path),
            "years": list(self.years) if self.years is not None else None,
            "window_days": self.window_days,
            "hours": self.hours.tolist(),
        }

    def check_times(self, times: np.ndarray) -> None:
        """Refuse, before a forecast, valid times at an hour the store lacks, or on a day it marks as without
        data (our stores list those in ``days_without_data``)."""
        minutes = minutes_of_day(times)
        lacking = ~np.isin(minutes, self.hours * 60)
        if lacking.any():
            raise DataError(
                f"{self.path}: has no hour of day for the valid time {np.asarray(times)[np.argmax(lacking)]} (it "
                f"holds hours {', '.join(str(h) for h in self.hours.tolist())})"
            )
        empty = set(int(day) for day in self._dataset.attrs.get("days_without_data", []))
        if empty:
            days = day_of_year(times)
            without = np.isin(days, sorted(empty))
            if without.any():
                self._refuse_missing(np.asarray(times)[np.argmax(without)], None)

    def at(self, times: np.ndarray) -> np.ndarray:
        """(N, C, H, W) float32: the climatology at each valid time (datetime64)."""
        times = np.asarray(times).astype("datetime64[m]")
        self.check_times(times)
        hours = minutes_of_day(times) // 60
        days = day_of_year(times)
        out = np.empty((len(times), len(self._sources), len(self._rows), len(self._columns)), np.float32)
        for row, (time, hour, day) in enumerate(zip(times, hours, days, strict=True)):
            out[row] = self._field(int(hour), int(day), time)
        return out

    def _field(self, hour: int, day: int, time: np.datetime64) -> np.ndarray:
        key = (hour, day)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        if day not in self._day_position:
            raise DataError(f"{self.path}: has no day of year {day} (for the valid time {time})")
        hour_at = int(np.flatnonzero(self.hours == hour)[0])
        field = np.empty((len(self._sources), len(self._rows), len(self._columns)), np.float32)
        for c, (variable, level_at) in enumerate(self._sources):
            selection: dict[str, Any] = {HOUR: hour_at, DAY: self._day_position[day]}
            if level_at is not None:
                selection[LEVEL] = level_at
            what = f"variable {variable.name!r} for channel {self.channel_names[c]} at the valid time {time}"
            chunks = self._chunks.check(str(variable.name), variable.dims, selection, what)
            part = variable.isel(selection).transpose(LATITUDE, LONGITUDE)
            values = read_values(part, str(self.path), what + chunks.text())
            field[c] = values[np.ix_(self._rows, self._columns)]
            if not np.isfinite(field[c]).all():
                self._refuse_missing(time, self.channel_names[c], chunks.missing)
        self._cache[key] = field
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return field

    def _refuse_missing(self, time: np.datetime64, channel: str | None, missing: Sequence[str] = ()) -> None:
        which = f" for channel {channel}" if channel is not None else ""
        why = "its years do not cover that day"
        if missing:
            why = f"its chunk {missing[0]} is missing from the store: its years do not cover that day, or it is damaged"
        raise DataError(
            f"{self.path}: holds no climatology{which} at the valid time {time} (day of year "
            f"{int(day_of_year(np.asarray([time]))[0])}: {why}); forecast from initial times its days cover, or "
            "with --climatology time-mean"
        )

    def _source(self, channel: str, field: tuple[str, int | None]) -> tuple[Any, int | None]:
        variable, level = field
        if variable not in self._dataset.data_vars:
            raise DataError(
                f"{self.path}: has no variable {variable!r} for channel {channel} (it has "
                f"{', '.join(sorted(map(str, self._dataset.data_vars)))})"
            )
        array = self._dataset[variable]
        if level is None:
            if LEVEL in array.dims:
                raise DataError(
                    f"{self.path}: variable {variable!r} has pressure levels; channel {channel} is a surface field"
                )
            return array, None
        if LEVEL not in array.dims:
            raise DataError(
                f"{self.path}: variable {variable!r} has no level dimension; channel {channel} needs {level} hPa"
            )
        levels = np.asarray(array[LEVEL].values, dtype=np.float64)
        matches = np.flatnonzero(np.abs(levels - level) < 1e-6)
        if not len(matches):
            raise DataError(
                f"{self.path}: variable {variable!r} has no level {level} hPa for channel {channel} (it has "
                f"{', '.join(f'{value:g}' for value in levels)} hPa)"
            )
        return array, int(matches[0])

    def _years(self) -> tuple[int, int] | None:
        """The years the store averages: its ``years`` attribute (ours), else the ``1990-2019`` in its name
        (WeatherBench2's)."""
        years = self._dataset.attrs.get("years")
        if isinstance(years, (list, tuple)) and len(years) == 2:
            return int(years[0]), int(years[1])
        match = _YEARS_IN_NAME.search(self.path.name)
        return (int(match.group(1)), int(match.group(2))) if match else None


def _open(path: Path) -> Any:
    """The store as a lazily read xarray Dataset (no dask: only the chunks of the days read are read)."""
    try:
        import xarray
    except ImportError:
        raise ConfigError(
            f"reading the climatology {path} needs xarray and zarr, which are not installed: "
            "pip install 'dlscale[era5]'"
        ) from None
    if not path.exists():
        why = why_not_a_file(path) if os.path.islink(path) else "no such climatology store"
        raise DataError(f"{path}: {why}; expected a zarr store in WeatherBench2's layout")
    if not path.is_dir() or not any((path / marker).exists() for marker in _ZARR_MARKERS):
        raise DataError(
            f"{path}: is not a zarr store (no {', '.join(_ZARR_MARKERS)}); expected a climatology in "
            "WeatherBench2's layout, such as dlscale data climatology writes"
        )
    check_local_zarr_metadata(path)
    try:
        return xarray.open_zarr(path, chunks=None, consolidated=None)
    except Exception as exc:
        if not is_read_failure(exc):
            raise
        raise DataError(f"{path}: cannot be opened as a zarr store: {exception_line(exc)}") from exc


def _positions(path: Path, dataset: Any, name: str, wanted: np.ndarray, wrap: bool) -> np.ndarray:
    """The index in the store's coordinate ``name`` of each of ``wanted`` (modulo 360 when ``wrap``)."""
    if name not in dataset.coords:
        raise DataError(f"{path}: has no {name!r} coordinate; expected one to find the forecast's grid in")
    have = np.asarray(dataset[name].values, dtype=np.float64)
    nearest, at = coordinate_positions(have, wanted, wrap)
    if at is not None:
        raise DataError(
            f"{path}: has no {name} within {TOLERANCE_DEGREES:g} degrees of {wanted[at]:g} (the forecast grid's "
            f"{'row' if name == LATITUDE else 'column'} {at}); the store's {len(have)} {name}s run from "
            f"{have[0]:g} to {have[-1]:g}: a climatology on another grid (compute one for this grid with "
            "dlscale data climatology)"
        )
    return nearest
