"""Per-GPU memory of a traced training step (:mod:`dlscale.perf.plan.traced_memory`) on dp data-parallel GPUs, with
DDP or FSDP2: the model's states by optimizer and layout, plus what the trace found.

Model states (bytes on the busiest rank)
----------------------------------------
* parameters and gradients: every trainable parameter in its own dtype. DDP keeps whole ones on every rank;
  with ``gradient_as_bucket_view: false`` its all-reduce buckets are a second copy of the gradients. FSDP2
  keeps a shard of each: dim 0 split over dp ranks, rank 0 holding ceil(dim0 / dp) rows (the busiest).
* optimizer state, per parameter (shard): Adam and AdamW keep exp_avg and exp_avg_sq, Adadelta square_avg
  and acc_delta, SGD a momentum buffer when momentum > 0 (none without), each the parameter's size and dtype;
  Adam, AdamW and Adadelta also keep a ``step`` count per parameter tensor, an fp32 scalar (torch's optimizers, as
  :func:`dlscale.training.optim.build_optimizer` makes them).
* FSDP2's unsharded working set: the root (every parameter outside the workload's ``fsdp_units``; by default
  the whole model) is all-gathered at the start of forward and stays whole until its backward ends; of the
  units, the one computing and the one prefetched are whole at once; and the gradients of the largest of them
  are whole until their reduce-scatter. With dp = 1 dlscale wraps nothing, so there is no overhead.

The activations (tensors saved for backward), the batch (what of it autograd does not save itself) and the
weight copies (autocast's casts) come from the trace, at the local batch; the CUDA allowance is
:data:`dlscale.perf.plan.layout_cost.CUDA_ALLOWANCE_BYTES`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dlscale.errors import InvalidValue
from dlscale.perf.plan.layout_cost import CUDA_ALLOWANCE_BYTES, MemoryEstimate
from dlscale.perf.plan.traced_memory import ParameterInfo, TracedStep

STEP_COUNT_BYTES = 4  # the fp32 ``step`` scalar of Adam, AdamW and Adadelta, one per parameter tensor
# Tensors of a parameter's size that each optimizer keeps per parameter (SGD: 1 with momentum, else 0).
STATE_TENSORS = {"Adam": 2, "AdamW": 2, "Adadelta": 2, "SGD": 1}
STEP_COUNTS = {"Adam": 1, "AdamW": 1, "Adadelta": 1, "SGD": 0}
WRAPPERS = {"none": "one GPU", "ddp": "DDP", "fsdp": "FSDP2"}


@dataclass(frozen=True)
class OptimizerMemory:
    """Which optimizer, and whether SGD keeps a momentum buffer: all its state's size depends on."""

    name: str = "Adam"
    momentum: float = 0.0  # SGD only

    def __post_init__(self) -> None:
        if self.name not in STATE_TENSORS:
            raise InvalidValue("optimizer", f"must be one of {', '.join(STATE_TENSORS)}, got {self.name!r}")

    @property
    def state_tensors(self) -> int:
        """Parameter-sized state tensors per parameter."""
        if self.name == "SGD":
            return 1 if self.momentum > 0 else 0
        return STATE_TENSORS[self.name]

    def state_bytes(self, parameters: tuple[ParameterInfo, ...], shards: int = 1) -> int:
        """Bytes of state kept for ``parameters`` sharded over ``shards`` ranks (the busiest rank's)."""
        elements = sum(shard_elements(p.shape, shards) * p.itemsize for p in parameters)
        return self.state_tensors * elements + STEP_COUNTS[self.name] * STEP_COUNT_BYTES * len(parameters)


@dataclass(frozen=True, order=True)
class DataParallelLayout:
    """dp GPUs that each hold a replica (DDP) or a shard (FSDP2) of the model; "none" is one GPU."""

    wrapper: str  # none | ddp | fsdp
    dp: int

    def __post_init__(self) -> None:
        if self.wrapper not in WRAPPERS:
            raise InvalidValue("wrapper", f"must be one of {', '.join(WRAPPERS)}, got {self.wrapper!r}")
        if self.dp < 1 or (self.wrapper == "none") != (self.dp == 1):
            raise InvalidValue("dp", f"{self.wrapper} needs dp {'= 1' if self.wrapper == 'none' else '> 1'}")

    def __str__(self) -> str:
        return WRAPPERS[self.wrapper] if self.wrapper == "none" else f"{WRAPPERS[self.wrapper]} dp={self.dp}"


def layout_problems(step: TracedStep, layout: DataParallelLayout) -> list[str]:
    """Why ``layout`` cannot train this model (empty when it can)."""
    if layout.wrapper != "fsdp":
        return []
    strided = [p.name for p in step.parameters if not p.contiguous]
    if not strided:
        return []
    named = ", ".join(strided[:3]) + (f" and {len(strided) - 3} more" if len(strided) > 3 else "")
    return [
        f"FSDP2 shards only contiguous parameters, and {len(strided)} are not ({named}: channels-last?); "
        "make them contiguous or use DDP"
    ]


def shard_elements(shape: tuple[int, ...], shards: int) -> int:
    """Elements of rank 0's FSDP2 shard of a parameter: ceil(dim0 / shards) rows (a scalar stays whole)."""
    if not shape:
        return 1
    return -(-shape[0] // shards) * math.prod(shape[1:])


@dataclass(frozen=True)
class TracedMemory(MemoryEstimate):
    """The analytic estimate's parts per GPU; its ``batch`` is what the traced step finds: the inputs and targets
    autograd does not already keep."""


def fsdp_working_set(parameters: tuple[ParameterInfo, ...], units: int) -> int:
    """Bytes FSDP2 holds unsharded beside the shards: the root's parameters, the computing and the prefetched
    unit's, and one unit's (or the root's) gradients before their reduce-scatter."""
    unit_bytes = [0] * units
    root = 0
    for p in parameters:
        if p.unit < 0:
            root += p.nbytes
        else:
            unit_bytes[p.unit] += p.nbytes
    largest_unit = max(unit_bytes, default=0)
    return root + min(units, 2) * largest_unit + max(root, largest_unit)


def estimate_traced_memory(
    step: TracedStep,
    optimizer: OptimizerMemory,
    layout: DataParallelLayout,
    gradient_as_bucket_view: bool = True,
    cuda_allowance: int = CUDA_ALLOWANCE_BYTES,
) -> TracedMemory:
    """Per-GPU memory of ``step`` (traced at the layout's local batch) under ``layout``."""
    parameters = step.parameters
    shards = layout.dp if layout.wrapper == "fsdp" else 1
    stored = sum(shard_elements(p.shape, shards) * p.itemsize for p in parameters)
    overhead = 0
    if layout.wrapper == "fsdp":
        overhead = fsdp_working_set(parameters, step.units)
    elif layout.wrapper == "ddp" and not gradient_as_bucket_view:
        overhead = step.parameter_bytes
    return TracedMemory(
        parameters=stored,
        gradients=stored,
        optimizer_state=optimizer.state_bytes(parameters, shards),
        sharding_overhead=overhead,
        activations=step.saved_activations,
        batch=step.unsaved_batch,
        autocast_weight_copies=step.autocast_weight_copies,
        cuda_allowance=cuda_allowance,
    )
