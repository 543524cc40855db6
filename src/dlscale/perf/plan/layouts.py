"""Every dp x tp x cp layout of N GPUs estimated and ranked (what ``dlscale plan`` prints), and the check of
the estimate against the NERSC tutorial's measurements.

The memory and communication of one layout come from :mod:`dlscale.perf.plan.layout_cost`, whose docstring holds
the parallel model and the formulas.

Checked against the NERSC tutorial (A100 80 GB, config ``mp``, local batch 16, fp16, fused Adam)
------------------------------------------------------------------------------------------------
The tutorial reads about 45 GB with pynvml after the forward pass at tp=1, and about 33 GB at tp=4
(:func:`tutorial_comparisons` recomputes this). The estimate (GB = 2^30 bytes throughout, the GiB that
nvidia-smi and the tutorials call GB) is 35.41 GB at tp=1 (2.35 GB of parameters, gradients and Adam state,
30.53 GB of saved activations, 1.24 GB of fp32 batches, 0.29 GB of fp16 weight copies, the 1 GB allowance) and
20.14 GB at tp=4 (0.66, 17.17, 1.24, 0.08 and 1 GB): 21 % and 39 % below the measurements, 9.6 GB and 12.9 GB
in absolute terms. The formula was not tuned to them.

Checked against an H100 (benchmarks/results/2026-11-26-h100-first-light.md, config ``short`` on one GPU):
torch's peak of allocated memory against the estimate less the CUDA allowance, 19.92 GB against 21.14 GB
measured in fp32 (-6 %), 14.01 GB against 14.65 GB in bf16 with the gpu pipeline (-4 %; -17 % before the
batches were counted), and against 13.52 GB compiled and 12.21 GB compiled with CUDA graphs (+4 % and +15 %:
compiled kernels save less for backward than eager ones). On the CPU it matched, byte for byte, what the busiest rank of dlscale's
parallel ViT (:mod:`dlscale.parallel.vit_parallel` on forked gloo ranks: tp 2 and 4, cp 2, 3 and 4,
tp 2 x cp 2; fp32 and bf16) saves.
What the measurement holds and the estimate leaves out:

* the caching allocator: pynvml reads what the allocator has reserved, which after the first step covers the
  whole step's peak (backward included) plus fragmentation of blocks freed in another order than they were
  taken, commonly 10-30 % on top of the live tensors;
* temporaries: gradients flowing back through a block (two b*n*(F/tp) tensors in the MLP's backward, 0.53 GB
  each for ``mp`` at tp=1), the copies the collectives make (the tp all-reduce clones its input, gathers pad),
  the optimizer's and GradScaler's working buffers, kernel workspaces;
* NCCL's buffers beyond the allowance, which grow with the number of communicators.

The gap does not shrink with tp (it grows by 3 GB from tp=1 to tp=4), so it is not only overhead proportional
to the live tensors; the tutorial's own tp code may also keep tensors that dlscale's does not. The estimate is
therefore a lower bound: good for comparing layouts with each other, optimistic as a "fits" verdict, which is
why ``dlscale plan`` prints this comparison under every table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from dlscale.errors import ConfigError, InvalidValue
from dlscale.models.vit_config import ViTConfig
from dlscale.perf.plan.layout_cost import (
    GIB,
    CommEstimate,
    Layout,
    MemoryEstimate,
    ModelShape,
    ParameterCounts,
    TrainingSettings,
    count_parameters_per_gpu,
    enumerate_layouts,
    estimate_communication,
    estimate_memory,
    layout_problems,
    local_batch_size,
)


@dataclass(frozen=True)
class LayoutEstimate:
    """One row of the plan: a layout, whether it can run, and if so its memory and traffic per GPU."""

    layout: Layout
    problems: tuple[str, ...]
    gpu_memory_bytes: int
    local_batch: int | None = None
    parameters: ParameterCounts | None = None
    memory: MemoryEstimate | None = None
    comm: CommEstimate | None = None

    @property
    def valid(self) -> bool:
        return not self.problems

    @property
    def fits(self) -> bool:
        return self.memory is not None and self.memory.total <= self.gpu_memory_bytes

    @property
    def reason(self) -> str:
        """Why the layout is not recommended ("" when it fits)."""
        if self.problems:
            return "; ".join(self.problems)
        if self.memory is not None and not self.fits:
            over = self.memory.total - self.gpu_memory_bytes
            return (
                f"needs {self.memory.total / GIB:.2f} GB, {over / GIB:.2f} GB more than the "
                f"{self.gpu_memory_bytes / GIB:.2f} GB per GPU"
            )
        return ""

    def to_dict(self) -> dict[str, Any]:
        """The row as plain JSON values (bytes as integers, GB rounded to 2 decimals)."""
        row: dict[str, Any] = {
            **asdict(self.layout),
            "gpus": self.layout.gpus,
            "valid": self.valid,
            "fits": self.fits,
            "reason": self.reason,
            "local_batch": self.local_batch,
        }
        if self.parameters is not None:
            row["parameters"] = asdict(self.parameters)
        if self.memory is not None:
            row.update(self.memory.json_fields())
        if self.comm is not None:
            row["comm_bytes_per_step"] = {**asdict(self.comm), "total": self.comm.total}
            row["comm_gb_per_step"] = {
                key: round(value / GIB, 2) for key, value in row["comm_bytes_per_step"].items()
            }
        return row


def estimate_layout(
    shape: ModelShape, settings: TrainingSettings, layout: Layout, gpu_memory_bytes: int
) -> LayoutEstimate:
    """Memory and traffic of one layout, or why it cannot run."""
    problems = tuple(layout_problems(shape, settings, layout))
    if problems:
        return LayoutEstimate(layout, problems, gpu_memory_bytes)
    counts = count_parameters_per_gpu(shape, settings, layout)
    return LayoutEstimate(
        layout=layout,
        problems=(),
        gpu_memory_bytes=gpu_memory_bytes,
        local_batch=local_batch_size(settings, layout),
        parameters=counts,
        memory=estimate_memory(shape, settings, layout),
        comm=estimate_communication(shape, settings, layout, counts.local),
    )


def rank_estimates(estimates: Sequence[LayoutEstimate]) -> list[LayoutEstimate]:
    """Layouts that fit (least traffic, then least memory, first), then too big ones (smallest first), then
    the ones that cannot run."""

    def key(row: LayoutEstimate) -> tuple:
        if row.fits:
            return (0, row.comm.total, row.memory.total, row.layout)
        if row.valid:
            return (1, row.memory.total, row.comm.total, row.layout)
        return (2, 0, 0, row.layout)

    return sorted(estimates, key=key)


@dataclass(frozen=True)
class Plan:
    """Every layout of ``gpus`` GPUs, ranked, and the one the config asks for."""

    gpus: int
    gpu_memory_bytes: int
    rows: list[LayoutEstimate]
    requested_tp: int
    requested_cp: int
    notes: list[str] = field(default_factory=list)

    @property
    def requested(self) -> LayoutEstimate | None:
        """The row of the config's tp and cp (dp is what they leave); None if they do not divide ``gpus``."""
        return next(
            (r for r in self.rows if (r.layout.tp, r.layout.cp) == (self.requested_tp, self.requested_cp)),
            None,
        )

    def position(self, row: LayoutEstimate) -> int:
        """1-based rank of ``row`` in the plan."""
        return self.rows.index(row) + 1


def plan(
    shape: ModelShape,
    settings: TrainingSettings,
    gpus: int,
    gpu_memory_gb: float,
    requested_tp: int = 1,
    requested_cp: int = 1,
) -> Plan:
    """Estimate and rank every layout of ``gpus`` GPUs with ``gpu_memory_gb`` (2^30 bytes) each."""
    if not (gpu_memory_gb > 0 and math.isfinite(gpu_memory_gb)):
        raise InvalidValue("gpu_memory_gb", f"must be a number of GB > 0, got {gpu_memory_gb}")
    capacity = int(gpu_memory_gb * GIB)
    rows = [estimate_layout(shape, settings, layout, capacity) for layout in enumerate_layouts(gpus)]
    notes = []
    if shape.dropout > 0:
        notes.append(
            f"dropout {shape.dropout:g}: the dropout masks (1 byte per element of each dropped tensor) "
            "are not in the activation estimate"
        )
    if settings.data_parallel == "dataparallel":
        notes.append(
            "data_parallel 'dataparallel' is estimated as DDP; nn.DataParallel's first GPU also gathers the "
            "outputs and so needs a little more"
        )
    if settings.noddp:
        notes.append("noddp: no gradient synchronization, so no data-parallel traffic is counted")
    return Plan(gpus, capacity, rank_estimates(rows), requested_tp, requested_cp, notes)


# The NERSC tutorial's measurements of config mp (embed 1024, depth 12, 8 heads, patch 8, 360x720 images, 20
# channels in and out, local batch 16, fp16, fused Adam) on an A100 80 GB: pynvml's device memory after the
# forward pass, in GB, by tensor-parallel size.
TUTORIAL_MEASURED_GB = {1: 45.0, 4: 33.0}


@dataclass(frozen=True)
class TutorialComparison:
    """This module's estimate of one of the tutorial's runs next to what the tutorial measured."""

    tp: int
    estimated_gb: float
    measured_gb: float


def tutorial_comparisons() -> list[TutorialComparison]:
    """The estimate of each run in :data:`TUTORIAL_MEASURED_GB` (tp ranks, one replica, local batch 16)."""
    shape = ModelShape.from_config(
        ViTConfig(embed_dim=1024, depth=12, num_heads=8, patch_size=8, mlp_ratio=4.0), (360, 720), 20, 20
    )
    settings = TrainingSettings(global_batch_size=16, amp_mode="fp16", optimizer="Adam")
    return [
        TutorialComparison(tp, estimate_memory(shape, settings, Layout(1, tp, 1)).total / GIB, measured)
        for tp, measured in TUTORIAL_MEASURED_GB.items()
    ]


def model_shape_of(cfg: Any) -> ModelShape:
    """The :class:`ModelShape` of a loaded run config of the ViT workload."""
    if not isinstance(cfg.model, ViTConfig):
        raise ConfigError(
            f"{cfg.where}: the analytic dp x tp x cp plan models the ViT; workload {cfg.workload!r} "
            f"has a {type(cfg.model).__name__} model (plan it with dlscale.perf.plan.traced_plan)"
        )
    if cfg.model.mixer != "attention":
        raise ConfigError(
            f"{cfg.where}: the analytic dp x tp x cp plan models the attention ViT; model.mixer is "
            f"{cfg.model.mixer!r} (plan it with dlscale.perf.plan.traced_plan)"
        )
    return ModelShape.from_config(
        cfg.model, cfg.data.img_size, cfg.data.n_in_channels, cfg.data.n_out_channels
    )
