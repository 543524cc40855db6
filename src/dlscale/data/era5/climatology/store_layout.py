"""WeatherBench2's climatology layout, as dlscale writes it (``<data root>/stats/climatology.zarr``).

Dimensions ``hour`` (the hours of day the data has: 0, 6, 12, 18 for 6-hourly states), ``dayofyear`` (1..366),
``level`` (hPa, ascending; only where a pressure-level field is a channel), ``latitude`` (as the year files:
north to south for an import) and ``longitude``. Variables as WeatherBench2 names them
(:func:`dlscale.data.era5.importing.names.weatherbench2_name`): ``geopotential`` on ``(hour, dayofyear, level,
latitude, longitude)`` for z50, z500, z850, z1000 (NaN at a level no channel gives), ``2m_temperature`` on
``(hour, dayofyear, latitude, longitude)``; a channel WeatherBench2 has no name for keeps its own. float32,
missing values NaN.

Chunks: every hour, one day of year, one level, a band of latitude rows (the band the computation streams, all
rows on a small grid), every longitude: a forecast reads only the days its valid times fall on. On a grid whose
day is smaller than ``CHUNK_BYTES`` (1 MiB: the 64 x 32 grid's day is 32 kB), a chunk holds as many days as
make about that much, so a store is not thousands of tiny files; a forecast reads at most that much more. zarr format 2
with consolidated metadata, as WeatherBench2's stores, so xarray (and WeatherBench2's code) opens it with
``xarray.open_zarr``. Attributes: the years, the window, the method, the hours, the source and which days have
no data (``days_without_data``; synthetic years that cover January to April leave most of the year NaN).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dlscale.data.era5.climatology.calendar import DAYS_OF_YEAR
from dlscale.data.era5.importing.names import weatherbench2_name
from dlscale.data.era5.optional_modules import require_era5_module
from dlscale.errors import DataError

CLIMATOLOGY_STORE = "climatology.zarr"  # under the data root's stats/
CHUNK_BYTES = 1 << 20
HOUR, DAY, LEVEL, LATITUDE, LONGITUDE = "hour", "dayofyear", "level", "latitude", "longitude"


def climatology_path(root: Path) -> Path:
    """``<root>/stats/climatology.zarr``: where ``dlscale data climatology`` and ``import-era5`` write a data
    root's climatology, the store ``data.climatology_path`` names by default."""
    return root / "stats" / CLIMATOLOGY_STORE


@dataclass
class StoreVariable:
    """One variable of the store: its name, whether it has a ``level`` dimension, and the channel at each level
    (the key None for a surface field's one channel)."""

    name: str
    on_levels: bool
    channel_of_level: dict[int | None, int] = field(default_factory=dict)


def store_variables(channel_names: Sequence[str]) -> list[StoreVariable]:
    """The variables the channels become (in the channels' order): one channel per (variable, level), and a
    variable either on levels or not."""
    variables: dict[str, StoreVariable] = {}
    for c, channel in enumerate(channel_names):
        variable, level = weatherbench2_name(channel) or (channel, None)
        entry = variables.setdefault(variable, StoreVariable(variable, on_levels=level is not None))
        if entry.on_levels != (level is not None):
            clash: int | None = next(iter(entry.channel_of_level.values()))
        else:
            clash = entry.channel_of_level.get(level)
        if clash is not None:
            raise DataError(
                f"channels {channel_names[clash]} and {channel} both become the climatology's variable "
                f"{variable!r}; a store holds each (variable, level) once"
            )
        entry.channel_of_level[level] = c
    return list(variables.values())


def days_in_a_chunk(hours: int, height: int, width: int) -> int:
    """1 where a day of the whole grid (float32, every hour) is at least ``CHUNK_BYTES``, else as many days as
    make about that much."""
    return max(1, min(DAYS_OF_YEAR, CHUNK_BYTES // (hours * height * width * 4)))


def stored_years(path: Path) -> tuple[int, int] | None:
    """The ``years`` attribute of a store dlscale wrote (zarr format 2's ``.zattrs``); None for no such store."""
    years = _stored_attributes(path).get("years")
    return (int(years[0]), int(years[1])) if isinstance(years, list) and len(years) == 2 else None


def stored_days_without_data(path: Path) -> list[int]:
    """The ``days_without_data`` attribute of a store dlscale wrote (empty for none, or no such store)."""
    days = _stored_attributes(path).get("days_without_data")
    return [int(day) for day in days] if isinstance(days, list) else []


def stored_generator(path: Path) -> str | None:
    """The ``generator`` attribute of a store (``dlscale data climatology`` for ours); None for none."""
    generator = _stored_attributes(path).get("generator")
    return generator if isinstance(generator, str) else None


def _stored_attributes(path: Path) -> dict[str, Any]:
    try:
        attributes = json.loads((path / ".zattrs").read_text())
    except (OSError, ValueError):
        return {}
    return attributes if isinstance(attributes, dict) else {}


def require_zarr(what: str) -> Any:
    """The zarr module, or one line saying how to install it."""
    return require_era5_module("zarr", what)


class ClimatologyWriter:
    """Creates the store's arrays (all NaN), then takes one channel's band of rows at a time."""

    def __init__(
        self,
        path: Path,
        channel_names: Sequence[str],
        hours: Sequence[int],
        latitudes: np.ndarray,
        longitudes: np.ndarray,
        band_rows: int,
        attributes: dict[str, Any],
    ):
        zarr = require_zarr("writing a climatology")
        self.path = path
        options = {"zarr_format": 2} if not zarr.__version__.startswith("2.") else {}
        self._group = zarr.open_group(str(path), mode="w", **options)
        self._group.attrs.update(attributes)
        self.variables = store_variables(channel_names)
        self.levels = sorted({lv for v in self.variables for lv in v.channel_of_level if lv is not None})
        height, width = len(latitudes), len(longitudes)
        days_per_chunk = days_in_a_chunk(len(hours), height, width)
        self._coordinate(HOUR, np.asarray(hours, np.int64), {"long_name": "hour of day (UTC)"})
        days = np.arange(1, DAYS_OF_YEAR + 1, dtype=np.int64)
        self._coordinate(DAY, days, {"long_name": "day of year (1 January: 1)"})
        if self.levels:
            self._coordinate(LEVEL, np.asarray(self.levels, np.int64), {"units": "hPa"})
        self._coordinate(LATITUDE, np.asarray(latitudes, np.float64), {"units": "degrees_north"})
        self._coordinate(LONGITUDE, np.asarray(longitudes, np.float64), {"units": "degrees_east"})
        self._arrays = {}
        self._place: dict[int, tuple[str, int | None]] = {}  # channel -> (variable, level index or None)
        for variable in self.variables:
            on_levels = variable.on_levels
            dims = (HOUR, DAY, *((LEVEL,) if on_levels else ()), LATITUDE, LONGITUDE)
            shape = (len(hours), DAYS_OF_YEAR, *((len(self.levels),) if on_levels else ()), height, width)
            rows = min(band_rows, height)
            chunks = (len(hours), days_per_chunk, *((1,) if on_levels else ()), rows, width)
            self._arrays[variable.name] = self._array(variable.name, shape, chunks, np.float32, np.nan, dims)
            for level, c in variable.channel_of_level.items():
                self._place[c] = (variable.name, None if level is None else self.levels.index(level))

    def write(self, channel: int, first_row: int, values: np.ndarray) -> None:
        """``values`` (hours, 366, rows, W): channel ``channel``'s climatology on rows ``first_row`` onwards."""
        name, level = self._place[channel]
        rows = slice(first_row, first_row + values.shape[2])
        if level is None:
            self._arrays[name][:, :, rows, :] = values.astype(np.float32)
        else:
            self._arrays[name][:, :, level, rows, :] = values.astype(np.float32)

    def finish(self, attributes: dict[str, Any]) -> None:
        """Add ``attributes`` (what only the computation knew) and consolidate the metadata (one read opens the
        store, as WeatherBench2's)."""
        self._group.attrs.update(attributes)
        zarr = require_zarr("writing a climatology")
        with warnings.catch_warnings():
            # zarr 3 warns that consolidated metadata is not yet in the zarr 3 specification; xarray reads it.
            warnings.filterwarnings("ignore", message="Consolidated metadata", category=UserWarning)
            zarr.consolidate_metadata(str(self.path))

    def _coordinate(self, name: str, values: np.ndarray, attributes: dict[str, Any]) -> None:
        array = self._array(name, values.shape, values.shape, values.dtype, None, (name,))
        array[...] = values
        array.attrs.update(attributes)

    def _array(self, name, shape, chunks, dtype, fill_value, dims) -> Any:
        # zarr 3 names it create_array, zarr 2 create_dataset; xarray reads the dims from _ARRAY_DIMENSIONS.
        create = getattr(self._group, "create_array", None) or self._group.create_dataset
        array = create(name, shape=shape, chunks=chunks, dtype=dtype, fill_value=fill_value)
        array.attrs["_ARRAY_DIMENSIONS"] = list(dims)
        return array
