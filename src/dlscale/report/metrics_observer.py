"""The observer that feeds the run's loggers: a row per optimizer step and a row per epoch.

Per step: ``epoch``, ``train_loss`` (the global batch's loss), ``lr``, ``samples_per_second`` and the device's
peak memory (``peak_<allocated|reserved|host_rss>_gb``, the peak since the epoch's start). Per epoch: the
tutorials' TensorBoard tags (see :mod:`dlscale.report.tensorboard`) and the validation's metrics; the validation's
figures every ``log.image_every`` epochs and at the last.

No host sync of its own: each step's loss is copied into a buffer on the device, and the buffer is read (one
transfer for all its steps) only where the trainer waits for the device anyway: right before the divergence
guard reads its record (every ``train.nonfinite_check_every`` steps and at the end of every epoch), right after
a checkpoint was saved (its save read the loss: the observer comes after the checkpoint observer, so the rows
reach the files up to every checkpoint's step and a resume finds no gap), or, should all that be rarer, every
:data:`MAX_BUFFERED_STEPS` steps.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from dlscale.report.figures import figure_to_rgb, validation_figures
from dlscale.report.log_config import LogConfig
from dlscale.report.loggers import ImageLogger, Loggers, open_loggers
from dlscale.scoring.evaluator import EvalSummary
from dlscale.training.observer import EpochReport, Observer

MAX_BUFFERED_STEPS = 256  # at most one extra host sync per this many steps, when the guard reads less often


class StepLosses:
    """Losses of the steps not yet written, kept on the device: adding one queues a copy, never a sync."""

    def __init__(self, capacity: int = MAX_BUFFERED_STEPS):
        self.capacity = capacity
        self.count = 0
        self._values: torch.Tensor | None = None

    def add(self, loss: torch.Tensor) -> None:
        loss = loss.detach().reshape(())
        dtype = torch.float64 if loss.dtype == torch.float64 else torch.float32
        if self._values is None or self._values.device != loss.device or self._values.dtype != dtype:
            self._values = torch.empty(self.capacity, dtype=dtype, device=loss.device)
        # A copy, not a reference: a CUDA-graph step returns the same output tensor at every step.
        self._values[self.count].copy_(loss)
        self.count += 1

    @property
    def full(self) -> bool:
        return self.count >= self.capacity

    def read(self) -> list[float]:
        """The buffered losses on the host (one transfer, which waits for the device), and an empty buffer."""
        if self._values is None or self.count == 0:
            return []
        values = self._values[: self.count].tolist()
        self.count = 0
        return values

    def clear(self) -> None:
        self.count = 0


class MetricsReporter(Observer):
    """Logs every optimizer step and every epoch to ``<run>/metrics/*.csv`` and the backends of ``log.loggers``
    (see :mod:`dlscale.report.loggers`); rank 0 only."""

    def __init__(self, cfg: LogConfig, run_dir: Path):
        self.cfg = cfg
        self.run_dir = run_dir
        self.loggers: Loggers | None = None
        self.losses = StepLosses()
        self._pending: list[tuple[int, int, float, float]] = []  # (step, epoch, wall time, lr) of each loss
        self._window_started = time.perf_counter()

    def on_train_start(self, trainer) -> None:
        setup = trainer.setup
        self.loggers = open_loggers(
            self.cfg.loggers,
            self.run_dir,
            setup.record,
            trainer.progress.global_step,
            tensorboard=self.cfg.writes_tensorboard,
            runs=setup.record.logger_runs,  # the wandb/MLflow runs to continue; the ids opened go back in
        )
        self._drop_pending()

    def on_epoch_start(self, trainer) -> None:
        if not self._pending:
            self._window_started = time.perf_counter()  # the time between epochs (validation) is not training

    def on_step_end(self, trainer, loss: torch.Tensor) -> None:
        s, p = trainer.setup, trainer.progress
        self.losses.add(loss)
        # wall_time: when the host finished queueing the step (on a GPU, shortly before the step itself ends).
        self._pending.append((p.global_step, p.epoch + 1, time.time(), s.schedule.lr_at(p.global_step - 1)))
        epoch_done = p.step_in_epoch >= s.plan.steps_in_epoch(p.epoch)
        # The trainer syncs right after this hook at these steps (the divergence guard reads its record), so
        # reading the losses here costs no wait of its own.
        synced = trainer.guard.due() or epoch_done or trainer.loss_read_at_step == p.global_step
        if synced or self.losses.full:
            self._write_steps(trainer)

    def on_epoch_end(self, trainer, report: EpochReport) -> None:
        self._write_steps(trainer)
        if self.loggers is None:
            return
        step, now = trainer.progress.global_step, time.time()
        values = epoch_scalars(report)
        for logger in self.loggers.epochs:
            logger.log_scalars(step, values, now)
        image_loggers = [logger for logger in self.loggers.owned if isinstance(logger, ImageLogger)]
        if image_loggers and self.cfg.draws_images(report.epoch, report.is_last):
            figures = validation_figures(report.validation, f"epoch {report.epoch}, step {step}")
            for stem, figure in figures.items():
                rgb = figure_to_rgb(figure)
                for logger in image_loggers:
                    logger.log_image(image_tag(stem, report.validation), rgb, step)

    def on_rollback(self, trainer, divergence) -> None:
        # The steps after the restored position are trained again: write the buffered ones up to it, forget the
        # others, and take back the written ones after it where the backend can.
        restored = trainer.progress.global_step
        self._write_steps(trainer, up_to=restored)
        self._drop_pending()
        if self.loggers is not None:
            self.loggers.rewind(restored)

    def on_train_end(self, trainer, outcome: str) -> None:
        if self.loggers is None:
            return
        try:
            self._write_steps(trainer)
        finally:
            self.loggers.close()
            self.loggers = None

    def _write_steps(self, trainer, up_to: int | None = None) -> None:
        """Write the buffered steps (those up to step ``up_to`` only, when given) and empty the buffer."""
        if not self._pending:
            return
        losses = self.losses.read()  # the one host sync for the buffered steps
        now = time.perf_counter()
        pending, self._pending = self._pending, []
        # The rate over the steps since the last read: exact, as both ends of the window waited for the device.
        seconds = now - self._window_started
        rate = len(pending) * trainer.setup.global_batch_size / seconds if seconds > 0 else 0.0
        self._window_started = now
        if up_to is not None:
            kept = sum(1 for step, *_ in pending if step <= up_to)
            pending, losses = pending[:kept], losses[:kept]
        memory = {f"peak_{kind}_gb": gb for kind, gb in trainer.setup.device.memory_peaks().items()}
        if self.loggers is None:
            return
        for (step, epoch, wall_time, lr), loss in zip(pending, losses, strict=True):
            values = {"epoch": epoch, "train_loss": loss, "lr": lr, "samples_per_second": rate, **memory}
            for logger in self.loggers.steps:
                logger.log_scalars(step, values, wall_time)

    def _drop_pending(self) -> None:
        self.losses.clear()
        self._pending = []
        self._window_started = time.perf_counter()


def image_tag(stem: str, validation: EvalSummary) -> str:
    """The TensorBoard tag of a validation figure: the tutorial's ``Visualization, <channel>`` for the
    prediction, ``Visualization, class accuracy`` / ``confusion matrix`` for a classifier's."""
    if stem == "prediction_vs_target" and validation.example is not None:
        return f"Visualization, {validation.example.channel}"
    return f"Visualization, {stem.replace('_', ' ')}"


def epoch_scalars(report: EpochReport) -> dict[str, Any]:
    """An epoch's scalars under the tutorials' TensorBoard tags (and dlscale's: metrics, baseline, memory)."""
    validation = report.validation
    values: dict[str, Any] = {
        "epoch": report.epoch,
        "Loss/train": report.train_loss,
        "Loss/valid": validation.loss,
        "Learning Rate": report.learning_rate,
        "Avg iters per sec": report.iterations_per_second,
        "Avg samples per sec": report.samples_per_second,
    }
    for name, value in validation.scalars.items():
        values[f"{name}/valid"] = value
    if report.tflops_per_gpu is not None:
        # "per device": one GPU, or one CPU process on a CPU (the JSON's key keeps its historical name)
        values["Performance/TFLOP/s per device"] = report.tflops_per_gpu
    if report.mfu is not None:
        values["Performance/MFU"] = report.mfu
    for kind, gigabytes in report.peak_memory_gb.items():
        values[f"Memory/peak {kind} GB"] = gigabytes
    if validation.baseline_name:
        for name, value in validation.baseline_scalars.items():
            tag = "Loss" if name == "loss" else name
            values[f"{tag}/{validation.baseline_name}"] = value
    values["Time/train seconds"] = report.train_seconds
    values["Time/validation seconds"] = validation.seconds
    return values
