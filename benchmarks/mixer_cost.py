"""What the ViT's three token mixers (``model.mixer``: attention, afno, sfno) cost against resolution on the
CPU: seconds and peak memory of a training step per sample, and the analytic FLOPs, from the demo's grid
upward; the growth exponent of each against the number of grid points; and ``dlscale plan`` of the
0.25-degree models on 64 GPUs side by side.

    PYTHONPATH=src python benchmarks/mixer_cost.py [--sizes 32x64 48x96 ...] [--mixers attention afno sfno]
        [--trials 3] [--batch 1] [--threads 1] [--max-step-seconds 20] [--no-plan] [--quick] [--out DIR]
        [--from-json RECORD]

The three models have the demo's shape (``configs/vit_era5.yaml`` ``demo``: embed 128, depth 4, 4 heads, patch
4, MLP ratio 4; AFNO and SFNO with their default 8 blocks), 20 channels in and out, fp32, built directly
(``VisionTransformer``); sfno on the latitudes of the tutorial's crop (H of H + 1 rows from pole to pole). A
training step is zero_grad, forward, the tutorials' relative-L2 loss, backward and a ``torch.optim.Adam`` step
on random fields. Sizes run from the smallest up, the mixers one after the other at each size.

Per (mixer, size), in this order:

* memory: inside ``torch.profiler(profile_memory=True)`` the model, its optimizer and the batch are made, one
  warm-up step runs, then one marked step; its peak is the most torch CPU tensor bytes live at once in that
  step (:class:`allocation_trace.AllocationTrace`: parameters, gradients, Adam's moments, the batch, what
  autograd saves, the temporaries), the method checked first on a known sequence
  (:func:`allocation_trace.verify_tracking`);
* time: after those two (untimed) steps, ``--trials`` trials of at least 2 steps each (more when a step is
  short: a trial lasts at least :data:`MIN_TRIAL_SECONDS`); seconds per sample = trial seconds / steps /
  batch, the MINIMUM over the trials as the measurement (another process on the machine only ever adds time)
  and the median beside it; ``os.getloadavg()`` before and after.

One thread (``torch.set_num_threads``) by default: on a shared machine it is the most stable, and the exponent
is the model's, not the thread pool's. A size whose step would take longer than ``--max-step-seconds``
(predicted from the mixer's previous size, as if the cost grew with the square of the points) is skipped and
recorded so.

Growth exponent: least squares of log(value) on log(points = H * W), over all measured sizes and over the
largest three (where the asymptotics show); the issue's target is an exponent of at most 1.2 for afno and
sfno, where attention's rises toward 2. Results: ``benchmarks/results/<date>-cpu-mixer-cost.{json,md,png}``
(``-quick`` with ``--quick``); ``--from-json RECORD`` writes the .md and .png again from a record.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from allocation_trace import MEASURED_STEP, AllocationTrace, owner_addresses, verify_tracking
from benchmark_text import MIB, command_line
from matplotlib.figure import Figure
from torch.profiler import ProfilerActivity, profile, record_function

from dlscale import __version__
from dlscale.config import load_run_config
from dlscale.data.era5.coordinates import formula_latitudes
from dlscale.models.vit import VisionTransformer, token_grid, vit_flops_per_sample
from dlscale.models.vit_config import ViTConfig
from dlscale.report.figures import save_png
from dlscale.runtime.atomic_files import write_text_atomically
from dlscale.scoring.metrics import relative_l2_loss

REPO = Path(__file__).resolve().parents[1]
MIXERS = ("attention", "afno", "sfno")
SHAPE = {"embed_dim": 128, "depth": 4, "num_heads": 4, "patch_size": 4, "mlp_ratio": 4.0}  # the demo's
CHANNELS = 20
SIZES = ("32x64", "48x96", "64x128", "96x192", "128x256", "192x384", "256x512", "384x768")
QUICK_SIZES = ("16x32", "24x48", "32x64")
MIN_TRIAL_SECONDS = 0.5
TARGET_EXPONENT = 1.2  # the issue's: afno's and sfno's cost grows at most 1.2x as fast as the points
LARGEST = 3  # the sizes of the asymptotic fit
# `dlscale plan` of the 0.25-degree models: FourCastNet's afno_full, and the same model with the other mixers
# (attention with the config's 8 heads of 96: the head count changes neither the FLOP count nor the plan's
# memory much, and no ViT baseline of FourCastNet's fixes one).
PLAN_GPUS = 64
PLANS = {
    "afno": ("--config", "afno_full"),
    "attention": ("--config", "afno_full", "--set", "model.mixer=attention"),
    "sfno": ("--config", "afno_full", "--set", "model.mixer=sfno"),
}


def parse_size(text: str) -> tuple[int, int]:
    """'32x64' -> (32, 64); both sides positive multiples of the patch size."""
    height, _, width = text.partition("x")
    patch = SHAPE["patch_size"]
    if not (height.isdigit() and width.isdigit() and int(height) > 0 and int(width) > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a grid HxW such as 32x64")
    if int(height) % patch or int(width) % patch:
        raise argparse.ArgumentTypeError(f"{text}: both sides must be multiples of the patch size {patch}")
    return int(height), int(width)


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", nargs="+", type=parse_size, help=f"grids HxW, smallest first (default {' '.join(SIZES)})"
    )
    parser.add_argument(
        "--mixers", nargs="+", choices=MIXERS, default=list(MIXERS), help="default: all three"
    )
    parser.add_argument(
        "--trials", type=positive, default=3, help="timed trials per mixer and size (default 3)"
    )
    parser.add_argument(
        "--batch", type=positive, default=1, help="samples per step at every size (default 1)"
    )
    parser.add_argument("--threads", type=positive, default=1, help="torch threads (default 1)")
    parser.add_argument(
        "--max-step-seconds", type=float, default=20.0, help="skip a size predicted slower (default 20)"
    )
    parser.add_argument("--no-plan", action="store_true", help="leave out the dlscale plan side-by-side")
    parser.add_argument(
        "--quick", action="store_true", help="tiny grids: a check of the script, not a result"
    )
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument(
        "--from-json", type=Path, metavar="RECORD", help="write the .md and .png from a record"
    )
    return parser.parse_args(argv)


def build_model(mixer: str, size: tuple[int, int]) -> tuple[VisionTransformer, ViTConfig]:
    """The demo-shaped ViT with ``mixer`` on an H x W grid (sfno on H of H + 1 pole-to-pole rows)."""
    cfg = ViTConfig(**SHAPE, mixer=mixer)
    latitudes = formula_latitudes(size[0] + 1)[: size[0]]
    return VisionTransformer(cfg, size, CHANNELS, CHANNELS, latitudes), cfg


def training_step(model, optimizer, inputs: torch.Tensor, targets: torch.Tensor) -> None:
    optimizer.zero_grad(set_to_none=True)
    relative_l2_loss(model(inputs), targets).backward()
    optimizer.step()


def load_averages() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def measure(mixer: str, size: tuple[int, int], batch: int, trials: int) -> dict[str, Any]:
    """Peak memory of a profiled step, then the timed trials (module docstring)."""
    load_before = load_averages()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        torch.manual_seed(0)
        model, cfg = build_model(mixer, size)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        inputs = torch.randn(batch, CHANNELS, *size)
        targets = torch.randn(batch, CHANNELS, *size)
        training_step(model, optimizer, inputs, targets)  # warm-up: Adam's moments exist from here on
        began = time.perf_counter()
        with record_function(MEASURED_STEP):
            training_step(model, optimizer, inputs, targets)
        profiled_seconds = time.perf_counter() - began
        owned = owner_addresses(model, optimizer, [inputs, targets])
    trace = AllocationTrace.from_profile(profiler, set().union(*owned.values()))
    peak = trace.peak(MEASURED_STEP).bytes
    del profiler, trace
    steps = max(2, math.ceil(MIN_TRIAL_SECONDS / profiled_seconds))
    seconds = []
    for _ in range(trials):
        began = time.perf_counter()
        for _ in range(steps):
            training_step(model, optimizer, inputs, targets)
        seconds.append((time.perf_counter() - began) / steps / batch)
    parameters = sum(p.numel() for p in model.parameters())
    rows, columns = token_grid(size, cfg.patch_size)
    return {
        "mixer": mixer,
        "size": list(size),
        "points": size[0] * size[1],
        "tokens": rows * columns,
        "batch": batch,
        "parameters": parameters,
        "state_bytes": 4 * 4 * parameters,  # fp32 parameters, gradients and Adam's two moments
        "steps_per_trial": steps,
        "seconds_per_sample": seconds,
        "seconds_min": min(seconds),
        "seconds_median": statistics.median(seconds),
        "peak_bytes": peak,
        "peak_bytes_per_sample": peak / batch,
        "forward_flops_per_sample": vit_flops_per_sample(cfg, size, CHANNELS, CHANNELS),
        "load_before": load_before,
        "load_after": load_averages(),
    }


def growth_exponent(points: list[float], values: list[float]) -> float | None:
    """The slope of the least-squares line of log(values) on log(points); None with fewer than 2 points."""
    if len(points) < 2:
        return None
    slope, _ = np.polyfit(np.log(points), np.log(values), 1)
    return float(slope)


QUANTITIES = {"time": "seconds_min", "memory": "peak_bytes_per_sample", "flops": "forward_flops_per_sample"}


def exponents(measurements: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float | None]]]:
    """mixer -> quantity -> {"all": exponent over every measured size, "largest": over the largest three}, for
    the mixers of ``measurements`` in their order."""
    fitted: dict[str, dict[str, dict[str, float | None]]] = {}
    for mixer in dict.fromkeys(m["mixer"] for m in measurements):
        rows = sorted(
            (m for m in measurements if m["mixer"] == mixer and "skipped" not in m), key=lambda m: m["points"]
        )
        fitted[mixer] = {
            quantity: {
                "all": growth_exponent([m["points"] for m in rows], [m[key] for m in rows]),
                "largest": growth_exponent(
                    [m["points"] for m in rows[-LARGEST:]], [m[key] for m in rows[-LARGEST:]]
                )
                if len(rows) > LARGEST
                else None,
            }
            for quantity, key in QUANTITIES.items()
        }
    return fitted


def plan_side_by_side(env: dict[str, str]) -> dict[str, Any]:
    """``dlscale plan`` of each 0.25-degree model on 64 GPUs (its JSON's requested layout) and its FLOPs."""
    plans = {}
    with tempfile.TemporaryDirectory() as scratch:
        for mixer, arguments in PLANS.items():
            json_path = Path(scratch) / f"{mixer}.json"
            argv = ["plan", *arguments, "--gpus", str(PLAN_GPUS)]
            run = subprocess.run(
                [sys.executable, "-m", "dlscale", *argv, "--json", str(json_path)],
                cwd=REPO, env=env, capture_output=True, text=True, check=False,
            )  # fmt: skip
            if run.returncode != 0:
                raise SystemExit(f"dlscale {' '.join(argv)} failed ({run.returncode}): {run.stderr.strip()}")
            plan = json.loads(json_path.read_text())
            requested = plan["requested"]
            key, value = (
                ("layout", requested["layout"]) if "layout" in requested else ("rank", requested["rank"])
            )
            row = next(r for r in plan["rows"] if r[key] == value)
            overrides = [arguments[i + 1] for i, a in enumerate(arguments) if a == "--set"]
            cfg = load_run_config(REPO / "configs" / "vit_era5.yaml", "afno_full", overrides, {})
            plans[mixer] = {
                "command": "dlscale " + " ".join(argv),
                "summary": requested["summary"],
                "local_batch": row["local_batch"],
                # the traced plan's row says stored_parameters, the ViT's {"stored": ...} per GPU
                "parameters": row["stored_parameters"]
                if "stored_parameters" in row
                else row["parameters"]["stored"],
                "memory_bytes": row["memory_bytes"],
                "img_size": list(cfg.data.img_size),
                "forward_flops_per_sample": vit_flops_per_sample(
                    cfg.model, cfg.data.img_size, cfg.data.n_in_channels, cfg.data.n_out_channels
                ),
            }
            print(f"plan {mixer}: {requested['summary']}", file=sys.stderr, flush=True)
    return plans


# ---- the record's text and figure -------------------------------------------------------------------------


def exponent_text(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def verdict(mixer: str, value: float | None) -> str:
    if value is None:
        return "n/a"
    if mixer == "attention":
        return "above 1.2 (quadratic trend)" if value > TARGET_EXPONENT else "not above 1.2"
    return "met" if value <= TARGET_EXPONENT else "missed"


def markdown(record: dict[str, Any]) -> str:
    measured = [m for m in record["measurements"] if "skipped" not in m]
    loads = [value for m in measured for value in (m["load_before"][0], m["load_after"][0])]
    lines = [
        "# The cost of the ViT's token mixers against resolution (CPU)",
        "",
        f"{record['date']}, {record['device']}, torch {record['torch']}, dlscale {record['dlscale']}, "
        f"{record['threads']} thread(s), batch {record['batch']}, fp32. Command: `{record['command']}` "
        f"({record['wall_seconds'] / 60:.1f} minutes).",
        "",
        f"Every model has the demo's shape ({record['shape']}), {CHANNELS} channels in and out. A training "
        "step is zero_grad, forward, relative-L2 loss, backward and an Adam step. Time: after a warm-up step "
        f"and a profiled step, {record['trials']} trials of at least 2 steps (at least "
        f"{MIN_TRIAL_SECONDS} s) each; the minimum over the trials is the measurement (another process on "
        "the machine only adds time), the median beside it. Peak: the most torch CPU tensor bytes live at "
        "once in one step (torch.profiler allocation events), parameters, gradients, Adam's moments and the "
        "batch included. GFLOP: the analytic forward count `vit_flops_per_sample` (the FFTs and the SHT's "
        "Legendre products counted); GFLOP/s = 3 x forward / minimum time. The machine was shared with other "
        "work: 1-minute load averages between "
        f"{min(loads):.2f} and {max(loads):.2f} (each row's before -> after).",
        "",
        "| grid | points | tokens | mixer | s/sample min | s/sample median | peak MiB/sample | GFLOP/sample "
        "| GFLOP/s | load |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for m in record["measurements"]:
        grid = f"{m['size'][0]} x {m['size'][1]}"
        if "skipped" in m:
            cells = f"| {grid} | {m['points']:,} | {m['tokens']:,} | {m['mixer']} | skipped: {m['skipped']} "
            lines.append(cells + "| | | | | |")
            continue
        rate = 3 * m["forward_flops_per_sample"] / m["seconds_min"] / 1e9
        lines.append(
            f"| {grid} | {m['points']:,} | {m['tokens']:,} | {m['mixer']} | {m['seconds_min']:.4f} | "
            f"{m['seconds_median']:.4f} | {m['peak_bytes_per_sample'] / MIB:.1f} | "
            f"{m['forward_flops_per_sample'] / 1e9:.2f} | {rate:.1f} | "
            f"{m['load_before'][0]:.2f} -> {m['load_after'][0]:.2f} |"
        )
    lines += [
        "",
        "## Growth exponents against the number of points",
        "",
        f"Least squares of log(value) on log(H x W): over all measured sizes, and over the largest {LARGEST} "
        "of each mixer. Target (the issue's): afno's and sfno's time grows with an exponent of at most "
        f"{TARGET_EXPONENT}; attention's is expected to rise toward 2.",
        "",
        "| mixer | sizes | time | target (time) | peak memory | forward FLOPs |",
        "|---|---|---:|---|---:|---:|",
    ]
    for mixer, fitted in record["exponents"].items():
        sizes = [m for m in measured if m["mixer"] == mixer]
        for span, label in (("all", f"all {len(sizes)}"), ("largest", f"largest {LARGEST}")):
            lines.append(
                f"| {mixer} | {label} | {exponent_text(fitted['time'][span])} | "
                f"{verdict(mixer, fitted['time'][span])} | {exponent_text(fitted['memory'][span])} | "
                f"{exponent_text(fitted['flops'][span])} |"
            )
    if record.get("plans"):
        lines += [
            "",
            f"## `dlscale plan` of the 0.25-degree models on {PLAN_GPUS} GPUs",
            "",
            "The layout each config asks for (DDP, one sample per GPU, fp32, Adam), GB = 2^30 bytes per GPU; "
            "forward GFLOP per sample from `vit_flops_per_sample` (a training step is about 3 times it).",
            "",
            "| model | command | parameters | states GB | activations GB | total GB | forward GFLOP/sample |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for mixer, plan in record["plans"].items():
            memory = plan["memory_bytes"]
            lines.append(
                f"| {mixer} | `{plan['command']}` | {plan['parameters']:,} | "
                f"{memory['model_states'] / 2**30:.2f} | {memory['activations'] / 2**30:.2f} | "
                f"{memory['total'] / 2**30:.2f} | {plan['forward_flops_per_sample'] / 1e9:,.0f} |"
            )
    return "\n".join(lines) + "\n"


def figure(record: dict[str, Any]) -> Figure:
    fig = Figure(figsize=(10, 4.2), layout="constrained")
    time_axes, memory_axes = fig.subplots(1, 2)
    for axes, key, scale, label in (
        (time_axes, "seconds_min", 1.0, "seconds per sample (training step, min of trials)"),
        (memory_axes, "peak_bytes_per_sample", 1 / MIB, "peak MiB per sample (training step)"),
    ):
        first, shown = None, []
        for mixer in MIXERS:
            rows = [m for m in record["measurements"] if m["mixer"] == mixer and "skipped" not in m]
            if not rows:
                continue
            points = [m["points"] for m in rows]
            values = [m[key] * scale for m in rows]
            fitted = record["exponents"][mixer]["time" if key == "seconds_min" else "memory"]
            slopes = (
                f"slope {exponent_text(fitted['all'])}; largest {LARGEST}: {exponent_text(fitted['largest'])}"
            )
            axes.plot(points, values, "o-", label=f"{mixer} ({slopes})")
            first = first or (points[0], min(values))
            shown += values
        if first is not None:
            span = np.array([first[0], max(m["points"] for m in record["measurements"])], dtype=float)
            for slope, style in ((1, ":"), (2, "--")):
                axes.plot(
                    span, first[1] * (span / span[0]) ** slope, "k" + style, lw=1, label=f"slope {slope}"
                )
        axes.set_xscale("log")
        axes.set_yscale("log")
        if shown:  # the guides end where the data do
            axes.set_ylim(min(shown) / 1.5, max(shown) * 1.5)
        axes.set_xlabel("grid points H x W")
        axes.set_ylabel(label)
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize=8)
    time_axes.set_title("time")
    memory_axes.set_title("peak memory")
    fig.suptitle(
        f"ViT mixers against resolution on the CPU ({record['threads']} thread(s), torch {record['torch']}, "
        f"{record['shape']})",
        fontsize=9,
    )
    return fig


def write_record(record: dict[str, Any], stem: Path) -> None:
    write_text_atomically(stem.with_suffix(".json"), json.dumps(record, indent=2) + "\n")
    write_text_atomically(stem.with_suffix(".md"), markdown(record))
    save_png(figure(record), stem.with_suffix(".png"))
    print(f"wrote {stem}.json, .md and .png", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.from_json is not None:
        record = json.loads(args.from_json.read_text())
        write_record(record, args.from_json.with_suffix(""))
        return 0
    started = time.perf_counter()
    torch.set_num_threads(args.threads)
    check = verify_tracking(0)
    if check["peak_bytes"] != check["expected_peak_bytes"] or check["live_after_bytes"]:
        raise SystemExit(f"the allocation trace does not add up on a known sequence: {check}")
    record: dict[str, Any] = {
        "benchmark": "mixer-cost",
        "date": datetime.now().strftime("%Y-%m-%d"),
        "device": f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)",
        "torch": str(torch.__version__),
        "dlscale": __version__,
        "threads": torch.get_num_threads(),
        "command": command_line("benchmarks/mixer_cost.py", argv),
        "shape": ", ".join(f"{k} {v:g}" for k, v in SHAPE.items()),
        "batch": args.batch,
        "trials": args.trials,
        "max_step_seconds": args.max_step_seconds,
        "quick": args.quick,
        "self_check": check,
        "measurements": [],
    }
    sizes = args.sizes or [parse_size(s) for s in (QUICK_SIZES if args.quick else SIZES)]
    last: dict[str, dict[str, Any]] = {}
    for size in sizes:
        for mixer in args.mixers:
            points = size[0] * size[1]
            previous = last.get(mixer)
            predicted = (
                previous and previous["seconds_min"] * previous["batch"] * (points / previous["points"]) ** 2
            )
            if predicted and predicted > args.max_step_seconds:
                rows, columns = token_grid(size, SHAPE["patch_size"])
                skipped = f"a step predicted {predicted:.0f} s > {args.max_step_seconds:g} s"
                record["measurements"].append(
                    {
                        "mixer": mixer,
                        "size": list(size),
                        "points": points,
                        "tokens": rows * columns,
                        "skipped": skipped,
                    }
                )
                print(f"{mixer} {size[0]}x{size[1]}: skipped ({skipped})", file=sys.stderr, flush=True)
                continue
            result = measure(mixer, size, args.batch, args.trials)
            record["measurements"].append(result)
            last[mixer] = result
            gc.collect()
            print(
                f"{mixer} {size[0]}x{size[1]}: {result['seconds_min']:.4f} s/sample min, "
                f"{result['seconds_median']:.4f} median, "
                f"peak {result['peak_bytes_per_sample'] / MIB:.1f} MiB/sample, "
                f"load {result['load_before'][0]} -> {result['load_after'][0]}",
                file=sys.stderr,
                flush=True,
            )
    record["exponents"] = exponents(record["measurements"])
    if not args.no_plan:
        env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": str(args.threads)}
        record["plans"] = plan_side_by_side(env)
    record["wall_seconds"] = round(time.perf_counter() - started, 1)
    stem = args.out / f"{record['date']}-cpu-mixer-cost{'-quick' * args.quick}"
    write_record(record, stem)
    print(markdown(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
