"""The ``parallel:`` config section: how a run is laid out over GPUs (dp x tp x cp) and how DDP is tuned.

tp and cp are given; dp is what the world size leaves (see :mod:`dlscale.parallel.mesh`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dlscale.errors import InvalidValue

_PARALLEL_NAMES = ("tp", "cp", "dp")


@dataclass
class ParallelConfig:
    """Parallel layout and data-parallel tuning knobs."""

    tensor_parallel: int = 1  # ranks that split each layer's hidden dimension and heads (tp)
    context_parallel: int = 1  # ranks that split the token sequence (cp)
    parallel_order: str = "tp-cp-dp"  # the first name gets adjacent ranks (keep it on one node's NVLink)
    # ddp: replicas, gradients all-reduced; fsdp: FSDP2 fully_shard over dp (parameters, gradients and optimizer
    # state sharded too); dataparallel: one process drives all its GPUs (the LUMI tutorial's middle step)
    data_parallel: Literal["ddp", "fsdp", "dataparallel"] = "ddp"
    bucket_cap_mb: float = 25.0  # DDP gradient bucket size
    disable_broadcast_buffers: bool = False  # DDP: do not broadcast buffers every step
    gradient_as_bucket_view: bool = True  # DDP: gradients live in the all-reduce buckets (saves a copy)
    noddp: bool = False  # do not synchronize gradients (measures compute-only scaling; ranks diverge)
    # A collective waiting longer (a dead or hung rank) ends the job with one line per rank saying where it
    # waited: timeout_s from the process group's start until the first step of the training loop (and in commands
    # other than train), train_timeout_s in the loop (it must outlast a checkpoint's save and validation).
    timeout_s: float = 1800.0
    train_timeout_s: float = 600.0  # torch's own default; a gathered save of a large model must fit in it
    stop_check_every: int = 10  # steps between the ranks' agreement on a stop signal (a tiny all-reduce)

    def __post_init__(self) -> None:
        for name in ("tensor_parallel", "context_parallel"):
            if getattr(self, name) < 1:
                raise InvalidValue(name, f"must be >= 1, got {getattr(self, name)}")
        order = self.parallel_order.split("-")
        if sorted(order) != sorted(_PARALLEL_NAMES):
            raise InvalidValue(
                "parallel_order",
                f"must name each of tp, cp, dp once, joined by '-', got {self.parallel_order!r}",
            )
        if self.bucket_cap_mb <= 0:
            raise InvalidValue("bucket_cap_mb", f"must be > 0, got {self.bucket_cap_mb}")
        for name in ("timeout_s", "train_timeout_s"):
            if getattr(self, name) <= 0:
                raise InvalidValue(name, f"must be > 0 seconds, got {getattr(self, name)}")
        if self.stop_check_every < 1:
            raise InvalidValue("stop_check_every", f"must be >= 1 step, got {self.stop_check_every}")
