"""Lay a run out on its dp x tp x cp mesh: create the groups, sum metrics over the right ranks, and print which
rank holds what (the workload splits its own model: ``Workload.parallelize``)."""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch.distributed as dist
from torch import nn

from dlscale.parallel.mesh import MeshShape, ParallelMesh, layout_table
from dlscale.parallel.parallel_config import ParallelConfig
from dlscale.runtime.distributed import sum_across_ranks_
from dlscale.runtime.launch import ProcessInfo

log = logging.getLogger("dlscale.parallel")


def create_mesh(cfg: ParallelConfig, process: ProcessInfo) -> ParallelMesh:
    """The mesh of this run (its groups are created here: every rank calls this at the same point)."""
    shape = MeshShape.for_world(
        process.world_size, cfg.tensor_parallel, cfg.context_parallel, cfg.parallel_order
    )
    return ParallelMesh.create(shape, process.rank)


def report_layout(model: nn.Module, mesh: ParallelMesh) -> None:
    """Log the layout table with the parameters each rank holds (a collective: every rank calls it)."""
    counts = parameters_per_rank(model, mesh.shape.world_size)
    for line in layout_table(mesh.shape, counts):
        log.info("%s", line)


def parameters_per_rank(model: nn.Module, world_size: int) -> list[int]:
    """The number of parameters each rank holds, after tp and FSDP sharding (a collective with several ranks)."""
    # An FSDP2 parameter is a DTensor whose numel() is the whole tensor's; this rank holds its local shard.
    mine = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters())
    if world_size == 1 or not (dist.is_available() and dist.is_initialized()):
        return [mine] * world_size
    counts = [None] * world_size
    dist.all_gather_object(counts, mine)
    return [int(c) for c in counts]


def data_parallel_sum(mesh: ParallelMesh, default: Any) -> Any:
    """An in-place sum over the ranks that hold different samples (the dp group).

    With model parallelism the ranks of one replica saw the same samples, so summing metrics over all ranks
    would count every sample tp x cp times.
    """
    if not mesh.is_model_parallel:
        return default
    group = mesh.group("dp")
    if group is None:  # one replica: its ranks already hold every sample's metrics
        return lambda tensor: None
    return functools.partial(sum_across_ranks_, group=group)
