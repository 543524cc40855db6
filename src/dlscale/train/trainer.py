"""The training loop (and the ``train:`` config section, which it owns).

One epoch: train steps from the saved position (each step: move the batch to the device, run
:class:`~dlscale.train.step.TrainStep`, count it, tell the observers, honour a stop request), then validate and
tell the observers again. Logging, progress, TensorBoard and checkpoints are observers
(:mod:`dlscale.train.observer`), so this file stays one screen of logic.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from dlscale.errors import InvalidValue
from dlscale.runtime.distributed import any_rank, average_across_ranks
from dlscale.runtime.signals import StopRequest
from dlscale.train.divergence import DivergenceGuard
from dlscale.train.evaluate import evaluate
from dlscale.train.observer import EpochReport, Observer

if TYPE_CHECKING:
    from dlscale.train.setup import TrainingSetup

log = logging.getLogger("dlscale.train")


@dataclass
class TrainConfig:
    """Run length, batch size, seed, and how each training step is executed."""

    global_batch_size: int = 16  # samples per optimizer step, summed over data-parallel ranks
    local_batch_size: int | None = None  # per-rank batch; when set, global_batch_size = local x ranks
    num_iters: int | None = 30000  # optimizer steps; the run trains num_iters // steps_per_epoch whole epochs
    num_epochs: int | None = None  # when set, wins over num_iters
    seed: int = 0  # model init, data order and dropout; the same seed and config give the same losses
    amp_mode: Literal["none", "fp16", "bf16"] = "none"  # mixed precision (autocast; fp16 adds a GradScaler)
    tf32: bool = (
        True  # TF32 tensor cores for fp32 matmuls and convolutions on GPUs (as in NVIDIA's containers)
    )
    enable_jit: bool = False  # compile the model with torch.compile
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = (
        "default"  # torch.compile's mode when enable_jit is on
    )
    cuda_graphs: bool = False  # capture forward + loss + backward (and the optimizer step) in a CUDA graph
    graph_warmup_steps: int = 20  # eager steps on a side stream before capture (the tutorial uses 20)
    deterministic: bool = False  # deterministic kernels on GPUs (slower); CPU runs are deterministic anyway
    # What a NaN or infinite loss/gradient does (README, "When things go wrong"): stop the run without saving
    # over the last good checkpoint; skip the update (a host sync every step); or roll back to that checkpoint
    # and lower the LR.
    on_nonfinite: Literal["stop", "skip", "rollback"] = "stop"
    nonfinite_check_every: int = 10  # steps between reads of the device's non-finite flag (one sync each)
    max_skipped_steps: int = 10  # skip: the run stops as diverged after more skipped updates than this
    max_rollbacks: int = 3  # rollback: the run stops as diverged when it diverges again after this many
    rollback_lr_factor: float = 0.5  # rollback: multiplies the LR (the whole schedule) at each rollback

    def __post_init__(self) -> None:
        for name in ("global_batch_size", "local_batch_size", "num_iters", "num_epochs"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InvalidValue(name, f"must be >= 1, got {value}")
        if self.num_iters is None and self.num_epochs is None:
            raise InvalidValue("num_iters", "set num_iters or num_epochs (both are null)")
        if self.graph_warmup_steps < 1:
            raise InvalidValue("graph_warmup_steps", f"must be >= 1, got {self.graph_warmup_steps}")
        if self.nonfinite_check_every < 1:
            raise InvalidValue("nonfinite_check_every", f"must be >= 1, got {self.nonfinite_check_every}")
        for name in ("max_skipped_steps", "max_rollbacks"):
            if getattr(self, name) < 0:
                raise InvalidValue(name, f"must be >= 0, got {getattr(self, name)}")
        if not (math.isfinite(self.rollback_lr_factor) and 0.0 < self.rollback_lr_factor <= 1.0):
            raise InvalidValue("rollback_lr_factor", f"must be in (0, 1], got {self.rollback_lr_factor}")
        if self.cuda_graphs and self.on_nonfinite != "stop":
            raise InvalidValue(
                "on_nonfinite",
                f"{self.on_nonfinite!r} cannot be combined with cuda_graphs: a captured step can neither decide "
                "on the host to skip its update nor take reloaded optimizer state; use 'stop' with graphs",
            )
        if self.cuda_graphs and self.enable_jit:
            raise InvalidValue(
                "cuda_graphs",
                "cannot be combined with enable_jit: a compiled model brings its own CUDA graphs, so use "
                "enable_jit with compile_mode: reduce-overhead instead (or switch one of them off)",
            )


class Trainer:
    """The epoch loop. Everything optional (logs, progress, TensorBoard, checkpoints) is an observer; what a NaN
    or inf does is the :class:`~dlscale.train.divergence.DivergenceGuard`'s business."""

    def __init__(self, setup: TrainingSetup, observers: list[Observer], stop: StopRequest | None = None):
        self.setup = setup
        self.progress = setup.progress
        self.observers = observers
        self.stop = stop or StopRequest()
        self.guard = DivergenceGuard(setup, self.progress)
        self._pending_loss: torch.Tensor | None = None  # device-side sum of losses not yet in progress
        self.last_fetch_seconds = 0.0  # host time the last batch took to arrive (for monitors)

    def fit(self) -> str:
        """Train until the plan is done ("finished"), a stop is requested ("stopped") or the loss diverges
        beyond what ``train.on_nonfinite`` recovers from ("diverged")."""
        plan, p, guard = self.setup.plan, self.progress, self.guard
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
        self.flush_loss()
        train_loss = p.epoch_loss_sum / max(p.step_in_epoch - p.epoch_skipped_steps, 1)
        if s.sync_buffers is not None:
            s.sync_buffers()  # every rank validates (and saves) the same BatchNorm statistics
        validation = evaluate(
            s.model, s.valid_loader, s.evaluator, s.device, s.predict, s.metric_sum, s.lockstep_validation
        )
        # A NaN never compares below the best, and must never *become* the best that later epochs cannot beat.
        is_best = math.isfinite(validation.loss) and (
            p.best_val_loss is None or validation.loss < p.best_val_loss
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
        utilization = s.utilization
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
        if not at_boundary and self.progress.global_step % self.setup.config.parallel.stop_check_every:
            return False
        if any_rank(self.stop.requested, self.setup.device):
            self.stop.request("a stop signal on another rank")
            return True
        return False

    def _add_to_epoch_loss(self, loss: torch.Tensor) -> None:
        """Sum on the device: reading each loss on the host would wait for every step."""
        self._pending_loss = loss.double() if self._pending_loss is None else self._pending_loss + loss

    def flush_loss(self) -> None:
        """Move the device-side loss sum into ``progress`` (one host sync; before checkpoints and epoch ends)."""
        if self._pending_loss is not None:
            self.progress.epoch_loss_sum += float(self._pending_loss)
            self._pending_loss = None

    def _notify(self, hook: str, *args: object) -> None:
        for observer in self.observers:
            getattr(observer, hook)(self, *args)
