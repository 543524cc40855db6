"""FSDP2 over the data-parallel ranks: ``fully_shard`` the model's blocks and the model itself.

With DDP every data-parallel rank keeps full (or, with tp, tp-sized) copies of the parameters, the gradients and
Adam's two moments; FSDP2 keeps 1/N of each on each of the N ranks and all-gathers a block's parameters just
before it runs. This is the answer to the tutorial's closing question "what tensors have we left un-partitioned?":
with tensor parallelism the LayerNorms, embeddings and head, and the optimizer state of everything, stay whole on
every rank; FSDP2 shards them too. The ranks sharded over are the dp x cp ranks that hold the same parameters,
so it combines with tp and cp as DDP does (see :mod:`dlscale.parallel.context_parallel`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch.distributed as dist
from torch import nn

log = logging.getLogger("dlscale.parallel")


def _fully_shard() -> Any:
    from torch.distributed.fsdp import fully_shard  # public since torch 2.6; dlscale needs torch >= 2.11

    return fully_shard


def shard_fully(model: nn.Module, units: Iterable[nn.Module], group: Any, device_type: str) -> nn.Module:
    """Apply FSDP2 to each unit (e.g. the transformer blocks), then to the whole model; returns ``model``.

    Each unit is all-gathered for its own forward and backward and freed after, so at most one unit's full
    parameters are held at a time; the root takes whatever is left (embeddings, final norm, head).
    """
    from torch.distributed.device_mesh import DeviceMesh

    fully_shard = _fully_shard()
    mesh = DeviceMesh.from_group(group if group is not None else dist.group.WORLD, device_type)
    units = list(units)
    for unit in units:
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    log.info(
        "FSDP2: parameters, gradients and optimizer state sharded over %d rank(s), in %d block(s) plus the root",
        mesh.size(),
        len(units),
    )
    return model
