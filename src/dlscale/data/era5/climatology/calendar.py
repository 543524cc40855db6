"""The calendar of a climatology: plain day of year and hour of day, as WeatherBench2 (xarray's ``dt.dayofyear``
and ``dt.hour``) counts them.

The day of year is the ordinal day within the date's own year, 1 on 1 January: 29 February is day 60 of a
leap year, and 1 March is day 60 of the other years (61 of a leap year); 31 December is day 365, or 366 in a
leap year. A climatology's ``dayofyear`` axis runs 1..366.
"""

from __future__ import annotations

import numpy as np

DAYS_OF_YEAR = 366  # the length of a climatology's dayofyear axis (1..366)


def day_of_year(times: np.ndarray) -> np.ndarray:
    """(N,) int64, 1..366: each time's ordinal day within its own year."""
    times = np.asarray(times).astype("datetime64[m]")
    days = times.astype("datetime64[D]")
    first_of_year = times.astype("datetime64[Y]").astype("datetime64[D]")
    return (days - first_of_year).astype(np.int64) + 1


def year_of(times: np.ndarray) -> np.ndarray:
    """(N,) int64: each time's calendar year."""
    return np.asarray(times).astype("datetime64[Y]").astype(np.int64) + 1970


def minutes_of_day(times: np.ndarray) -> np.ndarray:
    """(N,) int64: minutes since 00 UTC of each time's day (a whole hour h gives 60 h)."""
    times = np.asarray(times).astype("datetime64[m]")
    return (times - times.astype("datetime64[D]")).astype(np.int64)


def hour_of_day(times: np.ndarray) -> np.ndarray:
    """(N,) int64, 0..23: each time's hour (the minutes past it dropped; see :func:`minutes_of_day`)."""
    return minutes_of_day(times) // 60
