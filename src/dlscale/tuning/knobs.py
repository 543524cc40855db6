"""The knobs ``dlscale tune`` tries, and in which order for each verdict of the throughput trials.

A run's tunable state is a flat mapping of dotted config keys to effective values (:data:`SETTING_KEYS`; the
local batch is ``train.local_batch_size`` whatever the config spells). Each knob looks at the current settings and
proposes at most one change, or none when it does not apply (already on, needs another knob first). A knob that
needs a GPU the run does not have proposes its change with a ``skip`` reason, so the report says it was skipped.

Order: the verdict names what limits the run, and within its group the cheapest and most likely knobs come
first.

* compute-bound: the fused optimizer step (no effect on the numerics, nothing to compile, rarely slower); TF32
  where it is off (GPU); mixed precision (the largest single gain on tensor-core GPUs, checked for numerics);
  a doubled local batch (fills the device better; memory-bounded, checked for numerics); torch.compile (minutes
  of compilation per trial, so late); then its reduce-overhead mode, or CUDA graphs without compile; and under
  torchrun the DDP knobs (a larger gradient bucket, no buffer broadcast, gradients as bucket views), since the
  SYNTHETIC test includes the all-reduce.
* IO-bound: more loader workers (doubling while it helps, up to the cores of one rank), keeping them alive
  between epochs, reading further ahead, pinned host memory (GPU), then the threaded gpu pipeline.
* overhead: the gpu pipeline first (it overlaps reads and device copies with compute, which is what overhead
  lacks), then workers, persistent workers, the next batch's device copy ahead (GPU), pinned memory (GPU).
* balanced, inconclusive, within noise, needs more trials: the compute group, then the IO group.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

Settings = Mapping[str, Any]
Change = tuple[tuple[str, Any], ...]

# The settings a tune reads and changes (dotted config keys), plus the two it reads only (optimizer, on_nonfinite).
SETTING_KEYS = (
    "loader.num_data_workers",
    "loader.persistent_workers",
    "loader.prefetch_factor",
    "loader.pin_memory",
    "loader.data_loader_config",
    "loader.prefetch_depth",
    "loader.device_prefetch",
    "optim.optimizer",
    "optim.enable_fused",
    "train.amp_mode",
    "train.tf32",
    "train.enable_jit",
    "train.compile_mode",
    "train.cuda_graphs",
    "train.on_nonfinite",
    "train.local_batch_size",
    "parallel.bucket_cap_mb",
    "parallel.disable_broadcast_buffers",
    "parallel.gradient_as_bucket_view",
)
BATCH_KEY = "train.local_batch_size"
MAX_BUCKET_CAP_MB = 200.0  # beyond this a bucket waits for most of the backward pass before its all-reduce
GOOD_PREFETCH = 4  # batches read ahead per worker (pytorch) or by the gpu pipeline


@dataclass(frozen=True)
class TuneContext:
    """What the run is on: it decides which knobs apply and how far they go."""

    on_gpu: bool
    data_parallel_ranks: int = 1
    ddp: bool = False  # gradients are all-reduced by DDP (world > 1, parallel.data_parallel ddp, no noddp)
    cpus_per_rank: int = 1
    bf16: bool = True  # the device computes in bfloat16 (else AMP tries fp16)
    batch_ceiling: int | None = None  # the smallest local batch known not to fit (out of memory)


@dataclass(frozen=True)
class Candidate:
    """One change to try on top of the current settings."""

    knob: str  # the knob's name, e.g. "loader workers"
    changes: Change  # ((dotted key, new value), ...)
    why: str  # what it should gain
    numerics: bool = False  # changes the computed numbers: accepted only after a training check
    skip: str | None = None  # why it is not tried on this run (e.g. it needs a GPU)

    @property
    def label(self) -> str:
        """``train.enable_jit=true`` (YAML spelling of the values)."""
        return " ".join(f"{key}={yaml_word(value)}" for key, value in self.changes)


def tunable_key(name: str) -> str:
    """The dotted setting a name means (``enable_jit`` or ``train.enable_jit``); ValueError for no setting."""
    for key in SETTING_KEYS:
        if name == key or name == key.split(".")[1]:
            return key
    raise ValueError(name)


def yaml_word(value: Any) -> str:
    """A value as it would be typed after --set: true/false/null, numbers and words as they are."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def apply_changes(settings: Settings, changes: Change) -> dict[str, Any]:
    """A copy of ``settings`` with ``changes`` made."""
    updated = dict(settings)
    for key, value in changes:
        if key not in updated:
            raise KeyError(f"{key} is not a tunable setting")
        updated[key] = value
    return updated


Knob = Callable[[Settings, TuneContext], "Candidate | None"]


def _needs_gpu(candidate: Candidate, ctx: TuneContext) -> Candidate:
    return candidate if ctx.on_gpu else replace(candidate, skip="needs a GPU")


def _pytorch_pipeline(s: Settings) -> bool:
    return s["loader.data_loader_config"] == "pytorch"


def fused_optimizer(s: Settings, ctx: TuneContext) -> Candidate | None:
    if s["optim.enable_fused"] or s["optim.optimizer"] == "Adadelta":
        return None
    return Candidate("fused optimizer", (("optim.enable_fused", True),), "one kernel for the optimizer step")


def tf32(s: Settings, ctx: TuneContext) -> Candidate | None:
    if s["train.tf32"]:
        return None
    return _needs_gpu(
        Candidate("TF32", (("train.tf32", True),), "tensor cores for fp32 matmuls", numerics=True), ctx
    )


def mixed_precision(s: Settings, ctx: TuneContext) -> Candidate | None:
    if s["train.amp_mode"] != "none":
        return None
    mode = "bf16" if ctx.bf16 else "fp16"
    return Candidate("mixed precision", (("train.amp_mode", mode),), f"{mode} autocast", numerics=True)


def larger_batch(s: Settings, ctx: TuneContext) -> Candidate | None:
    current = s[BATCH_KEY]
    proposed = 2 * current
    if ctx.batch_ceiling is not None:
        # Back off: halfway between what fits and the smallest batch known not to.
        proposed = min(proposed, current + (ctx.batch_ceiling - current) // 2)
    if proposed <= current:
        return None
    return Candidate(
        "local batch", ((BATCH_KEY, proposed),), "more work per step fills the device", numerics=True
    )


def compile_model(s: Settings, ctx: TuneContext) -> Candidate | None:
    if s["train.enable_jit"] or s["train.cuda_graphs"]:
        return None
    return Candidate("torch.compile", (("train.enable_jit", True),), "fused kernels", numerics=True)


def compile_reduce_overhead(s: Settings, ctx: TuneContext) -> Candidate | None:
    if not s["train.enable_jit"] or s["train.compile_mode"] != "default":
        return None
    candidate = Candidate(
        "compile mode",
        (("train.compile_mode", "reduce-overhead"),),
        "the compiled step replayed as CUDA graphs (fewer kernel launches)",
        numerics=True,
    )
    return _needs_gpu(candidate, ctx)


def cuda_graphs(s: Settings, ctx: TuneContext) -> Candidate | None:
    if s["train.cuda_graphs"] or s["train.enable_jit"] or s["train.on_nonfinite"] != "stop":
        return None
    candidate = Candidate(
        "CUDA graphs", (("train.cuda_graphs", True),), "the whole step replayed as one graph", numerics=True
    )
    return _needs_gpu(candidate, ctx)


def bucket_size(s: Settings, ctx: TuneContext) -> Candidate | None:
    current = s["parallel.bucket_cap_mb"]
    if not ctx.ddp or current >= MAX_BUCKET_CAP_MB:
        return None
    proposed = min(2 * current, MAX_BUCKET_CAP_MB)
    return Candidate(
        "DDP bucket", (("parallel.bucket_cap_mb", proposed),), "fewer, larger gradient all-reduces"
    )


def no_buffer_broadcast(s: Settings, ctx: TuneContext) -> Candidate | None:
    if not ctx.ddp or s["parallel.disable_broadcast_buffers"]:
        return None
    # Models with buffers (BatchNorm's running statistics) then keep each rank's own: a numerics change.
    return Candidate(
        "DDP buffers",
        (("parallel.disable_broadcast_buffers", True),),
        "no broadcast of buffers before every forward",
        numerics=True,
    )


def bucket_view(s: Settings, ctx: TuneContext) -> Candidate | None:
    if not ctx.ddp or s["parallel.gradient_as_bucket_view"]:
        return None
    return Candidate(
        "DDP bucket view", (("parallel.gradient_as_bucket_view", True),), "no copy of gradients into buckets"
    )


def more_workers(s: Settings, ctx: TuneContext) -> Candidate | None:
    current = s["loader.num_data_workers"]
    if not _pytorch_pipeline(s) or current >= ctx.cpus_per_rank:
        return None
    proposed = min(max(2, 2 * current), ctx.cpus_per_rank)
    return Candidate(
        "loader workers", (("loader.num_data_workers", proposed),), "reads in parallel worker processes"
    )


def persistent_workers(s: Settings, ctx: TuneContext) -> Candidate | None:
    if not _pytorch_pipeline(s) or s["loader.num_data_workers"] == 0 or s["loader.persistent_workers"]:
        return None
    return Candidate(
        "persistent workers", (("loader.persistent_workers", True),), "no worker start-up each epoch"
    )


def prefetch_factor(s: Settings, ctx: TuneContext) -> Candidate | None:
    factor = s["loader.prefetch_factor"]
    if not _pytorch_pipeline(s) or s["loader.num_data_workers"] == 0 or (factor or 2) >= GOOD_PREFETCH:
        return None
    return Candidate(
        "prefetch", (("loader.prefetch_factor", GOOD_PREFETCH),), "each worker reads further ahead"
    )


def pinned_memory(s: Settings, ctx: TuneContext) -> Candidate | None:
    # null means "on when training on a GPU", so only an explicit false is worth changing there.
    if (
        not _pytorch_pipeline(s)
        or s["loader.pin_memory"] is True
        or (ctx.on_gpu and s["loader.pin_memory"] is None)
    ):
        return None
    return _needs_gpu(
        Candidate(
            "pinned memory", (("loader.pin_memory", True),), "faster, asynchronous host-to-device copies"
        ),
        ctx,
    )


def device_prefetch(s: Settings, ctx: TuneContext) -> Candidate | None:
    if not _pytorch_pipeline(s) or s["loader.device_prefetch"]:
        return None
    return _needs_gpu(
        Candidate(
            "device prefetch",
            (("loader.device_prefetch", True),),
            "the next batch's device copy overlaps this step",
        ),
        ctx,
    )


def gpu_pipeline(s: Settings, ctx: TuneContext) -> Candidate | None:
    if not _pytorch_pipeline(s):
        return None
    return Candidate(
        "gpu pipeline",
        (("loader.data_loader_config", "gpu"),),
        "threaded reads and device copies ahead of the step",
    )


def pipeline_depth(s: Settings, ctx: TuneContext) -> Candidate | None:
    if _pytorch_pipeline(s) or s["loader.prefetch_depth"] >= GOOD_PREFETCH:
        return None
    return Candidate(
        "pipeline depth", (("loader.prefetch_depth", GOOD_PREFETCH),), "the gpu pipeline reads further ahead"
    )


DDP_KNOBS: tuple[Knob, ...] = (bucket_size, no_buffer_broadcast, bucket_view)
COMPUTE_KNOBS: tuple[Knob, ...] = (
    fused_optimizer,
    tf32,
    mixed_precision,
    larger_batch,
    compile_model,
    compile_reduce_overhead,
    cuda_graphs,
    *DDP_KNOBS,
)
IO_KNOBS: tuple[Knob, ...] = (
    more_workers,
    persistent_workers,
    prefetch_factor,
    pinned_memory,
    gpu_pipeline,
    pipeline_depth,
)
OVERHEAD_KNOBS: tuple[Knob, ...] = (
    gpu_pipeline,
    pipeline_depth,
    more_workers,
    persistent_workers,
    device_prefetch,
    pinned_memory,
)
KNOBS_BY_VERDICT: dict[str, tuple[Knob, ...]] = {
    "compute-bound": COMPUTE_KNOBS,
    "IO-bound": IO_KNOBS,
    "overhead": OVERHEAD_KNOBS,
    "balanced": COMPUTE_KNOBS + IO_KNOBS,
    "inconclusive": COMPUTE_KNOBS + IO_KNOBS,
    "within noise": COMPUTE_KNOBS + IO_KNOBS,
    "needs more trials": COMPUTE_KNOBS + IO_KNOBS,
}


def candidates_for(verdict: str, settings: Settings, ctx: TuneContext) -> list[Candidate]:
    """The changes worth trying for ``verdict`` on top of ``settings``, most promising first."""
    if verdict not in KNOBS_BY_VERDICT:
        raise ValueError(f"unknown verdict {verdict!r}; expected one of {', '.join(KNOBS_BY_VERDICT)}")
    candidates: list[Candidate] = []
    for knob in KNOBS_BY_VERDICT[verdict]:
        candidate = knob(settings, ctx)
        if candidate is not None and candidate.changes not in [c.changes for c in candidates]:
            candidates.append(candidate)
    return candidates
