"""Which memory layout trains the 3D U-Net faster on this CPU: channels-last (NDHWC, ``model.channels_last:
true``) or the tutorial's NCDHW, at the tutorial's size and at the demo's.

    OMP_NUM_THREADS=2 PYTHONPATH=src python benchmarks/unet_memory_layout.py [--trials 5] [--steps 2]
        [--sizes tutorial demo] [--quick]

A training step (forward, L1 loss, backward, fused AdamW) of the dlscale U-Net on random volumes of the config's
shapes: ``tutorial`` is the ``base`` config (six levels, width 64, 117.0 M parameters, one 64^3 crop a step:
the tutorial's local batch is 64 on a GPU; one sample keeps a CPU step to seconds), ``demo`` the ``demo`` config
(five levels, width 8, 32^3 crops, batch 8). Both layouts start from the same weights and data. After one
untimed step per layout, ``--trials`` trials alternate the layouts (NCDHW first in even trials, channels-last in
odd ones, so a slow drift of the machine touches both alike), each timing ``--steps`` steps; the speed of
channels-last is NCDHW's seconds per step over channels-last's, with its 95 % interval on the logarithms of the
trials (:func:`dlscale.perf.bench.intervals.ratio_interval`). Run it alone: a second busy process on 2 cores
changes the numbers many times over.

Results: ``benchmarks/results/<date>-cpu-unet-memory-layout.json``, ``.md`` and ``.png`` (``-quick`` with
``--quick``); ``--from-json RECORD`` writes the Markdown and PNG again from a record.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from benchmark_text import command_line
from matplotlib.figure import Figure

from dlscale.models.unet3d import UNet3D
from dlscale.models.unet3d_config import UNetConfig
from dlscale.perf.bench.intervals import mean_interval, ratio_interval
from dlscale.runtime.atomic_files import write_text_atomically

REPO = Path(__file__).resolve().parents[1]
# name -> (full_scale, base_channels, crop, batch): the unet_cosmo.yaml configs' model and data shapes
SIZES = {"tutorial": (True, 64, 64, 1), "demo": (False, 8, 32, 8)}
QUICK_SIZES = {"tutorial": (False, 8, 32, 1), "demo": (False, 4, 32, 1)}  # five levels need 32^3
LAYOUTS = ("ncdhw", "channels_last")
IN_CHANNELS, OUT_CHANNELS = 4, 5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5, help="timed trials per layout (default 5)")
    parser.add_argument("--steps", type=int, default=2, help="training steps per trial (default 2)")
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    parser.add_argument(
        "--quick", action="store_true", help="small shapes: a check of the script, not a result"
    )
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument(
        "--from-json", type=Path, metavar="RECORD", help="write the .md and .png from a record"
    )
    return parser.parse_args(argv)


def make_step(shape: tuple[bool, int, int, int], channels_last: bool, seed: int = 0):
    """A function running one training step of the U-Net of ``shape`` in one layout, from fixed weights and data."""
    full_scale, width, crop, batch = shape
    torch.manual_seed(seed)
    model = UNet3D(UNetConfig(full_scale=full_scale, base_channels=width, channels_last=channels_last))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(batch, IN_CHANNELS, crop, crop, crop, generator=generator)
    target = torch.randn(batch, OUT_CHANNELS, crop, crop, crop, generator=generator)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.l1_loss(model(inputs), target)
        loss.backward()
        optimizer.step()

    parameters = sum(p.numel() for p in model.parameters())
    return step, parameters


def measure(shape: tuple[bool, int, int, int], trials: int, steps: int) -> dict[str, Any]:
    """Seconds per step of each layout, trial by trial (see the module's docstring for the order)."""
    runs = {layout: make_step(shape, layout == "channels_last") for layout in LAYOUTS}
    for layout in LAYOUTS:  # untimed: the first step allocates and picks the kernels
        runs[layout][0]()
    seconds: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
    for trial in range(trials):
        order = LAYOUTS if trial % 2 == 0 else LAYOUTS[::-1]
        for layout in order:
            step = runs[layout][0]
            began = time.perf_counter()
            for _ in range(steps):
                step()
            seconds[layout].append((time.perf_counter() - began) / steps)
            print(f"  trial {trial + 1}/{trials} {layout}: {seconds[layout][-1]:.3f} s/step", flush=True)
    # speed of channels-last over NCDHW = NCDHW's time / channels-last's = channels-last's rate / NCDHW's rate
    speed = ratio_interval([1 / s for s in seconds["channels_last"]], [1 / s for s in seconds["ncdhw"]])
    full_scale, width, crop, batch = shape
    return {
        "shape": {"full_scale": full_scale, "base_channels": width, "crop": crop, "batch": batch},
        "parameters": runs["ncdhw"][1],
        "seconds_per_step": seconds,
        "channels_last_speed": {"ratio": speed.ratio, "low": speed.low, "high": speed.high},
    }


def markdown(record: dict[str, Any]) -> str:
    lines = [
        "# The 3D U-Net's memory layout on the CPU: channels-last against NCDHW",
        "",
        f"{record['date']}, {record['machine']}, torch {record['torch']}, {record['threads']} threads. "
        f"Command: `{record['command']}`",
        "",
        "A training step (forward, L1 loss, backward, fused AdamW) on random volumes; "
        f"{record['trials']} trials of {record['steps']} steps per layout, alternating, after an untimed step. "
        "Speed: NCDHW's seconds per step over channels-last's (above 1: channels-last is faster), 95 % interval "
        "on the logarithms of the trials.",
        "",
        "| size | model | parameters | NCDHW s/step | channels-last s/step | channels-last speed |",
        "|---|---|---:|---:|---:|---|",
    ]
    for name, result in record["sizes"].items():
        shape = result["shape"]
        model = (
            f"{'six' if shape['full_scale'] else 'five'} levels, width {shape['base_channels']}, "
            f"{shape['crop']}^3 x {shape['batch']}"
        )
        times = {layout: mean_interval(result["seconds_per_step"][layout]) for layout in LAYOUTS}
        speed = result["channels_last_speed"]
        lines.append(
            f"| {name} | {model} | {result['parameters'] / 1e6:.2f} M | "
            f"{times['ncdhw'].mean:.3f} +- {times['ncdhw'].half_width:.3f} | "
            f"{times['channels_last'].mean:.3f} +- {times['channels_last'].half_width:.3f} | "
            f"{speed['ratio']:.2f}x (95% CI {speed['low']:.2f}x-{speed['high']:.2f}x) |"
        )
    if record.get("meaning"):
        lines += ["", record["meaning"]]
    return "\n".join(lines) + "\n"


def figure(record: dict[str, Any]) -> Figure:
    fig = Figure(figsize=(7, 3.6), layout="constrained")
    axes = fig.subplots(1, len(record["sizes"]), squeeze=False)[0]
    for ax, (name, result) in zip(axes, record["sizes"].items(), strict=True):
        for position, layout in enumerate(LAYOUTS):
            values = result["seconds_per_step"][layout]
            ax.scatter([position] * len(values), values, s=18, alpha=0.7)
            interval = mean_interval(values)
            ax.errorbar(
                position + 0.15, interval.mean, yerr=interval.half_width, fmt="o", capsize=4, color="k"
            )
        speed = result["channels_last_speed"]
        ax.set_xticks(range(len(LAYOUTS)), ["NCDHW", "channels-last"])
        ax.set_xlim(-0.5, len(LAYOUTS) - 0.5)
        ax.set_ylim(bottom=0)
        ax.set_ylabel("seconds per training step")
        ax.set_title(
            f"{name}: channels-last {speed['ratio']:.2f}x\n(95% CI {speed['low']:.2f}-{speed['high']:.2f})"
        )
    fig.suptitle(f"3D U-Net layout on the CPU ({record['threads']} threads, torch {record['torch']})")
    return fig


def write_record(record: dict[str, Any], stem: Path) -> None:
    write_text_atomically(stem.with_suffix(".json"), json.dumps(record, indent=2) + "\n")
    write_text_atomically(stem.with_suffix(".md"), markdown(record))
    figure(record).savefig(stem.with_suffix(".png"), dpi=110)
    print(f"wrote {stem}.json, .md and .png")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json is not None:
        record = json.loads(args.from_json.read_text())
        write_record(record, args.from_json.with_suffix(""))
        return 0
    sizes = QUICK_SIZES if args.quick else SIZES
    record: dict[str, Any] = {
        "date": datetime.now().strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "torch": str(torch.__version__),
        "threads": torch.get_num_threads(),
        "command": command_line("benchmarks/unet_memory_layout.py", sys.argv[1:] if argv is None else argv),
        "trials": args.trials,
        "steps": args.steps,
        "quick": args.quick,
        "sizes": {},
    }
    for name in args.sizes:
        print(f"{name}: {sizes[name]}", flush=True)
        record["sizes"][name] = measure(sizes[name], args.trials, args.steps)
    args.out.mkdir(parents=True, exist_ok=True)
    write_record(record, args.out / f"{record['date']}-cpu-unet-memory-layout{'-quick' * args.quick}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
