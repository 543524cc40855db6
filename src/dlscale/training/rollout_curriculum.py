"""How many autoregressive steps a multi-step training sample rolls out, at each global step.

``train.rollout_steps`` (K) trains the model on its own rollouts: a sample is K + 1 consecutive states and
the loss is the mean over the K steps of the model fed its own prediction (:mod:`dlscale.training.rollout_loss`).
``train.rollout_schedule`` lets K grow during a run, the curriculum GraphCast and FourCastNet train with: a
text of ``AT=K`` pairs after a unit, e.g. ``"epoch 0=1, 2=2, 4=4"`` (K = 1 from epoch 0, 2 from epoch 2, 4
from epoch 4) or ``"step 0=1, 500=2, 1000=4"``. It starts at 0 and never goes back (a K that falls would
throw away what the longer rollouts taught, and the samples are read for the largest K anyway).

K is a function of the global step alone (epochs are turned into steps once the run's plan is known), so a
run resumed mid-curriculum trains every step with the K it would have had without the interruption.

The schedule's text is read by the ``train:`` section itself (:func:`dlscale.training.train_config.parse_rollout_schedule`), so a wrong one fails as the config
is read.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from dlscale.training.train_config import RolloutSchedule


@dataclass(frozen=True)
class RolloutCurriculum:
    """K at every global step: ``steps[i]`` from global step ``starts[i]`` on (``starts[0] == 0``)."""

    starts: tuple[int, ...] = (0,)
    steps: tuple[int, ...] = (1,)

    @classmethod
    def constant(cls, steps: int) -> RolloutCurriculum:
        return cls((0,), (steps,))

    @classmethod
    def from_schedule(cls, schedule: RolloutSchedule, steps_per_epoch: int) -> RolloutCurriculum:
        """``train.rollout_schedule``'s pairs with their starts in global steps."""
        return cls(schedule.starts_in_steps(steps_per_epoch), schedule.steps)

    @property
    def max_steps(self) -> int:
        return max(self.steps)

    def steps_at(self, global_step: int) -> int:
        """K for the optimizer step ``global_step`` (0-based)."""
        return self.steps[bisect.bisect_right(self.starts, global_step) - 1]

    def mean_steps(self, first: int, stop: int) -> float:
        """The mean K over global steps ``first`` .. ``stop - 1`` (K of ``first`` for an empty range)."""
        if stop <= first:
            return float(self.steps_at(first))
        total, at = 0, first
        while at < stop:
            index = bisect.bisect_right(self.starts, at) - 1
            end = min(stop, self.starts[index + 1]) if index + 1 < len(self.starts) else stop
            total += self.steps[index] * (end - at)
            at = end
        return total / (stop - first)

    def describe(self) -> str:
        if len(self.steps) == 1:
            return f"{self.steps[0]} rollout step{'s' if self.steps[0] != 1 else ''} per sample"
        pairs = ", ".join(
            f"K={k} from step {start}" for start, k in zip(self.starts, self.steps, strict=True)
        )
        return f"rollout curriculum: {pairs}"
