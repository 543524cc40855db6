"""The training loop (and the ``train:`` config section, which it owns).

One epoch: train steps from the saved position (each step: move the batch to the device, run
:class:`~dlscale.training.step.TrainStep`, count it, tell the observers, honour a stop request), then validate and
tell the observers again. Logging, progress, TensorBoard and checkpoints are observers
(:mod:`dlscale.training.observer`), so this file stays one screen of logic.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator

import torch

from dlscale.runtime.distributed import (
    any_rank,
    average_across_ranks,
    dump_flight_recorder_into,
    note_position,
    set_collective_timeout,
)
from dlscale.runtime.signals import StopRequest
from dlscale.scoring.evaluator import evaluate
from dlscale.training.divergence.final_weights import FinalWeights, settle_final_weights
from dlscale.training.divergence.policy import DivergenceGuard, Recovery
from dlscale.training.observer import EpochReport, Observer
from dlscale.training.training_setup import TrainingSetup

log = logging.getLogger("dlscale.train")


class Trainer:
    """The epoch loop. Everything optional (logs, progress, TensorBoard, checkpoints) is an observer; what a NaN
    or inf does is the :class:`~dlscale.training.divergence.policy.DivergenceGuard`'s business."""

    def __init__(
        self,
        setup: TrainingSetup,
        observers: list[Observer],
        stop: StopRequest | None = None,
        recovery: Recovery | None = None,
    ):
        """``recovery`` brings back the last good state for ``train.on_nonfinite: rollback`` (the run layer
        passes the run's checkpoints: :class:`dlscale.checkpoint.training_state.CheckpointRecovery`)."""
        self.setup = setup
        self.progress = setup.progress
        self.observers = observers
        self.stop = stop or StopRequest()
        self.guard = DivergenceGuard(setup, self.progress, recovery)
        self._pending_loss: torch.Tensor | None = None  # device-side sum of losses not yet in progress
        self.last_fetch_seconds = 0.0  # host time the last batch took to arrive (for monitors)
        # The global step at which flush_loss last waited for the device (a checkpoint's save, an epoch's end):
        # an observer after the checkpoint observer may read device values then at no extra cost.
        self.loss_read_at_step: int | None = None
        self._short_timeout: float | None = None  # the loop's collective timeout, once the first step is done
        # Which weights the end-of-run report describes (set before on_train_end; None: the end of
        # training's).
        self.final_weights: FinalWeights | None = None

    def fit(self) -> str:
        """Train until the plan is done ("finished"), a stop is requested ("stopped") or the loss diverges
        beyond what ``train.on_nonfinite`` recovers from ("diverged").

        Before the observers hear of the end, ``final_weights`` says which weights the end-of-run report
        describes; a run that ends on weights the divergence guard distrusts has the last good checkpoint
        loaded into the model then (:mod:`dlscale.training.divergence.final_weights`)."""
        plan, p, guard = self.setup.plan, self.progress, self.guard
        if self.setup.process.world_size > 1:
            dump_flight_recorder_into(self.setup.run_dir / "hang", self.setup.device.is_gpu)
        self._notify("on_train_start")
        while p.epoch < plan.num_epochs and not self._stop_agreed(at_boundary=True):
            self._notify("on_epoch_start")
            steps, seconds = self._train_epoch()
            if guard.divergence is None:
                if self._stop_agreed(at_boundary=True):
                    break
                self._finish_epoch(steps, seconds)
            if guard.divergence is not None:
                recovered = guard.roll_back()
                if recovered is None:
                    break
                self._pending_loss = None  # the restored position has its own sum
                self._notify("on_rollback", recovered)
        if not p.completed:
            guard.check()  # a stopped run saves its position next: not if it diverged since the last check
        outcome = "diverged" if guard.divergence else "finished" if p.completed else "stopped"
        self._collective_timeout(at_start_up=True)  # the last save and summary: the others wait for rank 0
        self.final_weights = settle_final_weights(self, outcome)
        self._notify("on_train_end", outcome)
        return outcome

    def _train_epoch(self) -> tuple[int, float]:
        """Train the current epoch from ``progress.step_in_epoch``; return (steps trained, seconds)."""
        s, p = self.setup, self.progress
        last_step = s.plan.steps_in_epoch(p.epoch)
        s.train_sampler.set_epoch(p.epoch, start_step=p.step_in_epoch)
        s.model.train()
        s.device.reset_peak_memory()
        s.device.synchronize()
        started, steps = time.perf_counter(), 0
        if p.step_in_epoch < last_step:
            for batch in self._fetched_batches():
                note_position(f"step {p.global_step + 1}")
                self._notify("on_step_start")
                with s.markers.range(f"step {p.global_step}"):
                    loss = s.step(s.device.move(batch[0]), s.device.move(batch[1]), p.global_step)
                    loss = average_across_ranks(loss)  # the logged loss is the global batch's
                if self.guard.record_step(loss):  # a skipped update's loss is not in the epoch's average
                    self._add_to_epoch_loss(loss)
                p.step_in_epoch += 1
                p.global_step += 1
                p.samples_seen += s.global_batch_size
                steps += 1
                if steps == 1 and self._short_timeout is None:  # start-up (compilation, warm-up) is over
                    self._short_timeout = self._collective_timeout(at_start_up=False)
                self._notify("on_step_end", loss)
                if self.guard.due() or p.step_in_epoch >= last_step:
                    self.guard.check()  # always at the epoch's end: validation and its save need sound weights
                if self.guard.divergence is not None or p.step_in_epoch >= last_step or self._stop_agreed():
                    break
        s.device.synchronize()
        return steps, time.perf_counter() - started

    def _fetched_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This pass's batches, each fetched inside a "data" range and timed (monitors read the wait).

        Leaving the loop early closes this generator, which drops the pass and so stops its reader threads
        or worker processes at once.
        """
        batches = iter(self.setup.train_loader)
        while True:
            started = time.perf_counter()
            with self.setup.markers.range("data"):
                batch = next(batches, None)
            self.last_fetch_seconds = time.perf_counter() - started
            if batch is None:
                return
            yield batch

    def _finish_epoch(self, steps: int, seconds: float) -> None:
        """Validate, update the position and the history, and tell the observers."""
        s, p = self.setup, self.progress
        note_position(f"validation after epoch {p.epoch + 1}")
        self.flush_loss()
        train_loss = p.epoch_loss_sum / max(p.step_in_epoch - p.epoch_skipped_steps, 1)
        v = s.validation
        if v.sync_buffers is not None:
            v.sync_buffers()  # every rank validates (and saves) the same BatchNorm statistics
        validation = evaluate(s.model, v.loader, v.evaluator, s.device, v.predict, v.metric_sum, v.lockstep)
        # A NaN never compares below the best, and must never *become* the best that later epochs cannot beat;
        # nor may weights the divergence guard distrusts (thrown out by an update that skipping cannot undo).
        is_best = (
            math.isfinite(validation.loss)
            and not self.guard.distrusts(p.global_step)
            and (p.best_val_loss is None or validation.loss < p.best_val_loss)
        )
        if not math.isfinite(validation.loss) and s.process.is_main:
            log.warning(
                "Epoch %d: the validation loss is %s although training is finite: the validation data may "
                "hold NaN or infinite values (--set data.check_finite=true names them); this epoch cannot be "
                "the best",
                p.epoch + 1,
                validation.loss,
            )
        if is_best:
            p.best_val_loss, p.best_epoch = validation.loss, p.epoch + 1
        samples_per_second = steps * s.global_batch_size / seconds if steps and seconds > 0 else 0.0
        per_gpu = samples_per_second / s.process.world_size
        utilization = (
            s.utilization.over_steps(p.global_step - steps, p.global_step) if s.utilization else None
        )
        report = EpochReport(
            epoch=p.epoch + 1,
            steps=steps,
            train_seconds=seconds,
            samples_per_second=samples_per_second,
            iterations_per_second=steps / seconds if steps and seconds > 0 else 0.0,
            train_loss=train_loss,
            learning_rate=s.schedule.lr_at(max(p.global_step - 1, 0)),
            validation=validation,
            is_best=is_best,
            is_last=p.epoch + 1 == s.plan.num_epochs,
            tflops_per_gpu=utilization.tflops(per_gpu) if utilization and steps else None,
            mfu=utilization.mfu(per_gpu) if utilization and steps else None,
            peak_memory_gb=s.device.memory_peaks(),
        )
        p.history.append(report.history_row(p.global_step))
        p.epoch += 1
        p.step_in_epoch = 0
        p.epoch_loss_sum = 0.0
        p.epoch_skipped_steps = 0
        p.completed = p.epoch >= s.plan.num_epochs
        self._notify("on_epoch_end", report)

    def _stop_agreed(self, at_boundary: bool = False) -> bool:
        """Whether to stop now. Ranks get a signal at different moments, so they agree first: at epoch
        boundaries and every ``stop_check_every`` steps (a rank stopping on its own would leave the others
        waiting in their next all-reduce)."""
        if self.setup.process.world_size <= 1:
            return self.stop.requested
        if not at_boundary and self.progress.global_step % self.setup.stop_check_every:
            return False
        if any_rank(self.stop.requested, self.setup.device):
            self.stop.request("a stop signal on another rank")
            return True
        return False

    def _collective_timeout(self, at_start_up: bool) -> float | None:
        """Give the process groups the start-up timeout (``parallel.timeout_s``: start-up, the end of the run) or
        the loop's (``parallel.train_timeout_s``); the seconds, None in a single-process run or without them."""
        if self.setup.collective_timeouts is None:
            return None
        seconds = self.setup.collective_timeouts[0 if at_start_up else 1]
        return seconds if set_collective_timeout(seconds) else None

    def _add_to_epoch_loss(self, loss: torch.Tensor) -> None:
        """Sum on the device: reading each loss on the host would wait for every step."""
        self._pending_loss = loss.double() if self._pending_loss is None else self._pending_loss + loss

    def flush_loss(self) -> None:
        """Move the device-side loss sum into ``progress`` (one host sync; before checkpoints and epoch ends)."""
        if self._pending_loss is not None:
            self.progress.epoch_loss_sum += float(self._pending_loss)
            self._pending_loss = None
            self.loss_read_at_step = self.progress.global_step

    def _notify(self, hook: str, *args: object) -> None:
        for observer in self.observers:
            getattr(observer, hook)(self, *args)
