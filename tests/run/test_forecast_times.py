"""``--lead``, ``--init`` and ``--init-count``: durations with units, leads in whole model steps, initial times
whose whole rollout lies in the data, and one clear line for each mistake."""

from __future__ import annotations

import numpy as np
import pytest

from dlscale.data.trajectories import ForecastStart
from dlscale.errors import ConfigError, DataError
from dlscale.run.forecast_times import choose_starts, format_hours, lead_steps, parse_duration_hours

# Two trajectories of 8 six-hourly states each, dated.
STARTS = [
    ForecastStart(
        trajectory, step, np.datetime64(f"{2017 + trajectory}-01-01T00:00") + np.timedelta64(6 * step, "h")
    )
    for trajectory in range(2)
    for step in range(8)
]
REACH = [7 - start.step for start in STARTS]


def choose(init="every:12h", steps=2, count=None, starts=STARTS, reach=REACH):
    return choose_starts(starts, reach, steps, 6.0, 6.0, init, count, "in the test split")


@pytest.mark.parametrize(("text", "hours"), [("10d", 240.0), ("36h", 36.0), ("90m", 1.5), ("1.5d", 36.0)])
def test_durations_are_read_with_their_unit(text, hours):
    assert parse_duration_hours(text, "--lead") == hours


@pytest.mark.parametrize("text", ["10", "ten days", "5w", "-1d"])
def test_a_duration_without_a_unit_is_refused_naming_the_option(text):
    with pytest.raises(ConfigError, match="--lead"):
        parse_duration_hours(text, "--lead")


def test_a_lead_is_a_whole_number_of_model_steps():
    assert lead_steps("10d", 6.0) == 40
    assert lead_steps("1d", 12.0) == 2
    with pytest.raises(ConfigError, match="multiple of the model's step of 6 h"):
        lead_steps("9h", 6.0)
    with pytest.raises(ConfigError, match="positive"):
        lead_steps("0h", 6.0)


def test_hours_are_written_as_days_and_hours():
    assert [format_hours(h) for h in (240, 36, 6, 0)] == ["10 d", "1 d 12 h", "6 h", "0 h"]


def test_every_12h_takes_every_other_state_whose_rollout_fits():
    chosen = choose("every:12h", steps=2)
    # states 0, 2, 4 of each trajectory reach 2 steps ahead; 6 reaches only 1
    assert [(s.trajectory, s.step) for s in chosen] == [(0, 0), (0, 2), (0, 4), (1, 0), (1, 2), (1, 4)]
    assert [(s.trajectory, s.step) for s in choose("every:3", steps=4)] == [(0, 0), (0, 3), (1, 0), (1, 3)]


def test_init_count_spreads_its_choice_over_the_split():
    chosen = choose("every:6h", steps=1, count=3)
    # 14 candidates (steps 0..6 of each trajectory): the first, the middle and the last
    assert [(s.trajectory, s.step) for s in chosen] == [(0, 0), (0, 6), (1, 6)]
    with pytest.raises(ConfigError, match="--init-count 0"):
        choose(count=0)


def test_dates_are_found_in_the_data():
    chosen = choose("2017-01-01T06,2018-01-02T00", steps=3)
    assert [(s.trajectory, s.step) for s in chosen] == [(0, 1), (1, 4)]


def test_a_lead_beyond_the_data_says_how_far_it_reaches():
    with pytest.raises(
        DataError,
        match=r"--lead 2 d 6 h reaches beyond the data: no rollout in the test split is that long, the longest reaches "
        r"1 d 18 h \(7 model steps of 6 h\); choose a shorter --lead",
    ):
        choose(steps=9)


@pytest.mark.parametrize(
    ("init", "message"),
    [
        (
            "2016-01-01T00",
            "is not a state of the data in the test split, which holds states from 2017-01-01T00:00",
        ),
        ("2017-01-02T12", "reaches only 6 h into the data in the test split, short of --lead 12 h"),
        ("yesterday", "neither every:DURATION nor a date"),
        ("every:5h", "a positive multiple of the data's 6 h between states"),
    ],
)
def test_initial_times_the_data_cannot_give_are_refused_in_one_line(init, message):
    with pytest.raises((ConfigError, DataError), match=message):
        choose(init, steps=2)


def test_dates_need_data_that_has_dates():
    undated = [ForecastStart(s.trajectory, s.step) for s in STARTS]
    with pytest.raises(DataError, match="has no dates"):
        choose("2017-01-01T00", starts=undated)
