"""When a run writes checkpoints: every N epochs (and N steps), at the end, and when it is asked to stop.

Never from a diverged state: before each save the trainer's non-finite record is read, and the gathered
weights and optimizer state are checked for NaN and inf, so the last good checkpoint is never replaced. Under
``train.on_nonfinite: skip``, a save also waits after a skipped update until the run has trained normally for
``train.healthy_steps_before_save`` steps (finite but exploded weights look healthy to a NaN check); that holds
for the last save of a run too (its latest checkpoint then stays an earlier, sound one, and the log says so).
"""

from __future__ import annotations

import logging
import time

from dlscale.checkpoint.checkpoint_config import CheckpointConfig
from dlscale.checkpoint.directory import CheckpointDir
from dlscale.checkpoint.sharded_writer import ShardedCheckpointWriter
from dlscale.checkpoint.training_state import sharded_training_state, training_payload
from dlscale.parallel.shard_specs import is_dtensor
from dlscale.training.divergence.nonfinite import first_nonfinite
from dlscale.training.divergence.policy import Divergence
from dlscale.training.observer import EpochReport, Observer

log = logging.getLogger("dlscale.train")


class CheckpointObserver(Observer):
    """Writes the latest (and best) checkpoint at the configured points; never twice for one step.

    It runs on every rank, because gathering the shards of a model-parallel run is a collective; only the rank
    with ``write`` set (rank 0) writes the file. With a ``sharded`` writer every rank writes its own shards instead
    (``checkpoint.format: dcp``). ``save_at_start`` writes one before the first step of a fresh run, so that the
    divergence policy ``rollback`` always has a checkpoint to go back to.
    """

    def __init__(
        self,
        cfg: CheckpointConfig,
        checkpoints: CheckpointDir,
        write: bool = True,
        save_at_start: bool = False,
        sharded: ShardedCheckpointWriter | None = None,
    ):
        self.cfg = cfg
        self.checkpoints = checkpoints
        self.write = write
        self.save_at_start = save_at_start
        self.sharded = sharded
        self.saved_at_step: int | None = None

    def save(self, trainer, is_best: bool = False, why: str = "") -> None:
        if not trainer.guard.check():
            return  # diverged since the last check: the trainer stops or rolls back; the last good one stays
        if trainer.guard.in_trouble():
            if self.write:
                log.warning(
                    "Checkpoint at step %d not written: %d of the %d normal steps that must follow a skipped "
                    "update have trained (train.healthy_steps_before_save), so %s stays the one from before",
                    trainer.progress.global_step,
                    trainer.guard.healthy_steps_since_skip,
                    trainer.setup.policy.healthy_steps_before_save,
                    self.checkpoints.latest_path,
                )
            return
        is_best = is_best and self.cfg.keep_best
        best = " (also the best so far)" if is_best else ""
        step = trainer.progress.global_step
        if self.sharded is not None:
            self._save_shards(trainer, is_best, best + why)
            return
        payload = training_payload(trainer)
        nonfinite = first_nonfinite({"model": payload["model"], "optimizer": payload["optimizer"]})
        if trainer.guard.reject_state(nonfinite):
            return
        self.saved_at_step = step
        if not self.write:
            return
        path = self.checkpoints.save(payload, is_best=is_best)
        log.info("Saved checkpoint %s at step %d%s", path, step, best + why)

    def _save_shards(self, trainer, is_best: bool, why: str) -> None:
        tensors, header = sharded_training_state(trainer)
        local = {name: value.to_local() if is_dtensor(value) else value for name, value in tensors.items()}
        if trainer.guard.reject_state(first_nonfinite(local)):  # every rank checks its own shards
            return
        step = trainer.progress.global_step
        self.saved_at_step = step
        began = time.monotonic()
        directory = self.sharded.save(tensors, header, step, is_best)
        if not self.write:
            return
        blocked = time.monotonic() - began
        if self.sharded.asynchronous:
            log.info(
                "Checkpoint of step %d%s being written to %s in the background (the loop waited %.2f s)",
                step,
                why,
                directory,
                blocked,
            )
        else:
            log.info("Saved checkpoint %s at step %d%s (%.2f s)", directory, step, why, blocked)

    def on_train_start(self, trainer) -> None:
        self.saved_at_step = trainer.progress.global_step if trainer.progress.global_step else None
        # At step 0 also after a weights-only start: rolling back to that source would keep diverged optimizer state.
        if self.save_at_start and trainer.progress.global_step == 0:
            self.save(trainer, why=" (the initial weights: a divergence can roll back to them)")

    def on_step_end(self, trainer, loss) -> None:
        if self.sharded is not None:
            self.sharded.poll()  # publishes a background save that has finished
        every = self.cfg.save_every_steps
        p = trainer.progress
        at_epoch_end = p.step_in_epoch == trainer.setup.plan.steps_in_epoch(p.epoch)  # the epoch save follows
        if every and p.global_step % every == 0 and not at_epoch_end:
            self.save(trainer)

    def on_epoch_end(self, trainer, report: EpochReport) -> None:
        scheduled = report.is_last or report.epoch % self.cfg.save_every_epochs == 0
        if scheduled or (report.is_best and self.cfg.keep_best):
            self.save(trainer, is_best=report.is_best)

    def on_rollback(self, trainer, divergence: Divergence) -> None:
        self.saved_at_step = trainer.progress.global_step

    def on_train_end(self, trainer, outcome: str) -> None:
        if outcome == "stopped" and self.saved_at_step != trainer.progress.global_step:
            self.save(trainer, why=f" after {trainer.stop.reason}")
        if self.sharded is not None:
            self.sharded.close()  # the run ends only once its last checkpoint is complete
