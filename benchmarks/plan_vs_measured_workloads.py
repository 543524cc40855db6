"""``dlscale plan``'s traced estimate (any workload) against the measured peak of training steps on the CPU.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/plan_vs_measured_workloads.py \
        [--cases cnn_mnist,unet_cosmo] [--out benchmarks/results]

The workloads without a cost model of their own are planned from a trace on fake tensors
(:mod:`dlscale.perf.plan.traced_memory`, :mod:`dlscale.perf.plan.traced_layouts`). This measures, for each case of
:data:`CASES` (a shipped config at a CPU size, on synthetic data), fp32 and bf16, serial and on 2 forked gloo
ranks with DDP and with FSDP2, the true peak of a training step as ``dlscale train`` runs it (zero_grad,
forward under autocast, the workload's loss in fp32, backward, the config's optimizer; after a warm-up step,
so that the optimizer's state exists), the same way as benchmarks/plan_vs_measured.py does for the ViT
(:mod:`allocation_trace`: torch.profiler's allocation events, every tensor of the run made inside the profile,
a known sequence checking the method first). A second step with saved-tensor hooks splits the bytes live at
the peak into parameters, gradients, optimizer state, saved for backward, the batch and the rest.

The estimate is the plan's row of that layout for the busiest rank, without the CUDA allowance (a CPU has no
CUDA context). Adding a workload is one line of :data:`CASES`. Results:
``benchmarks/results/<date>-cpu-plan-vs-measured-workloads.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import warnings
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from allocation_trace import (
    MEASURED_STEP,
    PHASES,
    AllocationTrace,
    ProfilerMarkers,
    step_breakdown,
    verify_tracking,
)
from benchmark_text import command_line
from torch.profiler import ProfilerActivity, profile, record_function
from workload_plan_report import figure, markdown

from dlscale import __version__
from dlscale.cli import main as dlscale_main
from dlscale.config import load_run_config
from dlscale.parallel.data_parallel import wrap_data_parallel
from dlscale.parallel.parallel_config import ParallelConfig
from dlscale.perf.plan.traced_layouts import (
    DataParallelLayout,
    OptimizerMemory,
    estimate_traced_memory,
    layout_problems,
)
from dlscale.perf.plan.traced_memory import TensorSpec, trace_training_step
from dlscale.report.figures import save_png
from dlscale.run.assembly import batch_sizes
from dlscale.runtime.atomic_files import write_text_atomically
from dlscale.runtime.device import Device
from dlscale.runtime.distributed import start_process_group, stop_process_group
from dlscale.runtime.launch import detect_process
from dlscale.runtime.local_ranks import run_ranks
from dlscale.training.optim import build_optimizer
from dlscale.training.precision import Precision
from dlscale.training.schedule import LRSchedule
from dlscale.training.step import TrainStep
from dlscale.workloads import get_workload

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DATA = REPO / "data" / "plan_bench"  # generated once, git-ignored


@dataclasses.dataclass(frozen=True)
class WorkloadCase:
    """A workload at a CPU size: a shipped config, its overrides, and the `dlscale data` command for its data
    (``--out`` is added; None: the config's own data is used)."""

    name: str
    config_file: str
    config: str
    overrides: tuple[str, ...] = ()
    data_command: tuple[str, ...] | None = None


UNET = ("model.base_channels=8", "train.global_batch_size=8")
# One line per workload; the example package's workload is added the same way (its config and data command).
CASES = [
    WorkloadCase("cnn_mnist", "configs/cnn_mnist.yaml", "demo", (), ("synth-mnist", "--preset", "tiny")),
    WorkloadCase(
        "resnet_cifar", "configs/resnet_cifar.yaml", "demo", (), ("synth-cifar", "--preset", "tiny")
    ),
    WorkloadCase("unet_cosmo", "configs/unet_cosmo.yaml", "tiny", UNET, ("synth-cosmo", "--preset", "tiny")),
    # FSDP2 refuses the channels-last U-Net (the plan says so too): its weights in the default layout.
    WorkloadCase(
        "unet_cosmo_ncdhw",
        "configs/unet_cosmo.yaml",
        "tiny",
        (*UNET, "model.channels_last=false"),
        ("synth-cosmo", "--preset", "tiny"),
    ),
    # The example package (pip install -e examples/heat2d; its data are written on first use):
    WorkloadCase("heat2d", "examples/heat2d/heat2d.yaml", "demo"),
]
PRECISIONS = ("none", "bf16")
LAYOUTS = (DataParallelLayout("none", 1), DataParallelLayout("ddp", 2), DataParallelLayout("fsdp", 2))
CLASSIFIED_STEP = "classified_step"


def data_root(case: WorkloadCase) -> Path | None:
    """Where the case's synthetic data is (made now if missing), or None for the config's own."""
    if case.data_command is None:
        return None
    out = DATA / "-".join(arg.strip("-") for arg in case.data_command)  # one copy per data set
    if dlscale_main(["data", *case.data_command, "--out", str(out), "--if-missing"]) != 0:
        raise SystemExit(f"could not make the data of {case.name}")
    return out


def run_config(case: WorkloadCase, amp: str, root: Path | None):
    """The case's config at precision ``amp``."""
    overrides = [*case.overrides, f"train.amp_mode={amp}", "log.progress=none"]
    if root is not None:
        overrides.append(f"data.root={root}")
    return load_run_config(REPO / case.config_file, case.config, overrides, {})


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _address(tensor: torch.Tensor) -> int:
    return _local(tensor).untyped_storage().data_ptr()


def owners(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: list[torch.Tensor]) -> dict:
    """The allocations of each kind of model state, and of the batch (a DTensor by its local shard)."""
    states = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return {
        "parameters": {_address(p) for p in model.parameters()},
        "gradients": {_address(p.grad) for p in model.parameters() if p.grad is not None},
        "optimizer state": {_address(v) for v in states},
        "batch": {_address(t) for t in batch},
    }


def measure_rank(
    rank: int, case: WorkloadCase, amp: str, layout: DataParallelLayout, root: Path | None
) -> dict:
    """This rank's peak of one training step, and what is live at it."""
    process, device = detect_process(), Device(torch.device("cpu"))
    distributed = start_process_group(process, device, timeout_s=120)
    try:
        cfg = run_config(case, amp, root)
        workload = get_workload(cfg.workload).configured(cfg.model, cfg.data)
        _, local_batch = batch_sizes(cfg, layout.dp)
        train = workload.build_datasets(cfg.data)["train"]
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
            torch.manual_seed(0)
            samples = [train[(rank * local_batch + i) % len(train)] for i in range(local_batch)]
            inputs = torch.stack([torch.as_tensor(x) for x, _ in samples])
            targets = torch.stack([torch.as_tensor(y) for _, y in samples])
            del samples
            model = workload.build_model(cfg.model, cfg.data)
            parallel = ParallelConfig(data_parallel="ddp" if layout.wrapper == "none" else layout.wrapper)
            replica = wrap_data_parallel(model, parallel, process, device, None, workload.fsdp_units(model))
            optimizer = build_optimizer(cfg.optim, model.parameters(), cfg.optim.lr)
            step = TrainStep(
                model,
                workload.loss,
                optimizer,
                LRSchedule(peak_lr=cfg.optim.lr, total_steps=4, kind="constant"),
                precision=Precision(amp, device),
                forward=replica,
                markers=ProfilerMarkers(),
            )
            step(inputs, targets, 0)  # warm-up: the optimizer's state and DDP's buckets exist from here on
            with record_function(MEASURED_STEP):
                step(inputs, targets, 1)
            saved: set[int] = set()

            def remember(tensor: torch.Tensor) -> torch.Tensor:
                saved.add(_address(tensor))
                return tensor.detach()  # a detached alias: the tensor would hold its own grad_fn

            with (
                record_function(CLASSIFIED_STEP),
                torch.autograd.graph.saved_tensors_hooks(remember, lambda t: t),
            ):
                step(inputs, targets, 2)
            owned = owners(model, optimizer, [inputs, targets])
        trace = AllocationTrace.from_profile(profiler, set().union(*owned.values()))
        peak = trace.peak(MEASURED_STEP)
        classified = step_breakdown(trace, CLASSIFIED_STEP, owned, saved)
        return {
            "rank": rank,
            "local_batch": local_batch,
            "peak_bytes": peak.bytes,
            "peak_phase": trace.phase_at(MEASURED_STEP, peak.time_ns),
            "phase_peaks": {phase: trace.peak(MEASURED_STEP, phase).bytes for phase in PHASES},
            "classified_peak_bytes": classified["peak_bytes"],
            "at_peak": classified["at_peak"],
            "missed_free_bytes": trace.missed_free_bytes,
        }
    finally:
        if distributed:
            stop_process_group()


def estimate(case: WorkloadCase, amp: str, layout: DataParallelLayout, root: Path | None) -> dict[str, Any]:
    """The plan's estimate for one rank of ``layout`` (the CUDA allowance left out: a CPU has no CUDA context),
    or why the plan says the layout cannot run (``problems``)."""
    cfg = run_config(case, amp, root)
    workload = get_workload(cfg.workload).configured(cfg.model, cfg.data)
    _, local_batch = batch_sizes(cfg, layout.dp)
    first = workload.build_datasets(cfg.data)["train"][0]
    traced = trace_training_step(
        lambda: workload.build_model(cfg.model, cfg.data),
        (TensorSpec.of(first[0]), TensorSpec.of(first[1])),
        workload.loss,
        local_batch,
        amp,
        workload.fsdp_units,
    )
    problems = layout_problems(traced, layout)
    if problems:
        return {"problems": problems}
    optimizer = OptimizerMemory(cfg.optim.optimizer, cfg.optim.momentum)
    memory = estimate_traced_memory(
        traced, optimizer, layout, cfg.parallel.gradient_as_bucket_view, cuda_allowance=0
    )
    return {
        **dataclasses.asdict(memory),
        "model_states": memory.model_states,
        "total": memory.total,
        "parameters_count": traced.parameter_count,
        "optimizer": cfg.optim.optimizer,
    }


def measure_case(case: WorkloadCase, amp: str, layout: DataParallelLayout, root: Path | None) -> dict:
    """Every rank's measurement next to the estimate for the busiest rank; or, for a layout the plan refuses,
    whether training refuses it too."""
    name = f"{case.name} {'fp32' if amp == 'none' else amp} {layout}"
    predicted = estimate(case, amp, layout, root)
    if "problems" in predicted:
        try:
            run_ranks(layout.dp, measure_rank, case, amp, layout, root)
            refused = "no: it trained"
        except RuntimeError as error:
            refused = str(error).strip().splitlines()[-1]
        return {"case": name, "skipped": predicted["problems"][0], "training_says": refused}
    ranks = run_ranks(layout.dp, measure_rank, case, amp, layout, root)
    busiest = max(ranks, key=lambda r: r["peak_bytes"])
    return {
        "case": name,
        "workload": case.name,
        "config": f"{case.config_file} {case.config} {' '.join(case.overrides)}".strip(),
        "amp": amp,
        "wrapper": layout.wrapper,
        "dp": layout.dp,
        "local_batch": busiest["local_batch"],
        "ranks": ranks,
        "estimate_bytes": predicted,
        "measured_peak_bytes": busiest["peak_bytes"],
        "peak_phase": busiest["peak_phase"],
        "at_peak": busiest["at_peak"],
        "ratio_estimate_over_measured": predicted["total"] / busiest["peak_bytes"],
        "classified_minus_measured_bytes": max(
            abs(r["classified_peak_bytes"] - r["peak_bytes"]) for r in ranks
        ),
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(RESULTS), help="results directory")
    parser.add_argument(
        "--cases",
        default=",".join(case.name for case in CASES),
        help=f"comma-separated names of CASES to run (default: all: {', '.join(c.name for c in CASES)})",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    by_name = {case.name: case for case in CASES}
    unknown = [name for name in args.cases.split(",") if name not in by_name]
    if unknown:
        raise SystemExit(f"unknown cases {unknown}; known: {', '.join(by_name)}")
    warnings.filterwarnings("ignore", message="`broadcast_buffers` is deprecated", category=FutureWarning)
    self_check = run_ranks(1, verify_tracking)[0]
    if self_check["peak_bytes"] != self_check["expected_peak_bytes"] or self_check["live_after_bytes"]:
        raise SystemExit(f"the allocation trace does not add up on a known sequence: {self_check}")
    results = []
    for name in args.cases.split(","):
        case = by_name[name]
        root = data_root(case)
        for amp in PRECISIONS:
            for layout in LAYOUTS:
                print(f"measuring {case.name} {amp} {layout} ...", flush=True)
                results.append(measure_case(case, amp, layout, root))
    measured = [c for c in results if "skipped" not in c]
    ratios = [c["ratio_estimate_over_measured"] for c in measured]
    result = {
        "benchmark": "plan-vs-measured-workloads",
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": command_line("benchmarks/plan_vs_measured_workloads.py", argv),
        "device": f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores), 1 thread a rank",
        "torch_version": torch.__version__,
        "dlscale_version": __version__,
        "estimate": "dlscale.perf.plan.traced_layouts.estimate_traced_memory of a fake-tensor trace, busiest rank, "
        "without the CUDA allowance",
        "measurement": "torch.profiler(profile_memory=True): peak of live CPU tensor bytes within a step",
        "self_check": self_check,
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "cases": measured,
        "refused": [c for c in results if "skipped" in c],
    }
    stem = Path(args.out) / f"{result['date'][:10]}-cpu-plan-vs-measured-workloads"
    write_text_atomically(stem.with_suffix(".json"), json.dumps(result, indent=2) + "\n")
    write_text_atomically(stem.with_suffix(".md"), markdown(result))
    save_png(figure(result), stem.with_suffix(".png"))
    print(markdown(result))
    print(f"Results: {stem}.json, .md, .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
