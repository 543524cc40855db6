"""Durations written with a unit, as people say them (``10d``, ``36h``, ``90m``), for ``dlscale forecast``'s options.

Torch-free, so the command line checks them before torch is imported
(:mod:`dlscale.commands.trained_run_checks`) with the very function the forecast uses
(:mod:`dlscale.run.forecast_times`).
"""

from __future__ import annotations

import re

from dlscale.errors import ConfigError

_UNIT_MINUTES = {"d": 24 * 60, "h": 60, "m": 1}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([dhm])\s*$")


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
