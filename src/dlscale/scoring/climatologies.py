"""The climatology a forecast is scored against (the ACC's reference, and the climatology forecaster): one field
for every valid time, or a field per valid time.

* :class:`TimeMeanClimatology`: one (C, H, W) mean field over the training years (``stats/time_means.npy``
  for ERA5, a workload's ``Trajectories.climatology()``). It keeps the seasonal and daily cycles in every
  anomaly, so an ACC against it is not the field's.
* :class:`ValidTimeClimatology`: a field per valid time (``start.time + lead * step_hours``), from a lookup of
  datetime64 valid times to (N, C, H, W) fields: WeatherBench2's climatology by day of year and hour of day
  (:class:`dlscale.data.era5.climatology.reading.ClimatologyStore`), the ACC WeatherBench2 reports.

Each describes itself for ``scores.json`` (``description``: kind, path, years, window).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from dlscale.data.trajectories import ForecastStart

TIME_MEAN_KIND = "time_mean"


class Climatology(Protocol):
    """A forecast's reference fields in physical units."""

    description: dict[str, Any]  # for scores.json: at least "kind"

    def fields(self, starts: Sequence[ForecastStart], lead: int) -> torch.Tensor:
        """(N, C, H, W), or (C, H, W) when every valid time has the same: the climatology at each start's valid
        time ``lead`` model steps on, on the CPU."""
        ...


@dataclass
class TimeMeanClimatology:
    """One mean field for every valid time."""

    field: torch.Tensor  # (C, H, W)
    description: dict[str, Any]

    def fields(self, starts: Sequence[ForecastStart], lead: int) -> torch.Tensor:
        return self.field


class ValidTimeClimatology:
    """The climatology at each valid time, from ``lookup(valid times) -> (N, C, H, W)``."""

    def __init__(
        self,
        lookup: Callable[[np.ndarray], np.ndarray],
        step_hours: float,
        description: dict[str, Any],
    ):
        self._lookup = lookup
        self._step_minutes = int(round(step_hours * 60))
        self.description = description

    def valid_times(self, starts: Sequence[ForecastStart], lead: int) -> np.ndarray:
        """datetime64[m]: each start's time plus ``lead`` model steps (every start must have a date)."""
        times = np.asarray([start.time for start in starts]).astype("datetime64[m]")
        return times + np.timedelta64(lead * self._step_minutes, "m")

    def fields(self, starts: Sequence[ForecastStart], lead: int) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(self._lookup(self.valid_times(starts, lead))))
