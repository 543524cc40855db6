"""The tune's knob catalogue: which changes each verdict proposes, in which order, and how far they go."""

from __future__ import annotations

from typing import Any

import pytest
from untuned_settings import UNTUNED

from dlscale.tuning.knobs import (
    BATCH_KEY,
    TuneContext,
    apply_changes,
    candidates_for,
    larger_batch,
    more_workers,
)

CPU = TuneContext(on_gpu=False, cpus_per_rank=8)
GPU = TuneContext(on_gpu=True, cpus_per_rank=8)
GPU_ONLY = {"TF32", "compile mode", "CUDA graphs", "pinned memory", "device prefetch"}


def base_settings(**overrides: Any) -> dict[str, Any]:
    """An untuned config: pytorch loader, no workers, fp32, nothing compiled."""
    settings = dict(UNTUNED)
    settings.update({key.replace("__", "."): value for key, value in overrides.items()})
    return settings


def knobs(verdict: str, settings: dict[str, Any], ctx: TuneContext) -> list[str]:
    return [c.knob for c in candidates_for(verdict, settings, ctx)]


def test_compute_bound_starts_with_the_fused_optimizer() -> None:
    assert knobs("compute-bound", base_settings(), CPU) == [
        "fused optimizer",
        "TF32",
        "mixed precision",
        "local batch",
        "torch.compile",
        "CUDA graphs",
    ]


def test_io_bound_starts_with_workers() -> None:
    assert knobs("IO-bound", base_settings(), CPU) == ["loader workers", "pinned memory", "gpu pipeline"]
    with_workers = base_settings(loader__num_data_workers=2)
    assert knobs("IO-bound", with_workers, CPU) == [
        "loader workers",
        "persistent workers",
        "prefetch",
        "pinned memory",
        "gpu pipeline",
    ]


def test_overhead_starts_with_the_gpu_pipeline() -> None:
    assert knobs("overhead", base_settings(), CPU) == [
        "gpu pipeline",
        "loader workers",
        "device prefetch",
        "pinned memory",
    ]
    # Once on the gpu pipeline, its depth is the knob; the pytorch loader's knobs no longer apply.
    assert knobs("overhead", base_settings(loader__data_loader_config="gpu"), CPU) == ["pipeline depth"]


@pytest.mark.parametrize("verdict", ["balanced", "inconclusive"])
def test_balanced_tries_compute_then_io_without_duplicates(verdict: str) -> None:
    names = knobs(verdict, base_settings(), CPU)
    assert names[:6] == knobs("compute-bound", base_settings(), CPU)
    assert names[6:] == ["loader workers", "pinned memory", "gpu pipeline"]
    changes = [c.changes for c in candidates_for(verdict, base_settings(), CPU)]
    assert len(changes) == len(set(changes))


def test_gpu_only_knobs_are_skipped_on_cpu_with_a_reason() -> None:
    settings = base_settings(train__enable_jit=True, loader__num_data_workers=2)
    seen = set()
    for verdict in ("compute-bound", "IO-bound", "overhead"):
        for candidate in candidates_for(verdict, settings, CPU):
            if candidate.knob in GPU_ONLY:
                seen.add(candidate.knob)
                assert candidate.skip == "needs a GPU"
            else:
                assert candidate.skip is None, candidate.knob
    assert seen == {"TF32", "compile mode", "pinned memory", "device prefetch"}
    graphs = [c for c in candidates_for("compute-bound", base_settings(), CPU) if c.knob == "CUDA graphs"]
    assert graphs[0].skip == "needs a GPU"


def test_gpu_only_knobs_are_proposed_on_gpu() -> None:
    settings = base_settings(loader__pin_memory=False, train__enable_jit=True)
    proposed = {
        c.knob: c
        for verdict in ("compute-bound", "IO-bound", "overhead")
        for c in candidates_for(verdict, settings, GPU)
    }
    assert GPU_ONLY - {"CUDA graphs"} <= set(proposed)
    assert all(c.skip is None for c in proposed.values())
    graphs = [c for c in candidates_for("compute-bound", base_settings(), GPU) if c.knob == "CUDA graphs"]
    assert graphs[0].skip is None
    # On a GPU, pin_memory null already means pinned: nothing to propose.
    assert "pinned memory" not in knobs("IO-bound", base_settings(), GPU)


def test_workers_double_and_stop_at_the_cores_of_a_rank() -> None:
    proposals = []
    settings = base_settings()
    while (candidate := more_workers(settings, CPU)) is not None:
        proposals.append(candidate.changes[0][1])
        settings = apply_changes(settings, candidate.changes)
    assert proposals == [2, 4, 8]
    assert more_workers(
        base_settings(loader__num_data_workers=2), TuneContext(False, cpus_per_rank=3)
    ).changes == (("loader.num_data_workers", 3),)
    assert (
        more_workers(base_settings(loader__num_data_workers=3), TuneContext(False, cpus_per_rank=3)) is None
    )
    assert more_workers(base_settings(loader__data_loader_config="gpu"), CPU) is None


def test_batch_doubles_then_backs_off_halfway_to_the_ceiling() -> None:
    assert larger_batch(base_settings(), CPU).changes == ((BATCH_KEY, 32),)
    assert larger_batch(base_settings(), CPU).numerics
    at_32 = base_settings(train__local_batch_size=32)
    assert larger_batch(at_32, TuneContext(False, batch_ceiling=64)).changes == ((BATCH_KEY, 48),)
    assert larger_batch(at_32, TuneContext(False, batch_ceiling=48)).changes == ((BATCH_KEY, 40),)
    assert larger_batch(at_32, TuneContext(False, batch_ceiling=1000)).changes == ((BATCH_KEY, 64),)
    assert larger_batch(at_32, TuneContext(False, batch_ceiling=33)) is None


def test_ddp_knobs_only_under_ddp() -> None:
    ddp_knobs = {"DDP bucket", "DDP buffers", "DDP bucket view"}
    assert not ddp_knobs & set(knobs("compute-bound", base_settings(), CPU))
    ddp = TuneContext(False, data_parallel_ranks=4, ddp=True)
    candidates = {c.knob: c for c in candidates_for("compute-bound", base_settings(), ddp)}
    assert ddp_knobs <= set(candidates)
    assert candidates["DDP bucket"].changes == (("parallel.bucket_cap_mb", 50.0),)
    assert candidates["DDP buffers"].numerics
    assert larger_bucket(150.0, ddp) == 200.0
    assert larger_bucket(200.0, ddp) is None


def larger_bucket(current: float, ctx: TuneContext) -> float | None:
    for candidate in candidates_for("compute-bound", base_settings(parallel__bucket_cap_mb=current), ctx):
        if candidate.knob == "DDP bucket":
            return candidate.changes[0][1]
    return None


def test_adadelta_gets_no_fused_candidate() -> None:
    assert "fused optimizer" not in knobs("compute-bound", base_settings(optim__optimizer="Adadelta"), GPU)
    assert "fused optimizer" not in knobs("compute-bound", base_settings(optim__enable_fused=True), GPU)


def test_cuda_graphs_not_with_compile() -> None:
    names = knobs("compute-bound", base_settings(train__enable_jit=True), GPU)
    assert "CUDA graphs" not in names
    assert "torch.compile" not in names
    assert "compile mode" in names
    assert "CUDA graphs" not in knobs("compute-bound", base_settings(train__on_nonfinite="skip"), GPU)
    assert "torch.compile" not in knobs("compute-bound", base_settings(train__cuda_graphs=True), GPU)


def test_mixed_precision_mode_follows_the_device() -> None:
    amp = [c for c in candidates_for("compute-bound", base_settings(), GPU) if c.knob == "mixed precision"]
    assert amp[0].changes == (("train.amp_mode", "bf16"),) and amp[0].numerics
    fp16 = TuneContext(True, bf16=False)
    amp = [c for c in candidates_for("compute-bound", base_settings(), fp16) if c.knob == "mixed precision"]
    assert amp[0].changes == (("train.amp_mode", "fp16"),)


def test_unknown_verdict_raises() -> None:
    with pytest.raises(ValueError, match="unknown verdict"):
        candidates_for("memory-bound", base_settings(), CPU)


def test_apply_changes_and_labels() -> None:
    settings = base_settings()
    candidate = candidates_for("compute-bound", settings, CPU)[0]
    assert candidate.label == "optim.enable_fused=true"
    updated = apply_changes(settings, candidate.changes)
    assert updated["optim.enable_fused"] is True and settings["optim.enable_fused"] is False
    with pytest.raises(KeyError):
        apply_changes(settings, (("train.nonsense", 1),))
