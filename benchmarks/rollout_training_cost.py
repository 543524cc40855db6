"""What multi-step training costs: time per sample and peak memory of one training step of the demo ViT for
K = 1, 2, 4 autoregressive steps (``train.rollout_steps``), with and without ``train.rollout_checkpointing``,
beside the saved-activation estimate of ``dlscale plan``.

    OMP_NUM_THREADS=2 PYTHONPATH=src python benchmarks/rollout_training_cost.py [--ks 1 2 4] [--trials 5]
        [--steps 4] [--warmup 2] [--device cpu|cuda] [--quick]

The step is the one a run builds (``dlscale.run.assembly``): the config ``demo`` of configs/vit_era5.yaml (ViT
embed 128, depth 4, 4 heads, patch 4, 32 x 64 grid, 20 channels, batch 16, Adam, fp32) built by the era5_vit
workload, ``TrainStep`` with ``RolloutLoss(workload.loss, RolloutCurriculum.constant(K), checkpointing)`` for
K > 1 and the plain one-step loss for K = 1 (what a run with ``rollout_steps: 1`` trains; checkpointing has
nothing to do there, so K = 1 runs without it). The batch is random tensors of the demo's shapes: inputs
(16, 20, 32, 64), targets (16, K, 20, 32, 64) (no files are read). ``--quick`` takes the config ``tiny`` (embed
32, depth 2, 16 x 32, batch 4) and few steps: a smoke test of seconds.

Time: ``--warmup`` steps, then ``--trials`` trials of ``--steps`` steps each, the device synchronized around
every trial; seconds per sample (trial seconds / steps / batch) with its mean and 95 % interval over the
trials, and its ratio to K = 1 and checkpointing's ratio to the same K without it, both with the interval of a
ratio of two sets of trials (:func:`dlscale.perf.bench.intervals.ratio_interval`).

Memory of one marked step (after one warm-up step, so that Adam's state and the gradients exist):

* CPU: ``torch.profiler`` records every allocation and free of torch's allocator from before the model is built
  (:class:`allocation_trace.AllocationTrace`), so the peak is of tensor bytes, not allocator pools; besides the
  step's peak, the bytes live when the forward starts (parameters, Adam's moments, the batch: zero_grad has
  just freed the gradients), the most bytes above that during forward and backward, the gradients live at
  that moment, and what the forward leaves live for backward (the forward's end). The profiled steps are not
  timed.
* GPU: ``torch.cuda.max_memory_allocated`` of the step after a reset, and the same two figures from the
  allocated bytes at the forward's start and end and the peak of forward and backward (reset at the forward's
  start); the gradients live at the peak are not known there (at most the parameters' bytes).

Measured activations = the most bytes above the forward's start minus the gradients live then: what autograd
saves (and, with checkpointing, the one step recomputed in backward) plus backward's transient buffers. Beside
it, ``rollout_activation_bytes`` of ``dlscale plan`` (layout_cost.py) on the demo's ``ModelShape``, and the
plan's whole-step estimate (``estimate_memory``, no CUDA allowance, no batches loaded ahead).

Every case runs in a fresh process (spawned): no allocator cache, warmed kernel choice or page-faulted heap
that an earlier case left behind flatters a later one, and the CPU profile of a case starts empty.

Results: ``benchmarks/results/<date>-<device>-rollout-training-cost.json``, ``.md`` and ``.png`` (``-quick``
added with ``--quick``). ``--from-json RECORD`` writes the Markdown and PNG again from a record (with a
"meaning" paragraph added to it by hand after a real run).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import multiprocessing
import os
import platform
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from allocation_trace import MEASURED_STEP, PHASES, AllocationTrace, ProfilerMarkers, owner_addresses
from benchmark_text import MIB, command_line, mib
from matplotlib.figure import Figure
from torch.profiler import ProfilerActivity, profile, record_function

from dlscale.perf.bench.intervals import mean_interval, ratio_interval
from dlscale.runtime.atomic_files import write_text_atomically
from dlscale.runtime.device import Device

REPO = Path(__file__).resolve().parents[1]
CONFIG_FILE = "configs/vit_era5.yaml"
FULL = {"config": "demo", "trials": 5, "steps": 4, "warmup": 2}
QUICK = {"config": "tiny", "trials": 2, "steps": 2, "warmup": 1}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--ks", type=int, nargs="+", default=[1, 2, 4], help="rollout steps K (1 comes first)"
    )
    parser.add_argument("--trials", type=int, help=f"timed trials per case (default {FULL['trials']})")
    parser.add_argument("--steps", type=int, help=f"training steps per trial (default {FULL['steps']})")
    parser.add_argument(
        "--warmup", type=int, help=f"untimed steps before the trials (default {FULL['warmup']})"
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="the config tiny and 2 trials of 2 steps: a smoke test of seconds",
    )
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    parser.add_argument("--from-json", help="write the Markdown and PNG again from this run record")
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    args.config = defaults["config"]
    for key in ("trials", "steps", "warmup"):
        if getattr(args, key) is None:
            setattr(args, key, defaults[key])
    if args.trials < 2:
        parser.error(f"--trials must be >= 2 for an interval, got {args.trials}")
    if args.steps < 1 or args.warmup < 0:
        parser.error(f"--steps must be >= 1 and --warmup >= 0, got {args.steps} and {args.warmup}")
    if min(args.ks) < 1:
        parser.error(f"--ks must be >= 1, got {args.ks}")
    args.ks = sorted(set(args.ks) | {1})  # K = 1 is the baseline every ratio is taken against
    if args.device == "cuda" and not args.from_json and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA GPU on this machine")
    return args


def cases(ks: list[int]) -> list[tuple[int, bool]]:
    """(K, checkpointing) of every case: K = 1 without checkpointing only, every larger K without and with."""
    return [(k, checkpointing) for k in ks for checkpointing in ((False,) if k == 1 else (False, True))]


# ------------------------------------------------------------------------------------------- measuring


@dataclasses.dataclass
class Settings:
    """What a case process needs (picklable for the spawned process)."""

    config: str
    steps_k: int
    checkpointing: bool
    device: str
    trials: int
    steps: int
    warmup: int


def load_config(settings: Settings):
    """The run config of the case: the chosen config with its K and checkpointing set."""
    from dlscale.config import load_run_config

    overrides = [
        f"train.rollout_steps={settings.steps_k}",
        f"train.rollout_checkpointing={str(settings.checkpointing).lower()}",
    ]
    return load_run_config(REPO / CONFIG_FILE, settings.config, overrides)


def build_step(cfg: Any, device: Device, markers: Any) -> tuple[Any, torch.nn.Module, torch.optim.Optimizer]:
    """The TrainStep a run with ``cfg`` trains with (single process, no DDP, no compile), and its model."""
    from dlscale.training.optim import build_optimizer
    from dlscale.training.precision import Precision
    from dlscale.training.rollout_curriculum import RolloutCurriculum
    from dlscale.training.rollout_loss import RolloutLoss
    from dlscale.training.schedule import LRSchedule
    from dlscale.training.step import TrainStep
    from dlscale.workloads import get_workload

    workload = get_workload(cfg.workload)
    torch.manual_seed(0)
    model = workload.build_model(cfg.model, cfg.data).to(device.torch)
    optimizer = build_optimizer(cfg.optim, model.parameters(), cfg.optim.lr)
    steps_k = cfg.train.rollout_steps
    # As dlscale.run.assembly: the rollout loss for K > 1, the workload's plain loss for K = 1.
    rollout = (
        RolloutLoss(workload.loss, RolloutCurriculum.constant(steps_k), cfg.train.rollout_checkpointing)
        if steps_k > 1
        else None
    )
    step = TrainStep(
        model,
        workload.loss,
        optimizer,
        LRSchedule(peak_lr=cfg.optim.lr, total_steps=1 << 30, kind="constant"),
        cfg.optim.max_grad_norm,
        Precision(cfg.train.amp_mode, device),
        markers=markers,
        training_loss=rollout,
    )
    return step, model, optimizer


def random_batch(cfg: Any, device: Device) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs (B, C, H, W) and targets (B, K, C, H, W) of the config's shapes ((B, C, H, W) for K = 1)."""
    generator = torch.Generator().manual_seed(1)
    batch, steps_k = cfg.train.global_batch_size, cfg.train.rollout_steps
    inputs = torch.randn(batch, cfg.data.n_in_channels, *cfg.data.img_size, generator=generator)
    target_shape = (batch, *((steps_k,) if steps_k > 1 else ()), cfg.data.n_out_channels, *cfg.data.img_size)
    targets = torch.randn(*target_shape, generator=generator)
    return inputs.to(device.torch), targets.to(device.torch)


class CudaMemoryMarkers:
    """TrainStep's phases on a GPU: the bytes allocated at the forward's start and end, and the peak of
    forward and backward (the peak statistics reset when the forward starts)."""

    def __init__(self, device: Device):
        self.device = device
        self.forward_start = self.forward_end = self.forward_backward_peak = 0

    @contextlib.contextmanager
    def range(self, name: str) -> Iterator[None]:
        if name == "forward":
            self.device.synchronize()
            self.forward_start = torch.cuda.memory_allocated(self.device.torch)
            torch.cuda.reset_peak_memory_stats(self.device.torch)
        yield
        if name in ("forward", "backward"):
            self.device.synchronize()
        if name == "forward":
            self.forward_end = torch.cuda.memory_allocated(self.device.torch)
        if name == "backward":
            self.forward_backward_peak = torch.cuda.max_memory_allocated(self.device.torch)


def cpu_memory(cfg: Any, device: Device) -> dict[str, Any]:
    """The marked step's memory from a profile that holds every allocation of the case (see the docstring)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        step, model, optimizer = build_step(cfg, device, ProfilerMarkers())
        inputs, targets = random_batch(cfg, device)
        step(inputs, targets, 0)  # Adam's state and the gradients exist from here on
        with record_function(MEASURED_STEP):
            step(inputs, targets, 1)
        owners = owner_addresses(model, optimizer, [inputs, targets])
    trace = AllocationTrace.from_profile(profiler, set().union(*owners.values()))
    forward_start, forward_end = trace.window(MEASURED_STEP, "forward")
    peak = max((trace.peak(MEASURED_STEP, phase) for phase in PHASES[:2]), key=lambda p: p.bytes)
    # The gradients are known by their allocation events (addresses are reused): those live at the step's end.
    at_end = trace.live_allocations_at(trace.window(MEASURED_STEP)[1])
    gradients = {at_end[a][0] for a in owners["gradients"] if a in at_end}
    at_peak = trace.live_allocations_at(peak.time_ns).values()
    return {
        "step_peak_bytes": trace.peak(MEASURED_STEP).bytes,
        "step_peak_phase": trace.phase_at(MEASURED_STEP, trace.peak(MEASURED_STEP).time_ns),
        "forward_start_bytes": trace.live_at(forward_start),
        "held_after_forward_bytes": trace.live_at(forward_end) - trace.live_at(forward_start),
        "above_forward_start_bytes": peak.bytes - trace.live_at(forward_start),
        "peak_phase": trace.phase_at(MEASURED_STEP, peak.time_ns),
        "gradients_at_peak_bytes": sum(size for identity, size in at_peak if identity in gradients),
        "missed_frees": trace.missed_frees,
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def cuda_memory(cfg: Any, device: Device) -> dict[str, Any]:
    """The marked step's memory from the CUDA allocator's statistics (see the docstring)."""
    markers = CudaMemoryMarkers(device)
    step, model, _ = build_step(cfg, device, markers)
    inputs, targets = random_batch(cfg, device)
    step(inputs, targets, 0)
    device.synchronize()
    device.reset_peak_memory()
    step(inputs, targets, 1)
    device.synchronize()
    return {
        "step_peak_bytes": torch.cuda.max_memory_allocated(device.torch),
        "step_peak_phase": None,
        "forward_start_bytes": markers.forward_start,
        "held_after_forward_bytes": markers.forward_end - markers.forward_start,
        "above_forward_start_bytes": markers.forward_backward_peak - markers.forward_start,
        "peak_phase": None,
        "gradients_at_peak_bytes": None,
        "missed_frees": None,
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def timed_trials(settings: Settings, cfg: Any, device: Device) -> list[float]:
    """Seconds per sample of each trial, after the warm-up steps (a fresh model, unprofiled)."""
    from dlscale.runtime.nvtx import NO_MARKERS

    step, _, _ = build_step(cfg, device, NO_MARKERS)
    inputs, targets = random_batch(cfg, device)
    global_step = 0
    for _ in range(settings.warmup):
        step(inputs, targets, global_step)
        global_step += 1
    seconds = []
    for _ in range(settings.trials):
        device.synchronize()
        began = time.perf_counter()
        for _ in range(settings.steps):
            step(inputs, targets, global_step)
            global_step += 1
        device.synchronize()
        seconds.append((time.perf_counter() - began) / settings.steps / inputs.shape[0])
    return seconds


def estimate(cfg: Any) -> dict[str, int]:
    """dlscale plan's figures for the case: the K-step saved activations and the whole step (one process)."""
    from dlscale.perf.plan.layout_cost import (
        FP32_BYTES,
        Layout,
        ModelShape,
        TrainingSettings,
        estimate_activation_bytes,
        estimate_memory,
        rollout_activation_bytes,
    )

    shape = ModelShape.from_config(
        cfg.model, cfg.data.img_size, cfg.data.n_in_channels, cfg.data.n_out_channels
    )
    # The measured step has no loader copying batches ahead, and no CUDA context on the CPU.
    settings = dataclasses.replace(TrainingSettings.from_run_config(cfg), device_batches_ahead=0)
    batch = cfg.train.global_batch_size
    one_step = estimate_activation_bytes(shape, settings.amp_mode, batch)
    state = batch * shape.in_channels * shape.pixels * FP32_BYTES
    memory = dataclasses.replace(estimate_memory(shape, settings, Layout(1, 1, 1)), cuda_allowance=0)
    return {
        "activations_bytes": rollout_activation_bytes(one_step.total, one_step.loss, state, settings),
        "one_step_activations_bytes": one_step.total,
        "state_bytes": state,
        "loss_bytes": one_step.loss,
        "step_total_bytes": memory.total,
        "model_states_bytes": memory.model_states,
        "batch_bytes": memory.batch,
    }


def measure_case(settings: Settings) -> dict[str, Any]:
    """One case, in its own process: memory of a marked step, then the timed trials, and the plan's estimate."""
    device = Device(settings.device)
    cfg = load_config(settings)
    memory = (cuda_memory if device.is_gpu else cpu_memory)(cfg, device)
    seconds = timed_trials(settings, cfg, device)
    return {
        "rollout_steps": settings.steps_k,
        "checkpointing": settings.checkpointing,
        "seconds_per_sample": seconds,
        "memory": memory,
        "estimate": estimate(cfg),
        "threads": torch.get_num_threads(),
        "device_name": device.name,
        "driver": device.driver_version(),
    }


def run_case(settings: Settings) -> dict[str, Any]:
    """``measure_case`` in a freshly spawned process."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(measure_case, settings).result()


# ------------------------------------------------------------------------------------------- summarizing


def interval(values: list[float]) -> dict[str, float]:
    found = mean_interval(values)
    return {"mean": found.mean, "low": found.low, "high": found.high, "trials": found.trials}


def ratio(numerator: list[float], denominator: list[float]) -> dict[str, float]:
    found = ratio_interval(numerator, denominator)
    return {"ratio": found.ratio, "low": found.low, "high": found.high}


def find_case(record: dict[str, Any], steps_k: int, checkpointing: bool) -> dict[str, Any] | None:
    return next(
        (c for c in record["cases"] if c["rollout_steps"] == steps_k and c["checkpointing"] == checkpointing),
        None,
    )


def measured_activations(case: dict[str, Any]) -> int:
    """The most bytes above the forward's start, less the gradients then live (0 where not known: GPU)."""
    memory = case["memory"]
    return memory["above_forward_start_bytes"] - (memory["gradients_at_peak_bytes"] or 0)


def summarize(record: dict[str, Any]) -> dict[str, Any]:
    """Intervals of every case's time per sample, its ratio to K = 1 and checkpointing's ratio to no
    checkpointing at the same K; the plan's activations over the measured ones."""
    baseline = find_case(record, 1, False)
    assert baseline is not None
    for case in record["cases"]:
        seconds = case["seconds_per_sample"]
        case["seconds_per_sample_interval"] = interval(seconds)
        case["time_vs_k1"] = ratio(seconds, baseline["seconds_per_sample"])
        plain = find_case(record, case["rollout_steps"], False)
        case["time_vs_no_checkpointing"] = (
            ratio(seconds, plain["seconds_per_sample"]) if case["checkpointing"] and plain else None
        )
        case["activations_estimate_over_measured"] = case["estimate"][
            "activations_bytes"
        ] / measured_activations(case)
        case["step_estimate_over_measured"] = (
            case["estimate"]["step_total_bytes"] / case["memory"]["step_peak_bytes"]
        )
    return record


# --------------------------------------------------------------------------------------------- reporting


def _span(found: dict[str, float], digits: int = 2, key: str = "mean") -> str:
    return f"{found[key]:.{digits}f} ({found['low']:.{digits}f} to {found['high']:.{digits}f})"


def _label(case: dict[str, Any]) -> str:
    return "on" if case["checkpointing"] else "off"


def findings(record: dict[str, Any]) -> list[str]:
    """The numbers against what multi-step training is expected to cost, one line each, computed."""
    lines = []
    baseline = find_case(record, 1, False)
    assert baseline is not None
    one_step = measured_activations(baseline)
    for steps_k in (k for k in record["ks"] if k > 1):
        plain, recomputed = find_case(record, steps_k, False), find_case(record, steps_k, True)
        if plain is not None:
            time, held = plain["time_vs_k1"], measured_activations(plain) / one_step
            lines.append(
                f"- K = {steps_k}, no checkpointing: time per sample {_span(time, key='ratio')}x K = 1's "
                f"(expected about {steps_k}x); measured activations {held:.2f}x K = 1's (expected about "
                f"{steps_k}x)"
            )
        if recomputed is not None and plain is not None:
            extra = recomputed["time_vs_no_checkpointing"]
            held = measured_activations(recomputed) / one_step
            lines.append(
                f"- K = {steps_k}, checkpointing: time per sample {_span(extra, key='ratio')}x the same K "
                f"without it (expected 1.33x to 1.5x); measured activations {held:.2f}x K = 1's (expected "
                f"one step's plus {steps_k} states: about "
                f"{recomputed['estimate']['activations_bytes'] / baseline['estimate']['activations_bytes']:.2f}x "
                "by the plan's formula)"
            )
    ratios = [c["activations_estimate_over_measured"] for c in record["cases"]]
    worst = max(record["cases"], key=lambda c: abs(c["activations_estimate_over_measured"] - 1))
    lines.append(
        f"- the plan's saved-activation formula over the measured activations: {min(ratios):.2f}x to "
        f"{max(ratios):.2f}x; farthest from 1 at K = {worst['rollout_steps']}, checkpointing {_label(worst)} "
        f"({worst['activations_estimate_over_measured']:.2f}x)"
    )
    return lines


def markdown(record: dict[str, Any]) -> str:
    """The record as the committed Markdown report."""
    model, gpu = record["model"], not record["device"].startswith("cpu")
    driver = f"; driver {record['driver']}" if record.get("driver") else ""
    lines = [
        f"# The cost of multi-step training: time per sample and peak memory vs K ({record['device']})",
        "",
        f"- date: {record['date']}; torch {record['torch']}{driver}; {record['platform']}",
        f"- command: `{record['command']}`",
        f"- model: config `{record['config']}` of {CONFIG_FILE}: ViT embed {model['embed_dim']}, depth "
        f"{model['depth']}, {model['num_heads']} heads, patch {model['patch_size']}, {model['img_size'][0]}x"
        f"{model['img_size'][1]} grid, {model['channels']} channels, batch {model['batch']}, "
        f"{record['cases'][0]['memory']['parameters']:,} parameters, {model['optimizer']}, fp32; random tensors "
        "of those shapes (no files); TrainStep + RolloutLoss as a run builds them (K = 1: the plain one-step "
        "loss)",
        f"- time: {record['warmup']} warm-up steps, then {record['trials']} trials of {record['steps']} steps, "
        "the device synchronized around each trial; means with 95 % intervals over the trials; ratios with the "
        "95 % interval of a ratio of two sets of trials (on their logarithms)",
        "- memory: one marked step after a warm-up step. "
        + (
            "`torch.cuda.max_memory_allocated` after a reset; the allocated bytes at the forward's start and "
            "end, and the peak of forward and backward (the gradients live at that peak are not known, so "
            "'activations' here include them: at most the parameters' bytes)"
            if gpu
            else "torch.profiler's allocation events from before the model is built (tensor bytes, no "
            "allocator pools); 'activations' = the most bytes above the forward's start (parameters, Adam's "
            "moments and the batch live there) during forward and backward, less the gradients live then"
        ),
        "- estimate: `rollout_activation_bytes` of `dlscale plan` (layout_cost.py) on the config's ModelShape; "
        "'plan, step' is `estimate_memory`'s total without the CUDA allowance and without batches loaded ahead",
        "- every case in a fresh spawned process (no allocator cache or warmed state from an earlier case)",
        "",
        "## Time per sample",
        "",
        "| K | checkpointing | ms per sample | / K = 1 | / same K without checkpointing |",
        "|---:|---|---|---|---|",
    ]
    for case in record["cases"]:
        seconds = {
            k: v * 1000 if k != "trials" else v for k, v in case["seconds_per_sample_interval"].items()
        }
        against = case["time_vs_no_checkpointing"]
        lines.append(
            f"| {case['rollout_steps']} | {_label(case)} | {_span(seconds)} | "
            f"{_span(case['time_vs_k1'], key='ratio')} | {_span(against, key='ratio') if against else ''} |"
        )
    lines += [
        "",
        "## Peak memory of one step, MiB",
        "",
        "| K | checkpointing | step peak | live at forward start | held after forward | activations "
        "(measured) | activations (plan's formula) | formula / measured | step (plan) | plan / measured |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case in record["cases"]:
        memory, planned = case["memory"], case["estimate"]
        lines.append(
            f"| {case['rollout_steps']} | {_label(case)} | {mib(memory['step_peak_bytes'])} | "
            f"{mib(memory['forward_start_bytes'])} | {mib(memory['held_after_forward_bytes'])} | "
            f"{mib(measured_activations(case))} | {mib(planned['activations_bytes'])} | "
            f"{case['activations_estimate_over_measured']:.2f} | {mib(planned['step_total_bytes'])} | "
            f"{case['step_estimate_over_measured']:.2f} |"
        )
    baseline = find_case(record, 1, False)
    assert baseline is not None
    planned = baseline["estimate"]
    lines += [
        "",
        f"The plan's one step saves {mib(planned['one_step_activations_bytes'])} MiB, of which the loss "
        f"{mib(planned['loss_bytes'])} MiB; a state (one input) is {mib(planned['state_bytes'])} MiB.",
        "",
        "## Against the expectation",
        "",
        *findings(record),
    ]
    meaning = record.get("meaning")
    if meaning:
        lines += ["", "## What this means", "", meaning]
    return "\n".join(lines) + "\n"


def plot(record: dict[str, Any], path: Path) -> None:
    """Time per sample and measured activations against K, checkpointing off and on, with intervals."""
    figure = Figure(figsize=(11, 4.2), layout="constrained")
    left, right = figure.subplots(1, 2)
    baseline = find_case(record, 1, False)
    assert baseline is not None
    for checkpointing, color in ((False, "tab:blue"), (True, "tab:orange")):
        # checkpointing's line starts from K = 1, which is the same step either way
        chosen = [baseline] + [
            c for c in record["cases"] if c["checkpointing"] == checkpointing and c["rollout_steps"] > 1
        ]
        ks = [c["rollout_steps"] for c in chosen]
        shifted = [
            k + (0.04 if checkpointing else 0.0) for k in ks
        ]  # the two lines' interval bars side by side
        found = [c["seconds_per_sample_interval"] for c in chosen]
        label = f"checkpointing {'on' if checkpointing else 'off'}"
        left.errorbar(
            shifted,
            [f["mean"] * 1000 for f in found],
            yerr=[
                [(f["mean"] - f["low"]) * 1000 for f in found],
                [(f["high"] - f["mean"]) * 1000 for f in found],
            ],
            marker="o",
            capsize=4,
            color=color,
            label=label,
        )
        right.plot(
            ks,
            [c["memory"]["step_peak_bytes"] / MIB for c in chosen],
            marker="o",
            color=color,
            label=f"{label}: step peak",
        )
        right.plot(
            ks,
            [measured_activations(c) / MIB for c in chosen],
            marker="s",
            ls="--",
            color=color,
            label=f"{label}: activations",
        )
        right.plot(
            ks,
            [c["estimate"]["activations_bytes"] / MIB for c in chosen],
            marker="x",
            ls=":",
            color=color,
            label=f"{label}: plan's activations",
        )
    left.set_ylabel("ms per sample (95% CI over trials)")
    left.set_title("time per sample of one training step", fontsize="medium")
    right.set_ylabel("MiB")
    right.set_title("peak memory of one step (one measurement per case)", fontsize="medium")
    for axis in (left, right):
        axis.set_xticks(record["ks"], [str(k) for k in record["ks"]])
        axis.set_xlabel("rollout steps K")
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
        axis.legend(fontsize="small")
    figure.suptitle(
        f"Multi-step training cost, config {record['config']}, {record['device']}", fontsize="medium"
    )
    figure.savefig(path, dpi=120)


def write_results(record: dict[str, Any], out: Path) -> Path:
    quick = "-quick" if record.get("quick") else ""  # a smoke test never replaces a real run's record
    stem = out / f"{record['date']}-{record['device']}-rollout-training-cost{quick}"
    write_text_atomically(stem.with_suffix(".json"), json.dumps(record, indent=2) + "\n")
    write_text_atomically(stem.with_suffix(".md"), markdown(record))
    plot(record, stem.with_suffix(".png"))
    return stem


def device_label(case: dict[str, Any], device: str) -> str:
    """``cpu-2-threads`` or the GPU's name in lower case with dashes (``nvidia-h100-80gb-hbm3``)."""
    if device == "cpu":
        return f"cpu-{case['threads']}-threads"
    return case["device_name"].lower().replace(" ", "-")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        record = summarize(json.loads(Path(args.from_json).read_text()))
        write_results(record, Path(args.out))
        print(markdown(record))
        return 0
    found = []
    for steps_k, checkpointing in cases(args.ks):
        settings = Settings(
            args.config, steps_k, checkpointing, args.device, args.trials, args.steps, args.warmup
        )
        began = time.perf_counter()
        case = run_case(settings)
        print(
            f"K = {steps_k}, checkpointing {'on' if checkpointing else 'off'}: "
            f"{interval(case['seconds_per_sample'])['mean'] * 1000:.2f} ms per sample, step peak "
            f"{mib(case['memory']['step_peak_bytes'])} MiB ({time.perf_counter() - began:.0f} s)",
            flush=True,
        )
        found.append(case)
    cfg = load_config(Settings(args.config, 1, False, args.device, 0, 0, 0))
    record = {
        "device": device_label(found[0], args.device),
        "driver": found[0]["driver"],
        "date": datetime.now().strftime("%Y-%m-%d"),
        "torch": str(torch.__version__),
        "platform": platform.platform(),
        "command": command_line(
            "benchmarks/rollout_training_cost.py", argv if argv is not None else sys.argv[1:]
        ),
        "quick": args.quick,
        "config": args.config,
        "model": {
            **{key: getattr(cfg.model, key) for key in ("embed_dim", "depth", "num_heads", "patch_size")},
            "img_size": list(cfg.data.img_size),
            "channels": cfg.data.n_in_channels,
            "batch": cfg.train.global_batch_size,
            "optimizer": cfg.optim.optimizer,
        },
        "ks": args.ks,
        "trials": args.trials,
        "steps": args.steps,
        "warmup": args.warmup,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "cases": found,
    }
    record = summarize(record)
    stem = write_results(record, Path(args.out))
    print(markdown(record))
    print(f"written: {stem}.json, .md, .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
