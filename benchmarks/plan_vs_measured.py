"""``dlscale plan``'s memory estimate against the measured peak of whole training steps on the CPU.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/plan_vs_measured.py [--out benchmarks/results]

The unit tests check the activation formula against the bytes autograd saves. This measures the true peak of a
training step (zero_grad, forward, relative-L2 loss, backward, Adam step, after a warm-up step so that Adam's
state exists), which also holds what the estimate leaves out: gradients flowing back, collective copies, the
optimizer's working buffers. Cases: the serial ViT at several sizes, and tp, cp, tp x cp and tp x dp layouts
on forked gloo ranks; fp32 and bf16 autocast. Every case runs in forked processes, one per rank.

How: ``torch.profiler`` with ``profile_memory=True`` records every allocation and free of torch's CPU
allocator, with its size and the allocator's running total. The profile starts before the model is built, so
every tensor of the run is in it, and a step's peak is the highest total inside the step's ``record_function``
range. It counts tensor bytes as requested (no allocator rounding); what is not a torch tensor (gloo's own
buffers, oneDNN scratch space, Python objects) is not in it. A known sequence of tensors checks the method
first. (Process RSS would not do: glibc keeps freed memory, so RSS is no per-step peak.) The profiler misses
frees made on gloo's worker threads; :func:`missed_frees` puts them back.

Two more steps, with saved-tensor hooks that note what autograd saves, split the bytes live at the peak into
parameters, gradients, optimizer state, saved for backward, the batch and the rest; their peaks must equal
the measured step's (the hooks allocate nothing).

The estimate is :func:`dlscale.perf.plan.layout_cost.estimate_memory` of the layout, for its busiest rank, without
the CUDA allowance (a CPU has no CUDA context). Results: ``benchmarks/results/<date>-cpu-plan-vs-measured``
``.json``, ``.md`` and ``.png``.
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
    CATEGORIES,
    MEASURED_STEP,
    PHASES,
    AllocationTrace,
    ProfilerMarkers,
    owner_addresses,
    step_breakdown,
    storage_address,
    verify_tracking,
)
from benchmark_text import MIB, command_line, mib, percent_range
from matplotlib.figure import Figure
from torch.profiler import ProfilerActivity, profile, record_function

from dlscale import __version__
from dlscale.models.vit import VisionTransformer
from dlscale.models.vit_config import ViTConfig
from dlscale.parallel.data_parallel import wrap_data_parallel
from dlscale.parallel.mesh import MeshShape, ParallelMesh
from dlscale.parallel.parallel_config import ParallelConfig
from dlscale.parallel.vit_parallel import parallelize_vit
from dlscale.perf.plan.layout_cost import (
    Layout,
    ModelShape,
    TrainingSettings,
    count_parameters_per_gpu,
    estimate_activation_bytes,
    estimate_memory,
)
from dlscale.perf.plan.saved_tensors import measure_saved_tensor_bytes
from dlscale.report.figures import save_png
from dlscale.runtime.atomic_files import write_text_atomically
from dlscale.runtime.device import Device
from dlscale.runtime.distributed import start_process_group, stop_process_group
from dlscale.runtime.launch import detect_process
from dlscale.runtime.local_ranks import run_ranks
from dlscale.scoring.metrics import relative_l2_loss
from dlscale.training.precision import AMP_DTYPES, Precision
from dlscale.training.schedule import LRSchedule
from dlscale.training.step import TrainStep

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
IN_CHANNELS, OUT_CHANNELS = 20, 20  # as ERA5's configs
PARALLEL_ORDER = "tp-cp-dp"
# Steps run with saved-tensor hooks, to say what is live at the peak: their peaks must equal the measured one.
CLASSIFIED_STEPS = ("classified_step_0", "classified_step_1")
# What is live at a step's peak, by the first of these an allocation belongs to.
MODEL_STATES = CATEGORIES[:3]


@dataclasses.dataclass(frozen=True)
class Case:
    """One measured run: a ViT shape, a local batch, a precision and a dp x tp x cp layout."""

    embed_dim: int
    depth: int
    img_size: tuple[int, int]
    local_batch: int
    amp: str
    tp: int = 1
    cp: int = 1
    dp: int = 1
    num_heads: int = 4
    patch_size: int = 4

    @property
    def world(self) -> int:
        """Ranks the case runs on."""
        return self.dp * self.tp * self.cp

    @property
    def layout(self) -> str:
        """The parallel sizes above 1, or "serial"."""
        sizes = {"tp": self.tp, "cp": self.cp, "dp": self.dp}
        return " x ".join(f"{name}={size}" for name, size in sizes.items() if size > 1) or "serial"

    @property
    def name(self) -> str:
        """Width, depth, image, local batch, layout and precision, as the table shows them."""
        height, width = self.img_size
        precision = "fp32" if self.amp == "none" else self.amp
        return (
            f"D{self.embed_dim} L{self.depth} {height}x{width} b{self.local_batch} {self.layout} {precision}"
        )

    def vit_config(self) -> ViTConfig:
        """The model section of this case."""
        return ViTConfig(
            embed_dim=self.embed_dim, depth=self.depth, num_heads=self.num_heads, patch_size=self.patch_size
        )


SERIAL_SHAPES = [  # (embed_dim, depth, image, local batch): width, depth, token count and batch all vary
    (64, 2, (32, 64), 8),
    (128, 3, (48, 96), 4),
    (192, 4, (32, 64), 4),
    (96, 2, (48, 96), 2),
]
PARALLEL_SHAPE = (128, 2, (48, 96), 4)
PARALLEL_LAYOUTS = [{"tp": 2}, {"cp": 2}, {"tp": 2, "cp": 2}, {"tp": 2, "dp": 2}]
CASES = [
    *(Case(d, depth, img, b, amp) for d, depth, img, b in SERIAL_SHAPES for amp in ("none", "bf16")),
    *(Case(*PARALLEL_SHAPE, amp, **layout) for layout in PARALLEL_LAYOUTS for amp in ("none", "bf16")),
]


def start_mesh(case: Case) -> tuple[ParallelMesh, Device]:
    """Join the forked ranks' gloo group and build this rank's mesh."""
    process = detect_process()
    device = Device(torch.device("cpu"))
    start_process_group(process, device, timeout_s=120)
    shape = MeshShape.for_world(process.world_size, case.tp, case.cp, PARALLEL_ORDER)
    return ParallelMesh.create(shape, process.rank), device


def measure_rank(rank: int, case: Case) -> dict[str, Any]:
    """This rank's step peaks and what is live at them, and the bytes its forward saves for backward."""
    distributed = case.world > 1
    mesh, device = start_mesh(case) if distributed else (None, Device(torch.device("cpu")))
    try:
        # Everything the run allocates is made inside the profile, so every free is matched to its allocation.
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
            torch.manual_seed(0)
            vit = VisionTransformer(case.vit_config(), case.img_size, IN_CHANNELS, OUT_CHANNELS)
            model = parallelize_vit(vit, mesh) if distributed else vit
            trained = model
            if distributed:
                config = ParallelConfig(tensor_parallel=case.tp, context_parallel=case.cp)
                trained = wrap_data_parallel(model, config, detect_process(), device, mesh)
            # tp and cp ranks of one replica see the same samples; each dp rank its own.
            generator = torch.Generator().manual_seed(mesh.dp_rank if distributed else 0)
            inputs = torch.randn(case.local_batch, IN_CHANNELS, *case.img_size, generator=generator)
            targets = torch.randn(case.local_batch, OUT_CHANNELS, *case.img_size, generator=generator)
            saved_bytes = measure_saved_tensor_bytes(
                model, inputs, lambda out: relative_l2_loss(out.float(), targets), AMP_DTYPES[case.amp]
            )
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
            step = TrainStep(
                trained,
                relative_l2_loss,
                optimizer,
                LRSchedule(peak_lr=1e-4, total_steps=len(CLASSIFIED_STEPS) + 2, kind="constant"),
                precision=Precision(case.amp, device),
                markers=ProfilerMarkers(),
            )
            step(inputs, targets, 0)  # warm-up: Adam's state and the gradients exist from here on
            with record_function(MEASURED_STEP):
                step(inputs, targets, 1)
            owners, saved = {}, {}
            for index, name in enumerate(CLASSIFIED_STEPS, start=2):
                saved[name] = set()

                def remember(tensor: torch.Tensor, noted: set[int] = saved[name]) -> torch.Tensor:
                    noted.add(storage_address(tensor))
                    # a detached alias: the tensor itself would make a saved output hold its own grad_fn
                    return tensor.detach()

                hooks = torch.autograd.graph.saved_tensors_hooks(remember, lambda tensor: tensor)
                with record_function(name), hooks:
                    step(inputs, targets, index)
                owners[name] = owner_addresses(model, optimizer, [inputs, targets])
        trace = AllocationTrace.from_profile(profiler, set().union(*owners[CLASSIFIED_STEPS[-1]].values()))
        measured = trace.peak(MEASURED_STEP)
        return {
            "rank": rank,
            "peak_bytes": measured.bytes,
            "peak_phase": trace.phase_at(MEASURED_STEP, measured.time_ns),
            "phase_peaks": {phase: trace.peak(MEASURED_STEP, phase).bytes for phase in PHASES},
            "classified_steps": {
                name: step_breakdown(trace, name, owners[name], saved[name]) for name in saved
            },
            "missed_frees": trace.missed_frees,
            "missed_free_bytes": trace.missed_free_bytes,
            "saved_activations": saved_bytes.activations,
            "saved_parameter_copies": saved_bytes.parameter_copies,
        }
    finally:
        if distributed:
            stop_process_group()


def estimate(case: Case) -> dict[str, Any]:
    """What dlscale plan estimates for the busiest rank of ``case`` (the CUDA allowance left out)."""
    shape = ModelShape.from_config(case.vit_config(), case.img_size, IN_CHANNELS, OUT_CHANNELS)
    # The CPU step measured here has no loader copying batches ahead to a device.
    settings = TrainingSettings(
        global_batch_size=case.local_batch * case.dp, amp_mode=case.amp, device_batches_ahead=0
    )
    layout = Layout(case.dp, case.tp, case.cp)
    memory = dataclasses.replace(estimate_memory(shape, settings, layout), cuda_allowance=0)
    return {
        **dataclasses.asdict(memory),
        "model_states": memory.model_states,
        "total": memory.total,
        "activations_formula": estimate_activation_bytes(
            shape, case.amp, case.local_batch, case.tp, case.cp
        ).total,
        "local_parameters": count_parameters_per_gpu(shape, settings, layout).local,
    }


def measure_case(case: Case) -> dict[str, Any]:
    """Every rank's measurement, the busiest rank's peak and what it holds, and the estimate for that rank."""
    ranks = run_ranks(case.world, measure_rank, case)
    busiest = max(ranks, key=lambda r: r["peak_bytes"])
    predicted = estimate(case)
    return {
        "case": case.name,
        "layout": case.layout,
        **dataclasses.asdict(case),
        "ranks": ranks,
        "busiest_rank": busiest["rank"],
        "estimate_bytes": predicted,
        "measured_peak_bytes": busiest["peak_bytes"],
        "peak_phase": busiest["peak_phase"],
        "at_peak": busiest["classified_steps"][CLASSIFIED_STEPS[0]]["at_peak"],
        "ratio_estimate_over_measured": predicted["total"] / busiest["peak_bytes"],
        "output_image_bytes": case.local_batch * OUT_CHANNELS * case.img_size[0] * case.img_size[1] * 4,
        "saved_activations_measured": busiest["saved_activations"],
        "saved_activations_estimated": predicted["activations_formula"],
        # 0 when the hooks change nothing and the missed frees are put right (the steps are then identical)
        "classified_minus_measured_max_bytes": max(
            abs(step["peak_bytes"] - r["peak_bytes"])
            for r in ranks
            for step in r["classified_steps"].values()
        ),
    }


def summarize(cases: list[dict[str, Any]], self_check: dict[str, int], argv: list[str]) -> dict[str, Any]:
    """One JSON document: every case, the self-check, the machine and the command."""
    ratios = ratios_of(cases)
    return {
        "benchmark": "plan-vs-measured",
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": command_line("benchmarks/plan_vs_measured.py", argv),
        "device": f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores), 1 thread a rank",
        "torch_version": torch.__version__,
        "dlscale_version": __version__,
        "estimate": "dlscale.perf.plan.layout_cost.estimate_memory, busiest rank, without the CUDA allowance",
        "measurement": "torch.profiler(profile_memory=True): peak of live CPU tensor bytes within a step",
        "self_check": self_check,
        "in_out_channels": [IN_CHANNELS, OUT_CHANNELS],
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "cases": cases,
    }


def reading(result: dict[str, Any]) -> str:
    """What the numbers say: how far the estimate is from the peak, and why (worded from the numbers)."""
    cases = result["cases"]
    ratios = ratios_of(cases)
    below = [c for c in cases if c["ratio_estimate_over_measured"] < 1]
    over = [c["case"] for c in cases if c["ratio_estimate_over_measured"] >= 1]
    phases = sorted({c["peak_phase"] for c in cases})
    exact = sum(c["saved_activations_measured"] == c["saved_activations_estimated"] for c in cases)
    share = {
        kind: [c["at_peak"][kind] / c["measured_peak_bytes"] for c in cases] for kind in ("other", "batch")
    }
    no_gradients = [c for c in cases if c["at_peak"]["gradients"] == 0]
    in_images = [c["at_peak"]["other"] / c["output_image_bytes"] for c in cases]
    images = f"{min(in_images):.1f}-{max(in_images):.1f}"
    sentences = [
        f"The estimate is {percent_range(ratios)} of the measured peak, below it in {len(below)} of "
        f"{len(cases)} cases; the activation formula matches what autograd saves byte for byte in {exact} of "
        f"{len(cases)}, so the gap is made of what the estimate does not model.",
        f"Every peak falls in the {' or '.join(phases)}, where the estimate misses the batch "
        f"({percent_range(share['batch'])} of the peak: the targets, and under bf16 the fp32 inputs, which only "
        f"fp32's convolution saves) and other tensors ({percent_range(share['other'])}, {images} times an fp32 "
        "output image: the fp32 copy of the output and the image-sized gradients of the loss's backward).",
    ]
    if no_gradients:
        sentences.append(
            f"It also counts a gradient for every parameter, yet in {len(no_gradients)} cases none exists at the "
            "peak: zero_grad(set_to_none=True) frees them and the peak comes early in backward, before the first "
            "is made; only under DDP (cp, dp) do the gradients live on, in its buckets."
        )
    if over:
        sentences.append(
            f"Where the model's state outweighs its activations ({', '.join(over)}), that gradient term is larger "
            "than what is missed and the estimate lands above the peak."
        )
    sentences.append(
        "On a GPU the caching allocator's rounding and fragmentation and the libraries' workspaces come on top "
        "of these tensor bytes."
    )
    return " ".join(sentences)


def markdown(result: dict[str, Any]) -> str:
    """The result as a Markdown report: what was run where, one row per case, and the reading."""
    check = result["self_check"]
    cases = result["cases"]
    mismatch = max(c["classified_minus_measured_max_bytes"] for c in cases)
    missed = max(r["missed_free_bytes"] for c in cases for r in c["ranks"])
    ranks_agree = all(len({r["peak_bytes"] for r in c["ranks"]}) == 1 for c in cases)
    lines = [
        "# dlscale plan's memory estimate vs the measured peak of a training step (CPU)",
        "",
        f"- date: {result['date']}",
        f"- command: `{result['command']}`",
        f"- device: {result['device']}; torch {result['torch_version']}, dlscale {result['dlscale_version']}",
        f"- estimate: {result['estimate']} (a CPU has no CUDA context)",
        f"- measured: {result['measurement']}: zero_grad, forward, relative-L2 loss, backward, Adam, after a "
        "warm-up step; tensor bytes as requested (no allocator rounding); the busiest rank",
        f"- self-check: a known sequence of tensors peaks at {check['peak_bytes']} bytes (expected "
        f"{check['expected_peak_bytes']}) and ends at {check['live_after_bytes']} (expected "
        f"{check['expected_live_after_bytes']}); the steps with saved-tensor hooks that split the peak differ "
        f"from the measured step by {mismatch} bytes at most",
        f"- gloo ranks: the profiler does not record the frees that gloo's worker threads make; they were put "
        f"back at the end of their collective (up to {mib(missed)} MiB over a rank's whole run); "
        f"{'every' if ranks_agree else 'not every'} rank of a layout then peaks at the same byte count",
        f"- ViT with 4 heads, patch 4, MLP ratio 4, {IN_CHANNELS} channels in and out; MiB = 2^20 bytes",
        "",
        "| case | ranks | estimated MiB | measured peak MiB | estimate / measured | peak in | saved activations "
        "measured / estimated MiB | at the peak: model states / saved / batch / other MiB |",
        "|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for case in cases:
        at_peak = case["at_peak"]
        lines.append(
            f"| {case['case']} | {len(case['ranks'])} | {mib(case['estimate_bytes']['total'])} "
            f"| {mib(case['measured_peak_bytes'])} | {case['ratio_estimate_over_measured']:.2f} "
            f"| {case['peak_phase']} "
            f"| {mib(case['saved_activations_measured'])} / {mib(case['saved_activations_estimated'])} "
            f"| {mib(sum(at_peak[k] for k in MODEL_STATES))} / {mib(at_peak['saved for backward'])} "
            f"/ {mib(at_peak['batch'])} / {mib(at_peak['other'])} |"
        )
    return "\n".join([*lines, "", reading(result), ""])


def figure(result: dict[str, Any]) -> Figure:
    """Per case, the estimate and the measured peak side by side, each split into its parts; and their ratio."""
    cases = result["cases"]
    fig = Figure(figsize=(max(8.0, 0.7 * len(cases) + 2), 6.4), layout="constrained")
    bars, ratios = fig.subplots(2, 1, height_ratios=[3, 1], sharex=True)
    estimated = {
        "estimate: model states": [c["estimate_bytes"]["model_states"] for c in cases],
        "estimate: activations and autocast copies": [
            c["estimate_bytes"]["activations"] + c["estimate_bytes"]["autocast_weight_copies"] for c in cases
        ],
    }
    measured = {
        "peak: model states": [sum(c["at_peak"][k] for k in MODEL_STATES) for c in cases],
        **{f"peak: {kind}": [c["at_peak"][kind] for c in cases] for kind in CATEGORIES[3:]},
    }
    colors = iter(["#4c72b0", "#8fb0de", "#dd8452", "#f3b98a", "#999999", "#c44e52"])
    for offset, parts in ((-0.2, estimated), (0.2, measured)):
        bottom = [0.0] * len(cases)
        for label, values in parts.items():
            heights = [value / MIB for value in values]
            positions = [index + offset for index in range(len(cases))]
            bars.bar(positions, heights, 0.4, bottom=bottom, label=label, color=next(colors))
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    bars.set_ylabel("MiB (busiest rank)")
    bars.set_title(
        f"dlscale plan's estimate (left bar) vs the measured step peak (right bar), CPU, {result['date'][:10]}",
        fontsize=10,
    )
    bars.legend(fontsize=7, ncols=2)
    ratios.bar(range(len(cases)), ratios_of(cases), 0.6, color="#4c72b0")
    ratios.axhline(1.0, color="gray", ls="--", lw=1)
    ratios.set_ylabel("estimate / peak")
    ratios.set_xticks(range(len(cases)), [c["case"] for c in cases], rotation=60, ha="right", fontsize=7)
    return fig


def ratios_of(cases: list[dict[str, Any]]) -> list[float]:
    """Estimate / measured peak of each case."""
    return [case["ratio_estimate_over_measured"] for case in cases]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(RESULTS), help="results directory")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    # DDP's own deprecation notice, once per rank and case: noise in this benchmark's output.
    warnings.filterwarnings("ignore", message="`broadcast_buffers` is deprecated", category=FutureWarning)
    self_check = run_ranks(1, verify_tracking)[0]
    if self_check["peak_bytes"] != self_check["expected_peak_bytes"] or self_check["live_after_bytes"]:
        raise SystemExit(f"the allocation trace does not add up on a known sequence: {self_check}")
    cases = []
    for case in CASES:
        print(f"measuring {case.name} on {case.world} rank(s) ...", flush=True)
        cases.append(measure_case(case))
    result = summarize(cases, self_check, argv)
    stem = Path(args.out) / f"{result['date'][:10]}-cpu-plan-vs-measured"
    write_text_atomically(stem.with_suffix(".json"), json.dumps(result, indent=2) + "\n")
    write_text_atomically(stem.with_suffix(".md"), markdown(result))
    save_png(figure(result), stem.with_suffix(".png"))
    print(markdown(result))
    print(f"Results: {stem}.json, .md, .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
