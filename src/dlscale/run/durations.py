"""The times of ``dlscale forecast``'s options as people write them: durations with a unit (``10d``, ``36h``,
``90m``), ``--init every:DURATION`` or ``every:N`` model steps, and ``--init`` dates.

Torch-free, so the command line checks them before torch is imported
(:mod:`dlscale.commands.trained_run_checks`) with the very functions the forecast uses
(:mod:`dlscale.run.forecast_times`) and that name its results directory (:mod:`dlscale.run.results_directory`).
"""

from __future__ import annotations

import re

import numpy as np

from dlscale.errors import ConfigError

_UNIT_MINUTES = {"d": 24 * 60, "h": 60, "m": 1}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([dhm])\s*$")
_EVERY = "every:"


def parse_duration_hours(text: str, option: str) -> float:
    """``"10d"`` -> 240.0, ``"36h"`` -> 36.0; ConfigError naming ``option`` otherwise (a bare number is refused:
    model steps or days? the unit says)."""
    match = _DURATION.match(str(text))
    if match is None:
        raise ConfigError(
            f"{option} {text!r}: expected a duration with its unit, e.g. 10d, 36h or 90m (d days, h hours, "
            "m minutes)"
        )
    return float(match.group(1)) * _UNIT_MINUTES[match.group(2)] / 60


def lead_hours(text: str) -> float:
    """``--lead`` in hours: a duration with its unit above 0 (a forecast of no lead scores nothing). Whatever is
    wrong with it (no unit, 0, a sign), the one message asks for both, so that a second try is not refused for
    the other reason (``--lead 0`` once asked for a unit, and ``--lead 0d`` then for a positive duration)."""
    positive = (
        f"--lead {text!r}: expected a positive duration with its unit, e.g. 10d, 36h or 90m (d days, h hours, "
        "m minutes)"
    )
    if _DURATION.match(str(text)) is None:
        raise ConfigError(positive)
    hours = parse_duration_hours(text, "--lead")
    if hours <= 0:
        raise ConfigError(positive)
    return hours


def init_every_hours(init: str, step_hours: float) -> float | None:
    """The hours between the initial times of ``--init every:VALUE``: VALUE a duration (``12h``) or a whole
    number of model steps of ``step_hours`` (``every:2``); None when ``init`` lists dates instead."""
    text = str(init).strip()
    if not text.startswith(_EVERY):
        return None
    value = text[len(_EVERY) :].strip()
    return int(value) * step_hours if value.isdigit() else parse_duration_hours(value, "--init every:")


def parse_init_date(item: str) -> np.datetime64:
    """One date of ``--init`` to the minute (``2018-01-01T00``, ``2018-01-01T12:00``); ConfigError otherwise."""
    try:
        return np.datetime64(item, "m")
    except ValueError:
        raise ConfigError(
            f"--init: {item!r} is neither every:DURATION nor a date such as 2018-01-01T00 or 2018-01-01T12:00"
        ) from None
