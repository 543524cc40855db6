"""``dlscale plan`` for a workload that has no cost model of its own: its data-parallel layouts on N GPUs (DDP
and FSDP2 over all N), each estimated from one trace of its training step on fake tensors.

The ViT keeps :mod:`dlscale.perf.plan.layouts`, whose analytic model also covers tensor and context
parallelism; a workload gets tp/cp rows only with such a model. Here the model is whatever the workload builds: the trace
(:mod:`dlscale.perf.plan.traced_memory`) finds what its forward saves at the local batch, and
:mod:`dlscale.perf.plan.traced_layouts` adds the model's states for each layout. Nothing is allocated, so a model
far larger than this machine's memory is planned as quickly as a small one.

How close it comes: benchmarks/plan_vs_measured_workloads.py measures the peak of real training steps on the
CPU (U-Net, CNN, ResNet, heat2d; fp32 and bf16; serial, DDP and FSDP2 on 2 ranks) against this estimate:
:data:`MEASURED_RATIO_RANGE` (a unit test keeps it equal to the committed result). What it leaves out, the
gradients flowing back through the layers and the temporaries of the loss, the collectives and the optimizer,
is mostly what makes up the gap; on a GPU the caching allocator's reserve comes on top.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from dlscale.errors import InvalidValue
from dlscale.perf.plan.layout_cost import CUDA_ALLOWANCE_BYTES, GIB
from dlscale.perf.plan.traced_layouts import (
    DataParallelLayout,
    OptimizerMemory,
    TracedMemory,
    estimate_traced_memory,
    layout_problems,
    shard_elements,
)
from dlscale.perf.plan.traced_memory import LossFunction, TensorSpec, TracedStep, UnitsOf, trace_training_step

# Estimate / measured peak of a CPU training step, lowest and highest over the cases of
# benchmarks/results/2026-11-24-cpu-plan-vs-measured-workloads.json.
MEASURED_RATIO_RANGE = (0.71, 1.09)
MEASURED_RESULT = "benchmarks/results/2026-11-24-cpu-plan-vs-measured-workloads.md"


@dataclass(frozen=True)
class TracedRow:
    """One data-parallel layout: its memory per GPU, or why it cannot run."""

    layout: DataParallelLayout
    gpu_memory_bytes: int
    problems: tuple[str, ...] = ()
    local_batch: int | None = None
    stored_parameters: int | None = None  # parameters one GPU keeps (FSDP2: its shards)
    memory: TracedMemory | None = None

    @property
    def valid(self) -> bool:
        return not self.problems

    @property
    def fits(self) -> bool:
        return self.memory is not None and self.memory.total <= self.gpu_memory_bytes

    @property
    def reason(self) -> str:
        """Why it cannot run or does not fit ("" when it fits)."""
        if self.problems:
            return "; ".join(self.problems)
        if not self.fits:
            return (
                f"needs {self.memory.total / GIB:.2f} GB per GPU, more than the "
                f"{self.gpu_memory_bytes / GIB:.2f} GB there are"
            )
        return ""

    def to_dict(self) -> dict[str, Any]:
        """The row as plain JSON values (bytes as integers, GB rounded to 2 decimals)."""
        row: dict[str, Any] = {
            "layout": str(self.layout),
            "wrapper": self.layout.wrapper,
            "dp": self.layout.dp,
            "valid": self.valid,
            "fits": self.fits,
            "reason": self.reason,
            "local_batch": self.local_batch,
            "stored_parameters": self.stored_parameters,
        }
        if self.memory is not None:
            row.update(self.memory.json_fields())
        return row


@dataclass(frozen=True)
class TracedPlan:
    """The data-parallel layouts of ``gpus`` GPUs, the trace they come from, the one the config asks for."""

    gpus: int
    gpu_memory_bytes: int
    rows: list[TracedRow]
    step: TracedStep | None  # None when the batch cannot be split over the GPUs
    requested: str  # the config's parallel.data_parallel
    notes: list[str] = field(default_factory=list)

    @property
    def requested_row(self) -> TracedRow:
        """The row of the config's data_parallel (DataParallel is estimated as DDP; one GPU has one row)."""
        wrapper = "fsdp" if self.requested == "fsdp" else "ddp"
        return next((r for r in self.rows if r.layout.wrapper == wrapper), self.rows[0])


def data_parallel_layouts(gpus: int) -> list[DataParallelLayout]:
    """One GPU: the model alone; more: DDP and FSDP2 over all of them."""
    if gpus < 1:
        raise InvalidValue("gpus", f"must be a whole number of GPUs >= 1, got {gpus}")
    if gpus == 1:
        return [DataParallelLayout("none", 1)]
    return [DataParallelLayout("ddp", gpus), DataParallelLayout("fsdp", gpus)]


def plan_data_parallel(
    build_model: Callable[[], nn.Module],
    sample: tuple[TensorSpec, TensorSpec],
    loss: LossFunction,
    *,
    local_batch: int | None,
    gpus: int,
    gpu_memory_gb: float,
    amp_mode: str = "none",
    optimizer: OptimizerMemory | None = None,
    units_of: UnitsOf | None = None,
    gradient_as_bucket_view: bool = True,
    requested: str = "ddp",
    batch_problem: str = "",
    compiled: bool = False,
    members: int = 1,
) -> TracedPlan:
    """Estimate the data-parallel layouts of ``gpus`` GPUs with ``gpu_memory_gb`` (2^30 bytes) each.

    ``local_batch`` is each GPU's share of the batch (None, with ``batch_problem`` saying why, when the batch
    cannot be split over the GPUs); ``units_of`` names the FSDP2 units (the workload's ``fsdp_units``);
    ``compiled``: the run uses torch.compile (which the eager trace does not follow); ``members``: each sample
    runs as that many ensemble members in one batch (CRPS training), so the step is traced at ``members`` x
    ``local_batch`` samples.
    """
    if not (gpu_memory_gb > 0 and math.isfinite(gpu_memory_gb)):
        raise InvalidValue("gpu_memory_gb", f"must be a number of GB > 0, got {gpu_memory_gb}")
    capacity = int(gpu_memory_gb * GIB)
    optimizer = optimizer or OptimizerMemory()
    layouts = data_parallel_layouts(gpus)
    notes = []
    if compiled:
        notes.append(
            "train.enable_jit: torch.compile fuses operators and may save fewer tensors for backward than the "
            "eager trace counts, so the activations may be lower than estimated"
        )
    if requested == "dataparallel":
        notes.append(
            "data_parallel 'dataparallel' is estimated as DDP; nn.DataParallel's first GPU also gathers the "
            "outputs and so needs a little more"
        )
    if local_batch is None:
        problem = batch_problem or "the batch cannot be split over the GPUs"
        rows = [TracedRow(layout, capacity, (problem,)) for layout in layouts]
        return TracedPlan(gpus, capacity, rows, None, requested, notes)
    step = trace_training_step(build_model, sample, loss, local_batch * members, amp_mode, units_of)
    rows = []
    for layout in layouts:
        problems = tuple(layout_problems(step, layout))
        if problems:
            rows.append(TracedRow(layout, capacity, problems, local_batch))
            continue
        memory = estimate_traced_memory(
            step, optimizer, layout, gradient_as_bucket_view, CUDA_ALLOWANCE_BYTES
        )
        shards = layout.dp if layout.wrapper == "fsdp" else 1
        stored = sum(shard_elements(p.shape, shards) for p in step.parameters)
        rows.append(TracedRow(layout, capacity, (), local_batch, stored, memory))
    return TracedPlan(gpus, capacity, rows, step, requested, notes)
