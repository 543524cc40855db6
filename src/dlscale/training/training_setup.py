"""The built pieces of a run that the training loop and its observers read.

The run layer (:mod:`dlscale.run.assembly`) builds one from a config; everything here is already complete when
the trainer receives it. The whole config stays in the run layer: the loop reads its own ``train:`` section
(``policy``), and observers receive their sections when they are made. What a checkpoint or a summary records
about the config comes from :class:`RunRecord`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from dlscale.data.loading.pipeline import BatchSource
from dlscale.data.loading.sampler import TrainingSampler
from dlscale.data.values.finite_check import FiniteCheckedBatches
from dlscale.parallel.mesh import ParallelMesh
from dlscale.runtime.device import Device
from dlscale.runtime.launch import ProcessInfo
from dlscale.runtime.nvtx import NO_MARKERS, StepMarkers
from dlscale.scoring.evaluator import Evaluator
from dlscale.training.precision import Precision
from dlscale.training.schedule import EpochPlan, LRSchedule
from dlscale.training.step import TrainStep
from dlscale.training.train_config import TrainConfig
from dlscale.training.train_progress import TrainProgress


@dataclass(frozen=True)
class RunRecord:
    """Which config a run was built from, as checkpoints, summaries and bench records write it down."""

    name: str  # the config section's name, e.g. "short"
    source: str  # the YAML file it came from
    workload: str
    overrides: tuple[str, ...]  # the command line's changes to the file
    resolved: dict[str, Any]  # every section's keys and values, defaults filled in (RunConfig.to_dict())
    weight_defining_keys: frozenset[str]  # dotted keys whose change gives saved weights another meaning
    # The wandb and MLflow runs this run logs into (logger name -> the backend's run id): filled from the
    # checkpoint it resumed from, set by the loggers when they open a run, and saved with every checkpoint, so
    # that a resumed or requeued run continues the same runs. Metadata: no number of the training reads it.
    logger_runs: dict[str, str] = field(default_factory=dict, compare=False)
    # Where a weights-only start took its weights from (dlscale.checkpoint.weights_start): set by that start,
    # taken from the run's own checkpoint when it continues, saved with every checkpoint, so that the same
    # command launched again continues the run. Metadata, like logger_runs.
    weights_start: dict[str, Any] = field(default_factory=dict, compare=False)


class FlopsRating(Protocol):
    """TFLOP/s and MFU of one GPU from its samples/s (:class:`dlscale.perf.flops.Utilization`)."""

    flops_per_sample: float

    def over_steps(self, first: int, stop: int) -> FlopsRating:
        """The rating of global steps ``first`` .. ``stop - 1`` (FLOPs per sample may change with the step)."""
        ...

    def tflops(self, samples_per_second: float) -> float: ...

    def mfu(self, samples_per_second: float) -> float | None: ...

    def describe(self) -> str: ...


# Batches on the device (see dlscale.data.loading.pipeline), checked for NaN/inf when data.check_finite is on.
Batches = BatchSource | FiniteCheckedBatches


@dataclass
class Validation:
    """How one validation pass runs on this rank (see :func:`dlscale.scoring.evaluator.evaluate`)."""

    loader: Batches
    evaluator: Evaluator
    # inputs -> fp32 predictions (compiled and autocast like training; never through DDP, whose forward would
    # broadcast buffers, a collective that a rank without validation samples would skip)
    predict: Callable[[torch.Tensor], torch.Tensor]
    metric_sum: Callable[[torch.Tensor], None] | None = None  # sum over the ranks that saw different samples
    lockstep: bool = False  # every rank runs the same number of forwards (FSDP2 gathers inside them)
    sync_buffers: Callable[[], None] | None = None  # every replica takes rank 0's buffers (BatchNorm) first


@dataclass
class TrainingSetup:
    """What the trainer's loop runs, and what its observers may read while it does."""

    record: RunRecord
    policy: TrainConfig  # the ``train:`` section: run length, execution, what a NaN or inf does
    run_dir: Path
    process: ProcessInfo
    device: Device
    mesh: ParallelMesh  # the dp x tp x cp layout and its groups
    model: torch.nn.Module  # this rank's part of the model (the module itself, not its DDP or compiled form)
    optimizer: torch.optim.Optimizer
    schedule: LRSchedule
    step: TrainStep
    precision: Precision
    plan: EpochPlan
    global_batch_size: int
    local_batch_size: int
    train_sampler: TrainingSampler
    train_loader: Batches
    validation: Validation
    stop_check_every: int = 10  # steps between the ranks' agreement on a stop signal
    # Collective timeouts in seconds: (at start-up and the end of the run, in the loop after its first step);
    # None leaves the process group's own
    collective_timeouts: tuple[float, float] | None = None
    utilization: FlopsRating | None = None  # None: FLOPs unknown
    markers: StepMarkers = NO_MARKERS  # named ranges (NVTX, profiler) around the loop's data, step and phases
    progress: TrainProgress = field(default_factory=TrainProgress)

    def use_lr_scale(self, scale: float) -> None:
        """Multiply the whole LR schedule by ``scale`` (the step reads the same schedule object)."""
        if scale != self.schedule.scale:
            self.schedule = dataclasses.replace(self.schedule, scale=scale)
            self.step.schedule = self.schedule
