"""Data parallelism from outside the model: wrap it in DDP with the config's knobs, or leave it alone.

Every data-parallel rank holds a replica (or, with tensor/context parallelism, the same part of one); DDP
all-reduces (averages) the gradients during backward, bucket by bucket, so that the update equals one step on
the global batch. With context parallelism the average runs over the dp x cp ranks that hold the same
parameters (see :mod:`dlscale.parallel.context_parallel` for why that also sums the cp ranks' partial
gradients). The model itself knows nothing of this.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from dlscale.errors import ConfigError
from dlscale.parallel.fully_sharded import shard_fully
from dlscale.parallel.mesh import ParallelMesh
from dlscale.parallel.parallel_config import ParallelConfig
from dlscale.runtime.device import Device
from dlscale.runtime.launch import ProcessInfo

log = logging.getLogger("dlscale.parallel")

# The start of torch 2.13's FutureWarning when DDP is given broadcast_buffers (a regex, matched at the start).
BROADCAST_BUFFERS_DEPRECATION = r"`broadcast_buffers` is deprecated\. Use `forward_sync_buffers` instead"


def wrap_data_parallel(
    model: torch.nn.Module,
    cfg: ParallelConfig,
    process: ProcessInfo,
    device: Device,
    mesh: ParallelMesh | None = None,
    fsdp_units: Sequence[torch.nn.Module] = (),
) -> torch.nn.Module:
    """``model`` in DDP when several ranks hold the same parameters; the model itself otherwise or with ``noddp``.

    With ``data_parallel: fsdp``, FSDP2 shards each of ``fsdp_units`` (e.g. the transformer blocks, as the
    workload names them) before the whole model.

    ``noddp`` trains every rank on its own shard without synchronizing gradients: the replicas drift apart,
    which is only useful to measure compute-only scaling (the tutorials' comparison).
    """
    mesh = mesh or ParallelMesh.serial()
    if cfg.data_parallel == "dataparallel":
        if mesh.is_model_parallel:
            raise ConfigError(
                "parallel.data_parallel 'dataparallel' cannot be combined with tensor or context parallelism; "
                "use 'ddp' or 'fsdp'"
            )
        return _single_process_data_parallel(model, process, device)
    if cfg.noddp and mesh.size("cp") > 1:
        raise ConfigError(
            "parallel.noddp cannot be used with context_parallel > 1: the cp ranks' gradients must be summed "
            "for the model to be trained at all"
        )
    replicas = mesh.size("dp-cp") if mesh.is_model_parallel else process.world_size
    if replicas <= 1:
        return model
    group = mesh.group("dp-cp") if mesh.is_model_parallel else None
    if cfg.data_parallel == "fsdp":
        if cfg.noddp:
            raise ConfigError(
                "parallel.noddp cannot be combined with data_parallel 'fsdp' (it shards over the ranks)"
            )
        return shard_fully(model, fsdp_units, group, device.torch.type)
    if cfg.noddp:
        log.warning(
            "noddp: the %d ranks do not synchronize gradients; their models diverge (for scaling studies only)",
            process.world_size,
        )
        return model
    with warnings.catch_warnings():
        # torch 2.13 deprecates broadcast_buffers for forward_sync_buffers and warns once per rank. Harmless
        # here: forward_sync_buffers does not exist before 2.13 (we support torch >= 2.4), and only
        # broadcast_buffers=False keeps buffers out of the start-up broadcast too, which is what
        # disable_broadcast_buffers promises (buffers kept per rank).
        warnings.filterwarnings("ignore", message=BROADCAST_BUFFERS_DEPRECATION, category=FutureWarning)
        return DistributedDataParallel(
            model,
            device_ids=[device.torch.index] if device.is_gpu else None,
            bucket_cap_mb=cfg.bucket_cap_mb,
            broadcast_buffers=not cfg.disable_broadcast_buffers,
            gradient_as_bucket_view=cfg.gradient_as_bucket_view,
            process_group=group,
        )


def _single_process_data_parallel(
    model: torch.nn.Module, process: ProcessInfo, device: Device
) -> torch.nn.Module:
    """``torch.nn.DataParallel``: one process splits each batch over all its GPUs (the LUMI tutorial's middle
    step between one GPU and DDP; slower than DDP, which the comparison shows)."""
    if process.world_size > 1:
        raise ConfigError(
            f"parallel.data_parallel 'dataparallel' drives all GPUs from one process, but {process.world_size} "
            "processes were launched; launch one process, or use 'ddp'"
        )
    gpus = device.visible_gpu_count()
    if gpus < 2:
        log.warning("parallel.data_parallel 'dataparallel' with %d GPU(s): nothing to split over", gpus)
        return model
    log.info("DataParallel over %d GPUs in one process", gpus)
    return torch.nn.DataParallel(model)


def buffer_synchronizer(
    model: torch.nn.Module, cfg: ParallelConfig, process: ProcessInfo, mesh: ParallelMesh | None = None
) -> Callable[[], None]:
    """A function that gives every data-parallel rank the first rank's buffers (BatchNorm's running statistics).

    DDP broadcasts them at the start of every forward, so after the last step of an epoch each rank still holds
    the update of its own last batch; validation bypasses DDP, and the checkpoint holds rank 0's. Calling this
    before validation makes every rank validate, and save, the same model. A no-op when the model has no
    buffers, with one replica, with ``noddp`` or ``disable_broadcast_buffers`` (the user keeps buffers per rank).
    """
    mesh = mesh or ParallelMesh.serial()
    buffers = list(model.buffers())
    replicas = mesh.size("dp-cp") if mesh.is_model_parallel else process.world_size
    if not buffers or replicas <= 1 or cfg.noddp or cfg.disable_broadcast_buffers:
        return lambda: None
    group = mesh.group("dp-cp") if mesh.is_model_parallel else None
    source = dist.get_global_rank(group, 0) if group is not None else 0

    def synchronize() -> None:
        with torch.no_grad():
            for buffer in buffers:
                dist.broadcast(buffer, src=source, group=group)

    return synchronize
