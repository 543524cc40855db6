"""What a rollout reads: a held-out split as trajectories of states along time (``dlscale forecast``).

A workload whose model's output can be fed back as its input offers its split in this form through the optional
``forecast_data(data_cfg, split)`` member (the ERA5 workload's is
:class:`dlscale.data.era5.trajectories.ERA5Trajectories`); :mod:`dlscale.training.rollout` rolls a model through it.
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
    """States of a held-out split along time, for rollouts (a workload's ``forecast_data``)."""

    channel_names: tuple[str, ...]  # the C channels a state holds, in order (model input == model output)
    units: tuple[str, ...]  # the unit of each channel ("" where unknown)
    long_names: tuple[str, ...]  # what each channel is ("10 m eastward wind")
    step_hours: float  # hours between a state and the model's next one (a model step)
    hours_per_state: float  # hours between consecutive states of a trajectory (a model step is a multiple)
    latitudes: np.ndarray  # (H,) degrees north of the grid's rows
    longitudes: np.ndarray  # (W,) degrees east of the grid's columns

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
        """(C, H, W) in physical units, the reference of the anomaly correlation; None when the data has none."""
        ...

    def describe(self) -> str:
        """One line: the split, its files and grid."""
        ...
