"""Divergence: what a run does when its loss, gradients or weights become NaN or infinite.

A diverging run used to train on to the end with ``loss=nan``, write NaN weights over its good checkpoint and
call itself finished. Now the :class:`DivergenceGuard` watches every step without a host sync (see
:mod:`dlscale.training.divergence.nonfinite`), reads the record every ``train.nonfinite_check_every`` steps, at the end of
every epoch before validation and before every checkpoint (all ranks agree on the result), and refuses any
checkpoint whose weights or optimizer state are not finite, so the last good checkpoint is never replaced.
Then ``train.on_nonfinite`` decides:

``stop`` (default)
    the run ends as "diverged" (exit status 3) with a message naming the step, the rule, the scheduled LR and
    what to try (:mod:`dlscale.run.divergence_advice`).
``skip``
    a step whose loss or gradient norm is not finite (or whose loss spikes) leaves the weights and optimizer
    state as they were (as fp16's GradScaler does for overflows), up to ``train.max_skipped_steps``; deciding
    before each update costs a host sync every step. After a skipped step, checkpoints wait for
    ``train.healthy_steps_before_save`` normal steps in a row: a run that goes on to diverge keeps the
    checkpoint from before its trouble.
``rollback``
    the last good checkpoint (one is written at the start of a fresh run) is loaded again and the LR scaled by
    ``train.rollback_lr_factor``, up to ``train.max_rollbacks`` times. A batch that diverges again after a
    rollback is not retried: the same data at a lower LR failing twice points at the data, not the LR.

A finite explosion (a loss far above its recent median, :mod:`dlscale.training.divergence.loss_spike`) counts as
divergence in every policy, as NaN does. Every message names the rule that fired: a NaN or infinite loss, a
NaN or infinite gradient norm (with the finite loss), or a spike (with the loss, the median it was compared to
and the factor), under every policy; the skip policy's limit names the last skipped update's rule too.

Skipping cannot undo an update that was already applied: a too-high LR throws the weights out in a step whose
loss is still ordinary, and only the *next* losses spike. Those updates are skipped, but the weights stay the
exploded ones, so a skipping run may keep failing until ``train.max_skipped_steps`` runs out, or reach its end
within the limit. Such weights are *distrusted* (:meth:`DivergenceGuard.distrusts`): from the first skipped
update of the current trouble until ``train.healthy_steps_before_save`` steps have trained normally again. An
epoch validated on them is never the best, no checkpoint is written from them, and the end-of-run report of a
run that ends on them describes the last good checkpoint instead (:mod:`dlscale.training.divergence.final_weights`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from dlscale.runtime.distributed import any_rank
from dlscale.training.divergence.loss_spike import LossSpikeWatch
from dlscale.training.divergence.nonfinite import NonFiniteWatch
from dlscale.training.train_progress import TrainProgress

if TYPE_CHECKING:
    from dlscale.training.training_setup import TrainingSetup

log = logging.getLogger("dlscale.train")


@dataclass(frozen=True)
class Divergence:
    """What went wrong, where: the first non-finite step and its values, or the limit that ran out."""

    step: int  # global optimizer step (0-based) where it was found
    cause: str  # e.g. "the loss is nan", "the weights hold NaN or infinite values (model['head.weight'])"
    lr: float  # the scheduled LR of that step (warm-up or decay, batch-size rule and rollbacks applied)
    loss: float | None = None
    grad_norm: float | None = None
    lr_scale: float = 1.0  # the schedule's scale when it diverged (lowered by each rollback)
    suspect_data: bool = False  # the evidence points at the data (the same batch diverged twice; abrupt NaN)
    peak_lr: float | None = None  # the schedule's peak: optim.lr after the batch-size rule, before rollbacks

    def describe(self, lr_origin: str | None = None) -> str:
        """e.g. 'at step 41: the loss is nan (gradient norm inf) at scheduled lr 0.5'; ``lr_origin`` says how
        that LR came from the config's ``optim.lr`` (the run layer knows; see
        :func:`dlscale.run.divergence_advice.lr_origin`)."""
        extra = f" (gradient norm {self.grad_norm:.4g})" if self.grad_norm is not None else ""
        origin = f" ({lr_origin})" if lr_origin else ""
        return f"at step {self.step}: {self.cause}{extra} at scheduled lr {self.lr:.4g}{origin}"

    def to_dict(self) -> dict[str, Any]:
        """For summary.json (non-finite values become null there)."""
        return dataclasses.asdict(self)


class Recovery(Protocol):
    """Where ``rollback`` goes back to, and how (the run's checkpoints; see :mod:`dlscale.checkpoint`); also
    the weights the report of a run that ends on distrusted ones describes (:mod:`.final_weights`)."""

    def last_good(self) -> Path | None:
        """The checkpoint to roll back to, or None when there is none yet."""
        ...

    def restore(self, path: Path) -> TrainProgress:
        """Load weights, optimizer, schedule and RNG from ``path`` into the run; return its position."""
        ...


class DivergenceGuard:
    """The trainer's watch over NaN and inf, and ``train.on_nonfinite``'s decisions (see the module docstring).

    ``divergence`` is set once the run diverged beyond what the policy recovers from.
    """

    def __init__(self, setup: TrainingSetup, progress: TrainProgress, recovery: Recovery | None = None):
        self.setup = setup
        self.progress = progress
        self.recovery = recovery
        self.policy = setup.policy
        self.watch = NonFiniteWatch(setup.device.torch, self.policy.nonfinite_check_every)
        self.spikes = LossSpikeWatch(
            setup.device.torch, self.policy.loss_spike_factor, self.policy.loss_spike_window
        )
        self.divergence: Divergence | None = None
        self._checked_at_step: int | None = None
        self._healthy_since_skip: int | None = None  # steps trained normally since the last skipped one
        self._trouble_began: int | None = None  # the first skipped step (0-based) of the current trouble
        self._diverged_at: list[int] = []  # the steps this process has diverged at (rollback retries them)
        if self.policy.on_nonfinite == "skip" and self.spikes.enabled:
            # The step leaves a spiking update out, as it does a NaN one (it decides before the update).
            setup.step.spike_check = self.spikes.is_spike

    def record_step(self, loss: torch.Tensor) -> bool:
        """Note the step just trained (before ``progress`` counts it); False when its update was skipped, so its
        loss must not count in the epoch's average."""
        s, p, limit = self.setup, self.progress, self.policy.max_skipped_steps
        if not s.step.skipped:
            self.watch.record(loss, s.step.last_grad_norm, p.global_step)
            if self.policy.on_nonfinite == "skip":
                self.spikes.accept(loss)  # the step has already left out a spiking update
            else:
                self.spikes.record(loss, p.global_step)
            if self._healthy_since_skip is not None:
                self._healthy_since_skip += 1
                if not self.in_trouble():
                    # Trained normally for long enough: the weights are trusted again.
                    self._trouble_began = None
            return True
        p.skipped_steps += 1  # every rank skipped this step: the step agrees on it
        p.epoch_skipped_steps += 1
        if self._trouble_began is None:
            self._trouble_began = p.global_step
        self._healthy_since_skip = 0
        # On every rank: reading a sharded gradient norm is a collective.
        value, cause = float(loss), self._skip_cause(loss)
        if s.process.is_main:
            log.warning(
                "Step %d: %s: update skipped (%d of at most %d, train.max_skipped_steps)",
                p.global_step,
                cause,
                p.skipped_steps,
                limit,
            )
        if p.skipped_steps > limit and self.divergence is None:
            cause = (
                f"{p.skipped_steps} updates skipped for NaN, infinite or exploding values, more than {limit} "
                f"(train.max_skipped_steps); the last: {cause}"
            )
            self.divergence = dataclasses.replace(self._at(p.global_step, cause), loss=value)
        return False

    def _skip_cause(self, loss: torch.Tensor) -> str:
        """Which rule made the step just trained skip its update, from the global batch's values."""
        s = self.setup
        grad_norm = None
        # Under fp16 the step checks only the loss (the scaler handles gradient overflows itself).
        if s.step.last_grad_norm is not None and s.precision.scaler is None:
            norm = s.step.last_grad_norm
            grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        median = float(self.spikes.median()) if self.spikes.enabled else math.nan
        return skip_cause(
            float(loss), grad_norm, self.spikes, median, bool(getattr(s.step, "last_spike", False))
        )

    def due(self) -> bool:
        """Whether the record is read after the step just counted."""
        return self.watch.due(self.progress.global_step)

    def check(self) -> bool:
        """Whether training may go on: no NaN or inf seen since the last check.

        One host sync (and, with several ranks, one tiny all-reduce that makes every rank decide alike); every
        rank must call it at the same step. The checkpoint observer calls it before every save.
        """
        if self.divergence is not None:
            return False
        if self._checked_at_step == self.progress.global_step:
            return True
        self._checked_at_step = self.progress.global_step
        found, spike = self.watch.poll(), self.spikes.poll()
        # A spike first, also when its step's gradient norm overflowed: the exploded loss says more.
        if spike is not None and (found is None or spike[0] <= found[0]):
            step, loss, median = spike
            grad_norm = found[2] if found is not None and found[0] == step else None
            self.divergence = dataclasses.replace(
                self._at(step, self.spikes.describe(loss, median)), loss=loss, grad_norm=grad_norm
            )
        elif found is not None:
            step, loss, grad_norm = found
            cause = (
                loss_cause(loss, grad_norm) if loss is not None else "a NaN or infinite loss on another rank"
            )
            # NaN out of a run whose losses never spiked before: bad data is the likelier cause than the LR.
            abrupt = loss is not None and not math.isfinite(loss) and spike is None
            self.divergence = dataclasses.replace(
                self._at(step, cause), loss=loss, grad_norm=grad_norm, suspect_data=abrupt
            )
        return self.divergence is None

    def distrusts(self, global_step: int) -> bool:
        """Whether the weights after ``global_step`` steps are ones the guard distrusts: from the first step
        of the current trouble (a skipped update whose healthy steps have not yet followed, or the
        divergence)."""
        began = self._trouble_began
        if began is None and self.divergence is not None:
            began = self.divergence.step
        return began is not None and global_step >= began

    @property
    def trouble_began(self) -> int | None:
        """The first skipped step (0-based) of the current trouble; None while the run is healthy."""
        return self._trouble_began

    @property
    def healthy_steps_since_skip(self) -> int:
        """Steps trained normally since the last skipped update (0 before any)."""
        return self._healthy_since_skip or 0

    def in_trouble(self) -> bool:
        """Whether a checkpoint must wait: under ``skip``, fewer than ``train.healthy_steps_before_save`` steps
        have trained normally since the last skipped one (their weights may be the explosion's)."""
        return (
            self._healthy_since_skip is not None
            and self._healthy_since_skip < self.policy.healthy_steps_before_save
        )

    def reject_state(self, nonfinite: str | None) -> bool:
        """True (and diverged) when a checkpoint's state holds NaN or inf on any rank; every rank calls this
        before a save, ``nonfinite`` naming its first bad tensor or None."""
        if not any_rank(nonfinite is not None, self.setup.device):
            return False
        cause = f"the weights hold NaN or infinite values ({nonfinite or 'on another rank'})"
        self.divergence = self._at(max(self.progress.global_step - 1, 0), cause)
        return True

    def roll_back(self) -> Divergence | None:
        """Under ``rollback``, go back to the last good checkpoint with a lower LR and return the divergence
        recovered from; None when the policy is another one or its rollbacks are used up (the run is diverged)."""
        s, p, policy, divergence = self.setup, self.progress, self.policy, self.divergence
        if policy.on_nonfinite != "rollback" or divergence is None:
            return None
        target = self.recovery.last_good() if self.recovery is not None else None
        if divergence.step in self._diverged_at:
            # The restored position re-reads the same batches: the same step failing at a lower LR is the data.
            self.divergence = dataclasses.replace(
                divergence,
                cause=f"{divergence.cause}; the same batch (step {divergence.step}) diverged again after a "
                "rollback with a lower LR, so no more rollbacks are spent on it",
                suspect_data=True,
            )
            return None
        self._diverged_at.append(divergence.step)
        if p.rollbacks >= policy.max_rollbacks or target is None:
            why = (
                f"after {p.rollbacks} rollbacks (train.max_rollbacks {policy.max_rollbacks})"
                if target is not None
                else "and there is no checkpoint to roll back to"
            )
            # Failures at several batches, each after a lower LR, do not point at one bad sample.
            several = len(set(self._diverged_at)) > 1
            self.divergence = dataclasses.replace(
                divergence,
                cause=f"{divergence.cause}, {why}",
                suspect_data=divergence.suspect_data and not several,
            )
            return None
        rollbacks, scale = p.rollbacks + 1, s.schedule.scale * policy.rollback_lr_factor
        restored = self.recovery.restore(target)
        for field in dataclasses.fields(restored):  # in place: the trainer and observers hold this object
            setattr(p, field.name, getattr(restored, field.name))
        p.rollbacks = rollbacks
        s.use_lr_scale(scale)
        self.divergence, self._checked_at_step = None, None
        self.watch.reset()
        self.spikes.reset()
        self._healthy_since_skip, self._trouble_began = None, None
        if s.process.is_main:
            log.warning(
                "Diverged %s. Rolled back to %s (global step %d) with the LR scaled by %.3g (rollback %d of at "
                "most %d)",
                divergence.describe(),
                target,
                p.global_step,
                scale,
                rollbacks,
                policy.max_rollbacks,
            )
        return divergence

    def _at(self, step: int, cause: str) -> Divergence:
        schedule = self.setup.schedule
        return Divergence(
            step, cause, schedule.lr_at(step), lr_scale=schedule.scale, peak_lr=schedule.peak_lr
        )


def loss_cause(loss: float | None, grad_norm: float | None) -> str:
    """Which value was not finite, in words."""
    if loss is not None and not math.isfinite(loss):
        return f"the loss is {loss}"
    if grad_norm is not None and not math.isfinite(grad_norm):
        return f"the gradient norm is {grad_norm}" + (
            f" (the loss was {loss:.4g})" if loss is not None else ""
        )
    return "a loss or gradient was NaN or infinite"


def skip_cause(
    loss: float, grad_norm: float | None, spikes: LossSpikeWatch, median: float, spiked_here: bool
) -> str:
    """Which rule made a step skip its update, in words: a NaN or infinite loss, a spike (``loss`` above
    ``spikes.factor`` x ``median``, named first: an exploded loss often overflows its gradients too), or a NaN
    or infinite gradient norm. ``loss`` is the global batch's; ``spiked_here``: this rank's own loss was a
    spike (the step decides on each rank's loss, and skips when any rank objects)."""
    bad_norm = grad_norm is not None and not math.isfinite(grad_norm)
    if not math.isfinite(loss):
        return loss_cause(loss, grad_norm)
    if spikes.enabled and loss > spikes.factor * abs(median):
        return spikes.describe(loss, median) + (f", and the gradient norm is {grad_norm}" if bad_norm else "")
    bar = (
        f"below {spikes.factor:g}x the median {median:.4g}"
        if spikes.enabled
        else "no spike: the check is off"
    )
    if bad_norm:
        return f"the gradient norm is {grad_norm} (the loss {loss:.4g} is finite, {bar})"
    if spiked_here:
        return (
            f"this rank's loss was more than {spikes.factor:g}x the median {median:.4g} of the losses before "
            f"it (a finite explosion in part of the global batch, whose loss {loss:.4g} is {bar})"
        )
    return (
        f"another rank's loss was a spike, or NaN or infinite (the global batch's loss {loss:.4g} is finite, "
        f"{bar})"
    )
