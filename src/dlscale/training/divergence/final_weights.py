"""Which weights a run's end-of-run report describes, when the divergence guard distrusts the last ones.

summary.json's ``final`` block, the skill lines and the validation figures describe one set of weights. For a
run that ends healthy, those are the weights at the end of training (the last epoch's validation). A run can
also end on weights that the guard distrusts (:mod:`dlscale.training.divergence.policy`): it diverged, or it ran to
its end under ``train.on_nonfinite: skip`` while its last updates were still being skipped (skipping leaves
out the updates that follow an explosion, not the one that caused it). Those weights were never saved, and a
report of them (a validation loss of 1.8e10) is of nothing the user has.

So such a run reports the weights it leaves behind: the last good checkpoint is loaded again and validated,
and the report says so (``final_weights`` in summary.json: its path, step and why, and the log). Without one
(no checkpoint yet, checkpoints disabled, or it does not load), the last epoch's validation stays the final
block, and ``final.weights_trusted`` says whether the guard trusted the weights it was run on (False: the
exploded state's numbers, kept for the record). A run stopped by a signal keeps its last epoch's report: it is
resumed, not finished, and a stop must not wait for a validation pass.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dlscale.errors import DlscaleError
from dlscale.runtime.distributed import any_rank
from dlscale.scoring.evaluator import EvalSummary, evaluate

if TYPE_CHECKING:
    from dlscale.training.observer import TrainerView

log = logging.getLogger("dlscale.train")


@dataclass(frozen=True)
class FinalWeights:
    """The weights the end-of-run report describes: ``description`` for summary.json's ``final_weights``
    and the log; ``trusted``: the guard trusted them; ``validation``: run again on them when they are not the
    last epoch's (then ``epoch`` and ``global_step`` are their position), else None (the last epoch's
    validation is theirs)."""

    description: str
    trusted: bool = True
    validation: EvalSummary | None = None
    epoch: int | None = None
    global_step: int | None = None


def end_of_training(global_step: int) -> FinalWeights:
    """The usual case: the run's own last weights."""
    return FinalWeights(f"the weights at the end of training (step {global_step})")


def settle_final_weights(trainer: TrainerView, outcome: str) -> FinalWeights:
    """Decide which weights the report of a run that ended with ``outcome`` describes (see the module
    docstring); loads and validates the last good checkpoint where the run ended on distrusted weights. Every
    rank calls it (the validation is collective), after training and before the observers hear of the end."""
    guard, progress = trainer.guard, trainer.progress
    if not (outcome == "diverged" or (outcome == "finished" and guard.in_trouble())):
        return end_of_training(progress.global_step)
    trouble = _trouble(trainer)
    recovery = guard.recovery
    target = recovery.last_good() if recovery is not None else None
    problem = None
    if target is not None:
        if trainer.setup.process.is_main:
            log.info("The run ended on weights the divergence guard distrusts: validating %s instead", target)
        try:
            with _quiet("dlscale.checkpoint"):
                restored = recovery.restore(target)
        except (DlscaleError, OSError, RuntimeError) as error:
            problem = f"{target} does not load: {error}"
        # Every rank validates, or none does: a rank that could not load must not leave the others waiting.
        if not any_rank(problem is not None, trainer.setup.device):
            v = trainer.setup.validation
            if v.sync_buffers is not None:
                v.sync_buffers()
            validation = evaluate(
                trainer.setup.model,
                v.loader,
                v.evaluator,
                trainer.setup.device,
                v.predict,
                v.metric_sum,
                v.lockstep,
            )
            return FinalWeights(
                f"{target} (step {restored.global_step}, the last good checkpoint before {trouble})",
                validation=validation,
                epoch=restored.epoch,
                global_step=restored.global_step,
            )
        problem = problem or f"{target} does not load on another rank"
    no_checkpoint = problem or "no checkpoint was saved before it"
    if not progress.history:
        return FinalWeights(
            f"none: the run has no validation, and {no_checkpoint} ({trouble})", trusted=False
        )
    row = progress.history[-1]
    where = f"epoch {row['epoch']}'s weights at step {row['global_step']}"
    if guard.distrusts(row["global_step"]):
        return FinalWeights(
            f"{where}, which the divergence guard distrusts: they come after {trouble} ({no_checkpoint})",
            trusted=False,
        )
    return FinalWeights(f"{where}, from before {trouble} ({no_checkpoint})")


def _trouble(trainer: TrainerView) -> str:
    """What made the run's last weights distrusted, in words: the skipped updates, the divergence, or both."""
    guard = trainer.guard
    began, divergence = guard.trouble_began, guard.divergence
    skipped = f"the updates skipped from step {began} on" if began is not None else None
    if divergence is not None:
        diverged = f"the divergence at step {divergence.step}"
        return f"{skipped}, which ended in {diverged}" if skipped else diverged
    healthy = trainer.setup.policy.healthy_steps_before_save
    return (
        f"{skipped} (the run ended before {healthy} steps had trained normally after the last one, "
        "train.healthy_steps_before_save)"
    )


@contextlib.contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    """Only errors from ``logger_name`` (and its children) meanwhile. Loading the checkpoint again repeats the
    warnings its resume gave at the start (a changed config, a changed schedule), which read at the end of a
    run as if something new had changed."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
