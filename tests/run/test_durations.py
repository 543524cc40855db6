"""The forecast's time options as people write them (src/dlscale/run/durations.py): durations with a unit,
``--init every:...`` and ``--init`` dates; one parser for the early check and the forecast."""

from __future__ import annotations

import numpy as np
import pytest

from dlscale.errors import ConfigError
from dlscale.run.durations import init_every_hours, parse_duration_hours, parse_init_date


@pytest.mark.parametrize(("text", "hours"), [("10d", 240.0), ("36h", 36.0), ("90m", 1.5), (" 1.5d ", 36.0)])
def test_a_duration_with_its_unit_is_hours(text, hours):
    assert parse_duration_hours(text, "--lead") == hours


@pytest.mark.parametrize("text", ["10", "10 days", "h", "-3h", ""])
def test_a_duration_without_a_known_unit_names_the_option(text):
    with pytest.raises(ConfigError, match=r"--lead .*expected a duration with its unit"):
        parse_duration_hours(text, "--lead")


@pytest.mark.parametrize(
    ("init", "step_hours", "hours"),
    [("every:12h", 6.0, 12.0), ("every:2", 6.0, 12.0), ("every: 3 ", 24.0, 72.0), ("every:1d", 6.0, 24.0)],
)
def test_every_takes_a_duration_or_whole_model_steps(init, step_hours, hours):
    assert init_every_hours(init, step_hours) == hours


def test_a_list_of_dates_is_not_an_every_rule():
    assert init_every_hours("2018-01-01T00,2018-01-02T00", 6.0) is None


def test_every_with_a_bad_value_names_the_option():
    with pytest.raises(ConfigError, match="--init every:"):
        init_every_hours("every:often", 6.0)


def test_a_date_is_read_to_the_minute_and_a_bad_one_is_one_line():
    assert parse_init_date("2018-01-01T12") == np.datetime64("2018-01-01T12:00")
    assert parse_init_date("2018-01-01T12:30") == np.datetime64("2018-01-01T12:30")
    with pytest.raises(ConfigError, match=r"--init: 'yesterday' is neither every:DURATION nor a date"):
        parse_init_date("yesterday")
