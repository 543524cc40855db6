"""The ``parallel:`` config section: how a run is laid out over GPUs (dp x tp x cp) and how DDP is tuned.

This version trains on one process; the keys are accepted and validated so the tutorials' flags and configs
parse, and any value other than the default stops with a "not available yet" message instead of being ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlscale.errors import InvalidValue, NotAvailableYet

_PARALLEL_NAMES = ("tp", "cp", "dp")


@dataclass
class ParallelConfig:
    """Parallel layout and data-parallel tuning knobs."""

    tensor_parallel: int = 1  # ranks that split each layer's hidden dimension and heads (tp)
    context_parallel: int = 1  # ranks that split the token sequence (cp)
    parallel_order: str = "tp-cp-dp"  # the first name gets adjacent ranks (keep it on one node's NVLink)
    bucket_cap_mb: float = 25.0  # DDP gradient bucket size
    disable_broadcast_buffers: bool = False  # DDP: do not broadcast buffers every step
    noddp: bool = False  # do not synchronize gradients (measures compute-only scaling)

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
        if self.tensor_parallel > 1:
            raise NotAvailableYet("tensor_parallel", self.tensor_parallel, "tensor parallelism", 1)
        if self.context_parallel > 1:
            raise NotAvailableYet("context_parallel", self.context_parallel, "context parallelism", 1)
        if self.noddp:
            raise NotAvailableYet("noddp", True, "multi-GPU data-parallel training", False)
        if self.disable_broadcast_buffers:
            raise NotAvailableYet(
                "disable_broadcast_buffers", True, "multi-GPU data-parallel training", False
            )
        if self.bucket_cap_mb != 25.0:
            raise NotAvailableYet(
                "bucket_cap_mb", self.bucket_cap_mb, "multi-GPU data-parallel training", 25.0
            )
