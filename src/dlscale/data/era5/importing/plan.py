"""Which time steps of an ERA5 source go into which year file and split.

``--split 1979-2015:train,2016-2017:valid,2018:test`` (the tutorial's years, the default) names each year's
split. ``--dt`` hours (6 by default) picks the steps at 00, 06, 12 and 18 UTC from an hourly or a 6-hourly
source alike: steps whose time of day is a multiple of dt, so that every file starts at midnight and a
model's step is the same 6 hours in every file. Within a year the picked steps must follow each other at
exactly dt hours: dlscale's reader pairs step t with step t + 1 of a file, and a gap would silently make one
pair span 12 hours. A partial year (the first or last of a source) is fine; it gives a shorter file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from dlscale.errors import ConfigError, DataError

SPLITS = ("train", "valid", "test")
DEFAULT_SPLIT = "1979-2015:train,2016-2017:valid,2018:test"
_PART = re.compile(r"^(\d{4})(?:-(\d{4}))?:(\w+)$")


@dataclass(frozen=True)
class YearFile:
    """One output file: its split, year and time steps (datetime64[ns])."""

    split: str
    year: int
    times: np.ndarray


def parse_split(text: str) -> dict[int, str]:
    """year -> split of a ``--split`` value such as ``1979-2015:train,2016-2017:valid,2018:test``."""
    years: dict[int, str] = {}
    for part in (piece.strip() for piece in text.split(",") if piece.strip()):
        match = _PART.match(part)
        if match is None:
            raise ConfigError(
                f"import-era5: --split part {part!r} is not YEAR:SPLIT or FIRST-LAST:SPLIT (e.g. {DEFAULT_SPLIT})"
            )
        first, last, split = int(match.group(1)), int(match.group(2) or match.group(1)), match.group(3)
        if split not in SPLITS:
            raise ConfigError(
                f"import-era5: --split names split {split!r}; the splits are {', '.join(SPLITS)}"
            )
        if last < first:
            raise ConfigError(f"import-era5: --split part {part!r} ends before it starts")
        for year in range(first, last + 1):
            if year in years:
                raise ConfigError(f"import-era5: --split puts {year} in both {years[year]} and {split}")
            years[year] = split
    for needed in ("train", "valid"):
        if needed not in years.values():
            raise ConfigError(
                f"import-era5: --split {text!r} has no {needed} years; training needs train and valid"
            )
    return years


def check_dt(dt_hours: int) -> None:
    if dt_hours < 1 or 24 % dt_hours != 0:
        raise ConfigError(f"import-era5: --dt {dt_hours} must divide 24 hours (1, 2, 3, 4, 6, 8, 12 or 24)")


def year_files(times: np.ndarray, dt_hours: int, split_of_year: dict[int, str], where: str) -> list[YearFile]:
    """The files to write, in split order (train, valid, test) and year order, from a source's time axis."""
    times = times.astype("datetime64[ns]")
    time_of_day = times - times.astype("datetime64[D]").astype("datetime64[ns]")
    aligned = time_of_day % np.timedelta64(dt_hours, "h") == np.timedelta64(0, "ns")
    year_of_time = times.astype("datetime64[Y]").astype(np.int64) + 1970
    missing = sorted(year for year in split_of_year if not (aligned & (year_of_time == year)).any())
    if missing:
        covered = f"{year_of_time.min()}-{year_of_time.max()}" if len(times) else "no time at all"
        raise DataError(
            f"{where}: no {dt_hours}-hourly step in {_years_text(missing)}, which --split asks for; the source "
            f"covers {covered}. Choose years it has with --split, e.g. --split {_example_split(year_of_time)}"
        )
    files = []
    for split in SPLITS:
        for year in sorted(year for year, named in split_of_year.items() if named == split):
            picked = times[aligned & (year_of_time == year)]
            _check_no_gap(picked, dt_hours, times, where)
            files.append(YearFile(split, year, picked))
    return files


def _check_no_gap(picked: np.ndarray, dt_hours: int, all_times: np.ndarray, where: str) -> None:
    steps = np.diff(picked)
    wrong = np.nonzero(steps != np.timedelta64(dt_hours, "h"))[0]
    if len(wrong):
        at = int(wrong[0])
        source_step = np.diff(all_times).min() / np.timedelta64(1, "h") if len(all_times) > 1 else 0
        raise DataError(
            f"{where}: {hour_text(picked[at + 1])} follows {hour_text(picked[at])} among the "
            f"{dt_hours}-hourly steps (a gap; the source's finest step is {source_step:g} h); every step of a "
            f"year must follow the previous one by --dt {dt_hours} h"
        )


def hour_text(time: np.datetime64) -> str:
    """A time as the import's messages name it, to the hour: ``2018-01-01T06``."""
    return str(np.datetime_as_string(time, unit="h"))


def _years_text(years: list[int]) -> str:
    return ", ".join(str(year) for year in years)


def _example_split(year_of_time: np.ndarray) -> str:
    years = sorted(set(year_of_time.tolist()))
    if len(years) < 3:
        return "FIRST-LAST:train,YEAR:valid,YEAR:test with years of the source"
    return f"{years[0]}-{years[-3]}:train,{years[-2]}:valid,{years[-1]}:test"
