"""Which days of the year a climatology has no data for, in words, and what ``dlscale forecast`` does with them.

A day has no data when no state of the chosen years lies within its window (a partial year: training years that
hold only January to April leave most of the year NaN). :meth:`ClimatologyStore.check_times
<dlscale.data.era5.climatology.reading.ClimatologyStore.check_times>` refuses a forecast whose valid times fall
on such a day, before its rollout, while the store is its climatology; :func:`lacking_days_line` says so when
the store is written, instead of leaving it to the first forecast.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dlscale.data.era5.climatology.calendar import DAYS_OF_YEAR
from dlscale.data.era5.climatology.years import years_text

_DATES_OF_A_COMMON_YEAR = np.datetime64("2001-01-01") + np.arange(365)


def day_ranges(days: Sequence[int]) -> list[tuple[int, int]]:
    """Days of the year (1..366, any order) as runs of consecutive days: ``[1, 2, 3, 7]`` -> ``[(1, 3), (7, 7)]``."""
    ranges: list[tuple[int, int]] = []
    for day in sorted(set(int(day) for day in days)):
        if ranges and day == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], day)
        else:
            ranges.append((day, day))
    return ranges


def day_date(day: int) -> str:
    """The date of day of year ``day`` in a year without 29 February (``65`` -> ``'6 Mar'``); day 366 is the
    31 December of a leap year."""
    date = _DATES_OF_A_COMMON_YEAR[min(day, 365) - 1].item()
    return f"{date.day} {date.strftime('%b')}"


def ranges_text(days: Sequence[int]) -> str:
    """``'days 65-366 (6 Mar - 31 Dec)'``, ``'day 60 (1 Mar), days 90-95 (31 Mar - 5 Apr)'``."""
    parts = []
    for first, last in day_ranges(days):
        if first == last:
            parts.append(f"day {first} ({day_date(first)})")
        else:
            parts.append(f"days {first}-{last} ({day_date(first)} - {day_date(last)})")
    return ", ".join(parts)


def lacking_days_line(path: Path, days: Sequence[int], years: tuple[int, int]) -> str | None:
    """One line saying which ``days`` of the year the climatology at ``path`` of ``years`` (first, last) has no
    data for, and what a forecast does on them; None when it has every day."""
    if not days:
        return None
    return (
        f"{path}: no climatology for {len(set(days))} of the {DAYS_OF_YEAR} days of the year, {ranges_text(days)} "
        f"(dates of a year without 29 Feb): the years {years_text(years)} hold no state within those days' windows. "
        "While this store is a forecast's climatology (dlscale forecast's default, data.climatology_path), a "
        "forecast whose valid times (initial time + lead) fall on those days stops before its rollout: start "
        "it at initial times whose valid times lie in the other days (--init), or score it against one mean "
        "field with --climatology time-mean"
    )
