"""Samples for multi-step training: an initial state and the K states after it, from a split's trajectories.

``train.rollout_steps`` > 1 (or a ``rollout_schedule``) trains on the model's own rollouts
(:mod:`dlscale.training.rollout_loss`), so a sample is K + 1 consecutive states of one trajectory (an ERA5 year
file: a rollout never crosses into the next file, as ``dlscale forecast``'s do not). The states come from the
workload's ``forecast_data(data_cfg, split)`` (:class:`dlscale.data.trajectories.Trajectories`), the same view
of the data a forecast rolls through, so a workload of one's own that can be forecast can also be trained this
way, and nothing in it changes.

Sample i: the i-th start, in the trajectories' time order, that has K model steps of truth after it:
``inputs`` (C, H, W) and ``targets`` (K, C, H, W), both normalized as the model reads them. A trajectory of T
states gives T - K * dt samples (``dt`` states per model step); a split where no trajectory holds K + 1 states
is an error naming K. A ``sample_limit`` attribute of the trajectories (ERA5's ``limit_nsamples``) keeps the
first that many samples.

Reading: ``read_batch`` reads each of the K + 1 leads of a batch with one call of the trajectories' ``states``,
so a batch is K + 1 reads, not (K + 1) x B.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils.data import Dataset

from dlscale.data.trajectories import ForecastStart, Trajectories
from dlscale.errors import ConfigError


class RolloutSamples(Dataset):
    """(initial state, the ``steps`` states after it) samples of one split (see the module docstring)."""

    def __init__(self, trajectories: Trajectories, steps: int, split: str):
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        self.trajectories = trajectories
        self.steps = steps
        self.split = split
        candidates = trajectories.starts()
        starts = [start for start in candidates if trajectories.reach(start) >= steps]
        if not starts:
            longest = max((trajectories.reach(start) for start in candidates), default=0)
            raise ConfigError(
                f"train.rollout_steps {steps}: no trajectory of the {split} split holds {steps + 1} consecutive "
                f"states ({trajectories.describe()}; the longest rollout it allows is {longest} steps); use a "
                "smaller K"
            )
        limit = getattr(trajectories, "sample_limit", None)
        self.starts: list[ForecastStart] = starts if limit is None else starts[:limit]

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = self.read_batch([index])
        return inputs[0], targets[0]

    def read_batch(
        self, indices: Sequence[int], out: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs (N, C, H, W) and targets (N, K, C, H, W), normalized; into ``out`` when given."""
        for index in indices:
            if not 0 <= index < len(self.starts):
                raise IndexError(f"sample index {index} out of range for {len(self.starts)} samples")
        starts = [self.starts[index] for index in indices]
        normalize, states = self.trajectories.normalize, self.trajectories.states
        inputs = normalize(states(starts, 0))
        targets = torch.stack([normalize(states(starts, lead)) for lead in range(1, self.steps + 1)], dim=1)
        if out is None:
            return inputs, targets
        out[0].copy_(inputs)
        out[1].copy_(targets)
        return out

    def __repr__(self) -> str:
        return (
            f"{len(self.starts):,} samples of {self.steps + 1} consecutive states from the {self.split} split "
            f"({self.trajectories.describe()})"
        )
