"""Learning-rate schedule and batch-size scaling rules, as plain functions of the step.

The schedule is a pure function of the global step, so resuming only needs the step count, and a plot or a
test can evaluate it anywhere without running an optimizer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def scaled_lr(lr: float, rule: str, global_batch_size: int, base_batch_size: int | None) -> float:
    """The peak LR for ``global_batch_size`` when ``lr`` is the LR at ``base_batch_size``.

    ``sqrt`` multiplies by sqrt(global/base) (the tutorials' rule for Adam), ``linear`` by global/base (Goyal et
    al.'s rule for SGD), ``none`` keeps ``lr``.
    """
    if rule not in ("none", "sqrt", "linear"):
        raise ValueError(f"unknown LR scaling rule {rule!r}")
    if rule == "none" or base_batch_size is None:
        return lr
    ratio = global_batch_size / base_batch_size
    if rule == "sqrt":
        return lr * math.sqrt(ratio)
    return lr * ratio


@dataclass(frozen=True)
class LRSchedule:
    """Linear warm-up for ``warmup`` steps, then cosine decay from ``peak_lr`` to ``end_lr`` at ``total_steps``.

    With ``kind="constant"`` the LR stays at ``peak_lr`` after the warm-up; with ``kind="step"`` (torch's StepLR,
    the MNIST tutorial's schedule) it is multiplied by ``gamma`` every ``step_size`` steps. Warm-up step ``s`` (0-based) uses
    ``peak_lr * (s + 1) / warmup``, so the first step already trains. The cosine spans the steps that are
    actually trained: it reaches ``end_lr`` at step ``total_steps``, right after the last trained step (as torch's
    CosineAnnealingLR with T_max = total steps, so no step is wasted at LR end_lr). The reference used
    T_max = ``num_iters``, which its whole-epoch rounding never reached.

    ``scale`` multiplies every LR: the divergence policy ``rollback`` lowers it after each rollback, and
    checkpoints keep it, so a resumed run goes on with the lowered LR.
    """

    peak_lr: float
    total_steps: int
    warmup: int = 0
    end_lr: float = 0.0
    kind: str = "cosine"
    step_size: int = 1  # kind "step": steps between two multiplications by gamma
    gamma: float = 1.0  # kind "step": the factor
    scale: float = 1.0  # multiplies the whole schedule (lowered by rollbacks after a divergence)

    def __post_init__(self) -> None:
        if self.kind not in ("cosine", "constant", "step"):
            raise ValueError(f"unknown LR schedule {self.kind!r} (cosine, constant or step)")
        if self.step_size < 1:
            raise ValueError(f"step_size must be >= 1, got {self.step_size}")

    def lr_at(self, step: int) -> float:
        """The LR used by optimizer step ``step`` (0-based)."""
        return self.scale * self._unscaled_lr_at(step)

    def _unscaled_lr_at(self, step: int) -> float:
        if step < self.warmup:
            return self.peak_lr * (step + 1) / self.warmup
        if self.kind == "constant":
            return self.peak_lr
        if self.kind == "step":
            return self.peak_lr * self.gamma ** ((step - self.warmup) // self.step_size)
        decay_steps = max(1, self.total_steps - self.warmup)
        progress = min(1.0, (step - self.warmup) / decay_steps)
        return self.end_lr + 0.5 * (self.peak_lr - self.end_lr) * (1.0 + math.cos(math.pi * progress))

    def state_dict(self) -> dict[str, float | int | str]:
        """The schedule's parameters (saved with checkpoints, so a resumed run can say what changed)."""
        state: dict[str, float | int | str] = {
            "peak_lr": self.peak_lr,
            "total_steps": self.total_steps,
            "warmup": self.warmup,
            "end_lr": self.end_lr,
            "kind": self.kind,
        }
        if self.kind == "step":  # only then do they matter (and older checkpoints compare equal)
            state.update(step_size=self.step_size, gamma=self.gamma)
        if self.scale != 1.0:  # likewise: only a run that rolled back has one
            state["scale"] = self.scale
        return state


@dataclass(frozen=True)
class EpochPlan:
    """How many epochs and steps a run trains, derived from the config and the data set size."""

    steps_per_epoch: int
    num_epochs: int
    total_steps: int
    explanation: str

    def steps_in_epoch(self, epoch: int) -> int:
        """Steps trained in epoch ``epoch`` (0-based): a full epoch, or fewer in a final partial epoch."""
        return max(0, min(self.steps_per_epoch, self.total_steps - epoch * self.steps_per_epoch))


def plan_epochs(
    num_samples: int, global_batch_size: int, num_iters: int | None, num_epochs: int | None
) -> EpochPlan:
    """Derive the run length as the reference does, without its corner cases.

    ``num_epochs`` wins when set. Otherwise the run trains ``num_iters // steps_per_epoch`` whole epochs, as the
    reference does (the remainder of ``num_iters`` is not trained). When ``num_iters`` is less than one epoch the
    run trains one partial epoch of ``num_iters`` steps instead of nothing.
    """
    steps_per_epoch = num_samples // global_batch_size
    if steps_per_epoch < 1:
        raise ValueError(
            f"the global batch size {global_batch_size} is larger than the {num_samples} training samples"
        )
    if num_epochs is not None:
        total = num_epochs * steps_per_epoch
        return EpochPlan(
            steps_per_epoch, num_epochs, total, f"{num_epochs} epochs of {steps_per_epoch} steps"
        )
    if num_iters is None:
        raise ValueError("set train.num_iters or train.num_epochs")
    if num_iters < steps_per_epoch:
        return EpochPlan(
            steps_per_epoch, 1, num_iters, f"num_iters {num_iters} is less than one epoch: 1 partial epoch"
        )
    epochs = num_iters // steps_per_epoch
    total = epochs * steps_per_epoch
    note = f"num_iters {num_iters} -> {epochs} epochs of {steps_per_epoch} steps = {total} steps"
    if total != num_iters:
        note += f" (whole epochs only, as in the reference: {num_iters - total} steps not trained)"
    return EpochPlan(steps_per_epoch, epochs, total, note)
