"""The plain day of year across leap years (29 February and 1 March), and the hour of day."""

from __future__ import annotations

import numpy as np
import pytest

from dlscale.data.era5.climatology.calendar import day_of_year, hour_of_day, year_of


@pytest.mark.parametrize(
    ("date", "day"),
    [
        ("2016-01-01T00", 1),
        ("2016-02-29T18", 60),  # leap day: day 60 of a leap year
        ("2016-03-01T00", 61),
        ("2017-03-01T06", 60),  # 1 March is day 60 of any other year
        ("2016-12-31T18", 366),
        ("2017-12-31T00", 365),
        ("2000-12-31T12", 366),  # divisible by 400: a leap year
        ("1900-12-31T12", 365),  # divisible by 100 only: not
    ],
)
def test_the_day_of_year_counts_from_1_january_of_the_dates_own_year(date, day):
    assert day_of_year(np.array([np.datetime64(date)]))[0] == day


def test_the_hour_and_year_of_a_time():
    times = np.array(["2016-12-31T18:00", "2017-01-01T06:00"], dtype="datetime64[m]")
    assert hour_of_day(times).tolist() == [18, 6]
    assert year_of(times).tolist() == [2016, 2017]
