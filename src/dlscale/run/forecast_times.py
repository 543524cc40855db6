"""Which initial times and lead times ``dlscale forecast`` scores: ``--lead``, ``--init`` and ``--init-count``.

Durations are written with a unit, as people say them: ``10d``, ``36h``, ``90m`` (a bare number is refused:
model steps or days? the unit says). The lead must be a whole number of model steps (6 h on the tutorial's
data). Initial times:

* ``every:12h`` (the default: 00 and 12 UTC, as WeatherBench2 scores) or ``every:N`` model steps, from the first
  state of each trajectory;
* a comma-separated list of dates (``2018-01-01T00,2018-03-15T12``), where the data has dates;

keeping only those whose whole rollout lies inside their trajectory. ``--init-count N`` then keeps N of them,
evenly spread over the split (so a short check still samples every season).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dlscale.data.trajectories import ForecastStart
from dlscale.errors import ConfigError, DataError
from dlscale.run.durations import init_every_hours, lead_hours, parse_init_date
from dlscale.run.durations import parse_duration_hours as parse_duration_hours  # callers import it from here

DEFAULT_INIT = "every:12h"
DEFAULT_LEAD = "10d"


def lead_steps(lead: str, step_hours: float) -> int:
    """The number of model steps of ``step_hours`` that ``lead`` is; it must be a positive whole number."""
    hours = lead_hours(lead)
    steps = hours / step_hours
    if hours <= 0 or abs(steps - round(steps)) > 1e-9:
        raise ConfigError(
            f"--lead {lead}: expected a positive multiple of the model's step of {format_hours(step_hours)}"
        )
    return int(round(steps))


def format_hours(hours: float) -> str:
    """``240`` -> ``"10 d"``, ``36`` -> ``"1 d 12 h"``, ``6`` -> ``"6 h"``."""
    days, rest = divmod(round(hours * 60), 24 * 60)
    parts = [f"{days} d"] if days else []
    if rest or not parts:
        hours_left, minutes = divmod(rest, 60)
        parts.append(f"{hours_left} h" if not minutes else f"{hours_left} h {minutes} min")
    return " ".join(parts)


def choose_starts(
    candidates: Sequence[ForecastStart],
    reach: Sequence[int],
    steps: int,
    step_hours: float,
    hours_per_index: float,
    init: str = DEFAULT_INIT,
    init_count: int | None = None,
    where: str = "the split",
) -> list[ForecastStart]:
    """The initial times that ``init`` and ``init_count`` name among ``candidates`` (every state, with the model
    steps of truth ``reach`` after each), keeping those whose ``steps``-step rollout the data reaches.
    ``hours_per_index``: the hours between consecutive states of a trajectory."""
    if init_count is not None and init_count < 1:
        raise ConfigError(f"--init-count {init_count}: expected a number of initial times >= 1")
    longest = max(reach, default=0)
    if steps > longest:
        raise DataError(
            f"--lead {format_hours(steps * step_hours)} reaches beyond the data: no rollout {where} is that long, "
            f"the longest reaches {format_hours(longest * step_hours)} ({longest} model steps of "
            f"{format_hours(step_hours)}); choose a shorter --lead"
        )
    text = str(init).strip()
    every_hours = init_every_hours(text, step_hours)
    if every_hours is not None:
        stride = _stride_in_states(text, every_hours, hours_per_index)
        chosen = [
            start
            for start, ahead in zip(candidates, reach, strict=True)
            if start.step % stride == 0 and ahead >= steps
        ]
    else:
        chosen = _listed_dates(text, candidates, reach, steps, step_hours, where)
    if not chosen:
        raise DataError(f"--init {init}: no initial time {where} whose rollout of --lead reaches its end")
    if init_count is not None and init_count < len(chosen):
        picks = np.linspace(0, len(chosen) - 1, init_count).round().astype(int)
        chosen = [chosen[i] for i in sorted(set(picks.tolist()))]
    return chosen


def _stride_in_states(text: str, hours: float, hours_per_index: float) -> int:
    """``every:12h`` or ``every:N`` (model steps), ``hours`` apart, as a number of consecutive states."""
    stride = hours / hours_per_index
    if hours <= 0 or abs(stride - round(stride)) > 1e-9:
        raise ConfigError(
            f"--init {text}: expected every:DURATION (a positive multiple of the data's "
            f"{format_hours(hours_per_index)} between states) or every:N model steps"
        )
    return int(round(stride))


def _listed_dates(
    text: str,
    candidates: Sequence[ForecastStart],
    reach: Sequence[int],
    steps: int,
    step_hours: float,
    where: str,
) -> list[ForecastStart]:
    """The starts at the comma-separated dates of ``text``; each must be a state of the data whose rollout fits."""
    if any(start.time is None for start in candidates):
        raise DataError(
            f"--init {text}: the data {where} has no dates (its files are not named after their years), so "
            "initial times are chosen with --init every:DURATION and --init-count"
        )
    by_time = {start.time: (start, ahead) for start, ahead in zip(candidates, reach, strict=True)}
    chosen = []
    for item in (part.strip() for part in text.split(",") if part.strip()):
        date = parse_init_date(item)
        if date not in by_time:
            first, last = candidates[0].time, candidates[-1].time
            raise DataError(
                f"--init: {item} is not a state of the data {where}, which holds states from {first} to {last}"
            )
        start, ahead = by_time[date]
        if ahead < steps:
            raise DataError(
                f"--init: a forecast from {item} reaches only {format_hours(ahead * step_hours)} into the data "
                f"{where}, short of --lead {format_hours(steps * step_hours)}"
            )
        chosen.append(start)
    return chosen
