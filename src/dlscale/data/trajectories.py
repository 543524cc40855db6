"""What a rollout reads: a held-out split as trajectories of states along time (``dlscale forecast``).

A workload whose model's output can be fed back as its input offers its split in this form through the optional
``forecast_data(data_cfg, split)`` member (the ERA5 workload's is
:class:`dlscale.data.era5.trajectories.ERA5Trajectories`); :mod:`dlscale.scoring.rollout` rolls a model through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch


@dataclass(frozen=True)
class ForecastStart:
    """One initial time: the ``step``-th state of trajectory ``trajectory`` (an ERA5 year file), and its date
    when the data knows it."""

    trajectory: int
    step: int
    time: np.datetime64 | None = None

    def describe(self) -> str:
        return str(self.time) if self.time is not None else f"trajectory {self.trajectory}, step {self.step}"


@runtime_checkable
class Trajectories(Protocol):
    """States of a held-out split along time, for rollouts (a workload's ``forecast_data``).

    A state is one time's (C, H, W) field: the model reads it and predicts the next one in the same layout, so
    its output can be its next input. Two clocks: ``hours_per_state`` is how far apart the stored states of a
    trajectory are (6 h in the tutorial's ERA5 files), ``step_hours`` how far the model jumps in one step, a
    whole multiple of it (``data.dt`` states: 12 h for ``data.dt=2``). Leads count model steps (lead ``l`` is
    ``l * step_hours`` after the start, the state ``l * step_hours / hours_per_state`` indices on);
    ``--init every:12h`` must be a whole number of states apart. Data whose time is not in hours (a solver's
    frames) counts its unit as hours all the same: ``hours_per_state = 1``, and ``--lead 24h`` is 24 frames.

    The grid: ``latitudes`` (H,) and ``longitudes`` (W,) in degrees. The RMSE and ACC weigh each row by
    cos(latitude), so a grid that is not on the Earth gives ``latitudes = np.zeros(H)`` (every row weighs the
    same) and its positions, or ``np.arange(W)``, as ``longitudes``. A 1-D state (a line of W points) is
    (C, 1, W): ``latitudes = np.zeros(1)``. The maps are drawn in degrees when both are evenly spaced and
    distinct, else in row and column numbers.

    Optional: ``headline_channels``, a tuple of channel names, the ones the forecast's headline table, skill
    figure and maps lead with (the maps show the first). Without it: z500, t850, t2m and u10 where the data
    has them, else every channel when there are at most six, else the first six (the log says so).

    Optional: ``weatherbench2_names``, one entry per channel: ``(variable, level in hPa or None)`` as
    WeatherBench2's stores name the field (``("geopotential", 500)`` for z500), or None for a channel they do
    not hold. With it, ``dlscale forecast --write`` writes WeatherBench2's layout (``--names wb2``, the default);
    without it, every variable keeps its channel name.

    Optional: ``climatology_store``, the path of a climatology by day of year and hour of day in WeatherBench2's
    layout (:mod:`dlscale.data.era5.climatology`), or None. ``dlscale forecast`` scores the ACC and the
    climatology forecaster against it by default (``--climatology PATH`` names another; the variables are found
    by ``weatherbench2_names``, else by channel name, the grid by ``latitudes`` and ``longitudes``); without
    it, against ``climatology()``. A climatology by day of year needs the starts' dates (``ForecastStart.time``).
    Where it is None, an optional ``climatology_command`` (a str) names what builds one: the forecast's log says it
    beside the warning that an ACC against ``climatology()`` is not comparable with WeatherBench2's.
    """

    channel_names: tuple[str, ...]  # the C channels a state holds, in order (model input == model output)
    units: tuple[str, ...]  # the unit of each channel ("" where unknown)
    long_names: tuple[str, ...]  # what each channel is ("10 m eastward wind")
    step_hours: float  # hours between a state and the model's next one (a model step)
    hours_per_state: float  # hours between consecutive states of a trajectory (a model step is a multiple)
    latitudes: np.ndarray  # (H,) degrees north of the grid's rows (zeros for a grid not on the Earth)
    longitudes: np.ndarray  # (W,) degrees east of the grid's columns
    # Optional, and so not a member here (a protocol has no optional members; read with getattr):
    # headline_channels: tuple[str, ...]
    # weatherbench2_names: tuple[tuple[str, int | None] | None, ...]
    # climatology_store: pathlib.Path | None
    # climatology_command: str | None

    def starts(self) -> list[ForecastStart]:
        """Every state a rollout can start from, in time order."""
        ...

    def reach(self, start: ForecastStart) -> int:
        """How many model steps of truth the data holds after ``start``."""
        ...

    def states(self, starts: Sequence[ForecastStart], lead: int) -> torch.Tensor:
        """(N, C, H, W) float32 CPU tensor in physical units: the truth ``lead`` model steps after each start
        (lead 0: the initial states)."""
        ...

    def normalize(self, states: torch.Tensor) -> torch.Tensor:
        """Physical states -> what the model reads (a new tensor)."""
        ...

    def to_physical(self, normalized: torch.Tensor) -> torch.Tensor:
        """The model's output -> physical units (a new tensor)."""
        ...

    def climatology(self) -> torch.Tensor | None:
        """(C, H, W) in physical units: one mean field, the reference of the anomaly correlation where no
        climatology by day of year is used; None when the data has none."""
        ...

    def describe(self) -> str:
        """One line: the split, its files and grid."""
        ...
