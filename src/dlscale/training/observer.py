"""Observers: everything optional about a run (logging, progress, TensorBoard, checkpoints, profiling).

The trainer calls these hooks at fixed points and knows nothing else about what observers do, which keeps
the loop short and lets a feature be added without touching it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from dlscale.scoring.evaluator import EvalSummary

if TYPE_CHECKING:
    from dlscale.runtime.signals import StopRequest
    from dlscale.training.divergence.policy import Divergence, DivergenceGuard
    from dlscale.training.train_progress import TrainProgress
    from dlscale.training.training_setup import TrainingSetup


class TrainerView(Protocol):
    """What observers (and the checkpoint and final-report code) may read of the trainer that calls them.

    ``dlscale.training.trainer.Trainer`` is one. It is spelled out here so that observers need not import the
    trainer, which imports them: the loop and what it calls form no circle.
    """

    setup: TrainingSetup  # the model, optimizer, data, device and policy of the run
    progress: TrainProgress  # where the run is (epoch, step, losses so far)
    guard: DivergenceGuard  # the divergence guard: whether checks are due, what diverged
    stop: StopRequest  # a signal's stop request and its reason
    last_fetch_seconds: float  # host time the last batch took to arrive
    loss_read_at_step: int | None  # the global step at which the device-side loss sum was last read

    def flush_loss(self) -> None:
        """Move the device-side loss sum into ``progress`` (one host sync)."""


@dataclass
class EpochReport:
    """What an epoch did, handed to ``on_epoch_end``."""

    epoch: int  # 1-based, as the logs print it
    steps: int  # optimizer steps trained in this process during the epoch (fewer after a mid-epoch resume)
    train_seconds: float  # wall time of those steps (validation excluded, as in the tutorials)
    samples_per_second: float  # global samples per second over those steps
    iterations_per_second: float
    train_loss: float  # average step loss over the whole epoch
    learning_rate: float  # LR of the epoch's last step
    validation: EvalSummary
    is_best: bool  # lowest validation loss so far
    is_last: bool  # the run's final epoch
    tflops_per_gpu: float | None = None  # achieved model TFLOP/s of one GPU over the epoch's steps
    mfu: float | None = None  # model FLOPs utilization (0..1) of one GPU; None when the peak is unknown
    peak_memory_gb: dict[str, float] = field(default_factory=dict)  # see Device.memory_peaks

    def history_row(self, global_step: int) -> dict[str, Any]:
        """The epoch's results as plain values (kept in checkpoints, plotted and written to summary.json)."""
        validation = self.validation
        return {
            "epoch": self.epoch,
            "global_step": global_step,
            "train_loss": self.train_loss,
            "val_loss": validation.loss,
            **validation.headline_numbers(),
            "train_seconds": self.train_seconds,
            "samples_per_second": self.samples_per_second,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "peak_memory_gb": self.peak_memory_gb,
        }


class Observer:
    """Base class with no-op hooks; override the ones you need."""

    def on_train_start(self, trainer: TrainerView) -> None:
        """Before the first step (also when resuming)."""

    def on_epoch_start(self, trainer: TrainerView) -> None:
        """Before an epoch's first step."""

    def on_step_start(self, trainer: TrainerView) -> None:
        """Before each optimizer step, once its batch is on the device; ``trainer.progress.step_in_epoch``
        is the 0-based index of the step about to run."""

    def on_step_end(self, trainer: TrainerView, loss: torch.Tensor) -> None:
        """After each optimizer step; ``loss`` is a device tensor (calling ``.item()`` synchronizes)."""

    def on_epoch_end(self, trainer: TrainerView, report: EpochReport) -> None:
        """After validation; ``trainer.progress`` already points at the next epoch."""

    def on_rollback(self, trainer: TrainerView, divergence: Divergence) -> None:
        """After the divergence policy ``rollback`` reloaded the last good checkpoint: ``trainer.progress`` is
        back at its position (steps after it will be trained again) and the LR is lower."""

    def on_train_end(self, trainer: TrainerView, outcome: str) -> None:
        """``outcome`` is "finished", "stopped" after a signal (then the position is mid-run), or "diverged"
        (``trainer.guard.divergence`` says where; nothing may be saved then)."""
