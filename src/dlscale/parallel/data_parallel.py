"""Data parallelism from outside the model: wrap it in DDP with the config's knobs, or leave it alone.

Every rank holds a full replica; DDP all-reduces (averages) the gradients during backward, bucket by bucket,
so that the update equals one step on the global batch. The model itself knows nothing of this.
"""

from __future__ import annotations

import logging

import torch
from torch.nn.parallel import DistributedDataParallel

from dlscale.errors import ConfigError
from dlscale.parallel.layout import ParallelConfig
from dlscale.runtime.device import Device
from dlscale.runtime.launch import ProcessInfo

log = logging.getLogger("dlscale.parallel")


def wrap_data_parallel(
    model: torch.nn.Module, cfg: ParallelConfig, process: ProcessInfo, device: Device
) -> torch.nn.Module:
    """``model`` in DDP when several ranks train it; the model itself with one rank or ``noddp``.

    ``noddp`` trains every rank on its own shard without synchronizing gradients: the replicas drift apart,
    which is only useful to measure compute-only scaling (the tutorials' comparison).
    """
    if cfg.data_parallel == "dataparallel":
        return _single_process_data_parallel(model, process, device)
    if process.world_size <= 1:
        return model
    if cfg.noddp:
        log.warning(
            "noddp: the %d ranks do not synchronize gradients; their models diverge (for scaling studies only)",
            process.world_size,
        )
        return model
    return DistributedDataParallel(
        model,
        device_ids=[device.torch.index] if device.is_gpu else None,
        bucket_cap_mb=cfg.bucket_cap_mb,
        broadcast_buffers=not cfg.disable_broadcast_buffers,
        gradient_as_bucket_view=cfg.gradient_as_bucket_view,
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
