"""The climatology of a data root's year files, streamed by channel and latitude band (WeatherBench2's
``compute_hourly_stat``; the formula is :mod:`dlscale.data.era5.climatology.window`'s).

For each channel and band of rows, every state of the chosen years is read once (``fields[t, c, rows, :]`` of
each file, at most ``BLOCK_STEPS`` time indices at a time) and added to two float64 sums per (hour of day, day
of year, grid point): the values and the count of years with a finite value (NaN and infinite values are
skipped, as xarray's weighted mean skips NaN). A year with no day 366 at a point (every non-leap year) takes its
day 365 there, as WeatherBench2 fills day 366; a year whose data does not reach the end of the year fills
nothing (WeatherBench2 fills any missing day of a year with that year's day 365, which differs only for years
with holes, which it is not run on). The window's mean over (window, year) then gives the band's climatology,
written into the store's rows before the next band is read.

Memory: the sums of one band, (366, hours, rows, W) float64 values and int32 counts, the window's temporaries
(a few arrays of that size, float64) and the read block. On ERA5's 0.25-degree grid (721 x 1440, 4 hours of
day) that is about 140 MB per row of the band, so the default budget of 2 GiB streams bands of 15 rows (49
bands per channel); 20 channels over 30 years (3.6 TB of float32 states) are read once in 980 band passes and
never held at once. On the demo's 32 x 64 grid one band holds every row.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from dlscale.data.era5.climatology.calendar import DAYS_OF_YEAR, day_of_year, hour_of_day, year_of
from dlscale.data.era5.climatology.sources import ClimatologySources, DatedFile
from dlscale.data.era5.climatology.store_layout import ClimatologyWriter
from dlscale.data.era5.climatology.window import windowed_mean
from dlscale.data.era5.layout import FIELDS_KEY
from dlscale.runtime.progress_text import format_duration

DEFAULT_MEMORY_BYTES = 2 * 2**30
BLOCK_STEPS = 256  # time indices read at once: a 0.25-degree band of 15 rows is 22 MB per 256 steps
# float64 arrays of one band's size alive at the peak: the sums, the counts (as int32, half of one) and the
# window's padded copies and running sums of both.
_BAND_ARRAYS = 7.0


@dataclass(frozen=True)
class _SelectedFile:
    """The states of one file inside the chosen years, and where each goes."""

    path: Path
    indices: np.ndarray  # time indices into the file, ascending
    hour_index: np.ndarray  # into the store's hours
    day_index: np.ndarray  # 0..365 (day of year - 1)
    years: np.ndarray


def climatology_hours(sources: ClimatologySources, years: tuple[int, int]) -> list[int]:
    """The hours of day the chosen years' states fall on (0, 6, 12, 18 for 6-hourly data)."""
    hours: set[int] = set()
    for file in sources.files:
        chosen = _in_years(file.times, years)
        hours.update(int(hour) for hour in np.unique(hour_of_day(file.times[chosen])))
    return sorted(hours)


def band_rows(hours: int, width: int, height: int, max_steps: int, memory_bytes: int) -> int:
    """The rows of a band that keep one band's arrays within ``memory_bytes`` (at least 1)."""
    per_row = _BAND_ARRAYS * hours * (DAYS_OF_YEAR + 61) * width * 8 + min(max_steps, BLOCK_STEPS) * width * 4
    return max(1, min(height, int(memory_bytes // per_row)))


def compute_climatology(
    sources: ClimatologySources,
    years: tuple[int, int],
    window: int,
    writer: ClimatologyWriter,
    hours: list[int],
    rows_per_band: int,
    report: Callable[[str], None],
    interval_s: float = 10.0,
) -> list[int]:
    """Compute every channel's climatology over ``years`` into ``writer``, band by band; returns the days of
    year (1..366) that have no data at some hour (the first channel's, all of the grid's points)."""
    selected = [_select(file, years, hours) for file in sources.files]
    selected = [file for file in selected if len(file.indices)]
    year_numbers = sorted({int(year) for file in selected for year in np.unique(file.years)})
    height, width = len(sources.grid.latitudes), len(sources.grid.longitudes)
    bands = [(row, min(row + rows_per_band, height)) for row in range(0, height, rows_per_band)]
    channels = sources.channel_names
    total, done, started = len(channels) * len(bands), 0, time.perf_counter()
    last_line = started
    days_with_data = np.ones((len(hours), DAYS_OF_YEAR), dtype=bool)
    for c, channel in enumerate(channels):
        for first, last in bands:
            sums, counts = _band_sums(selected, year_numbers, c, first, last, len(hours), width)
            climatology = windowed_mean(sums, counts, window, axis=0)  # (366, hours, rows, W)
            del sums, counts
            if c == 0:
                days_with_data &= np.isfinite(climatology).any(axis=(2, 3)).T
            writer.write(c, first, climatology.transpose(1, 0, 2, 3))
            done += 1
            now = time.perf_counter()
            if now - last_line >= interval_s or done == total:
                last_line = now
                left = (now - started) / done * (total - done)
                report(
                    f"climatology: {done}/{total} bands ({100 * done / total:.0f}%), {channel} rows "
                    f"{first}-{last - 1} of {height}, ETA {format_duration(left)}"
                )
    return [day + 1 for day in range(DAYS_OF_YEAR) if not days_with_data[:, day].all()]


def _select(file: DatedFile, years: tuple[int, int], hours: list[int]) -> _SelectedFile:
    indices = np.flatnonzero(_in_years(file.times, years))
    times = file.times[indices]
    hour_index = np.searchsorted(hours, hour_of_day(times))
    return _SelectedFile(file.path, indices, hour_index, day_of_year(times) - 1, year_of(times))


def _in_years(times: np.ndarray, years: tuple[int, int]) -> np.ndarray:
    year = year_of(times)
    return (year >= years[0]) & (year <= years[1])


def _band_sums(
    files: list[_SelectedFile],
    year_numbers: list[int],
    channel: int,
    first: int,
    last: int,
    n_hours: int,
    width: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(366, hours, rows, W) float64 sums over years of the finite values on rows ``first:last``, and their
    counts (int32), day 366 filled from day 365 where a year has none. Days first: the window's running sums
    run along the first axis, whole rows at a time."""
    shape = (DAYS_OF_YEAR, n_hours, last - first, width)
    sums, counts = np.zeros(shape), np.zeros(shape, dtype=np.int32)
    # Each year's day 365 and whether it has a day 366, per hour and point: WeatherBench2's fill of day 366.
    day_365 = {year: np.full((n_hours, last - first, width), np.nan) for year in year_numbers}
    has_366 = {year: np.zeros((n_hours, last - first, width), dtype=bool) for year in year_numbers}
    for file in files:
        with h5py.File(file.path, "r") as handle:
            fields = handle[FIELDS_KEY]
            for at in range(0, len(file.indices), BLOCK_STEPS):
                block = slice(at, at + BLOCK_STEPS)
                indices = file.indices[block]
                # One contiguous read from the first to the last index of the block (they are usually all).
                read = fields[indices[0] : indices[-1] + 1, channel, first:last, :width]
                values = np.asarray(read[indices - indices[0]], dtype=np.float64)
                finite = np.isfinite(values)
                hour, day = file.hour_index[block], file.day_index[block]
                # A (hour, day) pair comes once per year (dates are distinct), so within one year's states the
                # fancy-indexed += adds each value once.
                for year in np.unique(file.years[block]):
                    mine = file.years[block] == year
                    sums[day[mine], hour[mine]] += np.where(finite[mine], values[mine], 0.0)
                    counts[day[mine], hour[mine]] += finite[mine]
                    _note_year_end(
                        day_365[int(year)], has_366[int(year)], hour[mine], day[mine], values[mine]
                    )
    for year in year_numbers:
        fill = ~has_366[year] & np.isfinite(day_365[year])
        sums[DAYS_OF_YEAR - 1] += np.where(fill, day_365[year], 0.0)
        counts[DAYS_OF_YEAR - 1] += fill
    return sums, counts


def _note_year_end(
    day_365: np.ndarray, has_366: np.ndarray, hour: np.ndarray, day: np.ndarray, values: np.ndarray
) -> None:
    """Keep one year's day-365 values and where it has a finite day 366."""
    at_365, at_366 = day == DAYS_OF_YEAR - 2, day == DAYS_OF_YEAR - 1
    day_365[hour[at_365]] = values[at_365]
    has_366[hour[at_366]] |= np.isfinite(values[at_366])
