"""Which channels and lead times the forecast's report shows: the headline table, skill figure and maps.

Channels: the trajectories' own ``headline_channels`` when they name them (checked against their channels),
else WeatherBench2's z500, t850, t2m and u10 where the data has them, else every channel when there are at
most :data:`MAX_HEADLINE_CHANNELS`, else the first that many (a note says so).

Leads: a rollout that reaches two or more day marks (1, 3, 5, 7 and 10 days for the table) shows those
marks, and its last lead when it stops before the last mark (a 4-day rollout: 1, 3 and 4 days); a shorter
one shows an even spread of its leads ending at the last, at most as many as there are marks (``--lead 2d``
of 6-hour steps: 12, 24, 36 and 48 hours; ``--lead 12h``: 6 and 12 hours).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from dlscale.data.trajectories import Trajectories
from dlscale.errors import WorkloadError

WEATHERBENCH_CHANNELS = ("z500", "t850", "t2m", "u10")
MAX_HEADLINE_CHANNELS = 6  # a table and a figure row of more channels than this is no headline


@dataclass(frozen=True)
class HeadlineChannels:
    """The channels the report leads with, and why when they are not all the data has."""

    names: tuple[str, ...]
    note: str | None = None  # e.g. "the first 6 of 20 channels ..."; None when nothing was left out silently


def headline_channels(trajectories: Trajectories) -> HeadlineChannels:
    """The report's channels for ``trajectories`` (see the module's docstring); a ``headline_channels`` that
    names a channel the trajectories lack raises a WorkloadError naming it and the channels there are."""
    channels = tuple(trajectories.channel_names)
    named = getattr(trajectories, "headline_channels", None)
    if named is not None:
        return HeadlineChannels(_checked(named, channels, type(trajectories).__name__))
    weatherbench = tuple(name for name in WEATHERBENCH_CHANNELS if name in channels)
    if weatherbench:
        return HeadlineChannels(weatherbench)
    if len(channels) <= MAX_HEADLINE_CHANNELS:
        return HeadlineChannels(channels)
    first = channels[:MAX_HEADLINE_CHANNELS]
    return HeadlineChannels(
        first,
        f"the first {len(first)} of {len(channels)} channels; scores.json and scores.csv hold them all (the "
        "trajectories' headline_channels names others)",
    )


def _checked(named: object, channels: tuple[str, ...], owner: str) -> tuple[str, ...]:
    if isinstance(named, str) or not isinstance(named, Sequence) or not named:
        raise WorkloadError(
            f"{owner}.headline_channels is {named!r}: expected a non-empty list of channel names, some of "
            f"{', '.join(channels)}"
        )
    unknown = [str(name) for name in named if name not in channels]
    if unknown:
        raise WorkloadError(
            f"{owner}.headline_channels names {', '.join(map(repr, unknown))}, which the trajectories do not "
            f"have; their channels: {', '.join(channels)}"
        )
    return tuple(dict.fromkeys(str(name) for name in named))  # in the given order, each once


def lead_indices_at_days(days: Sequence[float], step_hours: float, steps: int) -> list[tuple[float, int]]:
    """(day, lead index) for each of ``days`` that is a whole number of model steps within the rollout."""
    found = []
    for day in days:
        index = day * 24 / step_hours
        if abs(index - round(index)) < 1e-9 and 1 <= round(index) <= steps:
            found.append((day, int(round(index))))
    return found


def report_leads(marks: Sequence[float], step_hours: float, steps: int) -> list[int]:
    """The lead indices (1..``steps``) to show, given the day ``marks`` of a long rollout (see the module's
    docstring), in increasing order."""
    reached = [lead for _, lead in lead_indices_at_days(marks, step_hours, steps)]
    if len(reached) >= 2:
        stops_short = steps * step_hours < max(marks) * 24
        return reached + [steps] if stops_short and reached[-1] != steps else reached
    stride = math.ceil(steps / len(marks))
    return list(range(steps, 0, -stride))[::-1]


def lead_text(hours: float) -> str:
    """A lead as the table prints it: ``"3d"`` for whole days, else ``"12h"`` (``"90m"`` below an hour)."""
    if hours % 24 == 0:
        return f"{hours / 24:g}d"
    return f"{hours:g}h" if hours >= 1 else f"{hours * 60:g}m"
