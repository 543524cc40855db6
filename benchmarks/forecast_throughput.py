"""What scoring a trained model costs: ``dlscale forecast`` steps per second and ``dlscale evaluate`` samples per
second, with intervals; and what a 10-day rollout of a bigger config's model costs on this device.

    PYTHONPATH=src python benchmarks/forecast_throughput.py [--run runs/demo/00] [--trials 5]

(a) forecast: ``dlscale.forecast`` of the run's checkpoint (``make demo`` trains it), ``--init-count`` initial
    times of the test split rolled out ``--lead`` (10 days: 40 steps of 6 h), once per batch size of
    ``--batch-sizes``. Per trial: forecast steps/s inside the model (one step = one initial time advanced 6 h;
    the device synchronized around each call) and rollout days/s of the whole pass (reading the truth from
    disk and scoring three forecasters included).
(b) evaluate: ``dlscale.evaluate`` of the same checkpoint on the test split, samples/s of the pass.
(c) model only: for each config of ``--configs`` (default ``short``, the tutorial's 360x720 ViT), the model
    built from the config with random weights (speed does not depend on them), forward passes in inference mode
    in the config's precision on ``--model-batch`` random inputs of its shape; a 10-day rollout of that many
    initial times costs 40 of them.

Every measurement is repeated ``--trials`` times after one warm-up; the records give the mean and its 95 %
interval. Results: ``benchmarks/results/<date>-<device>-forecast-throughput.json``, ``.md`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from benchmark_text import command_line
from matplotlib.figure import Figure

import dlscale
from dlscale.config import load_run_config
from dlscale.perf.bench.intervals import mean_interval
from dlscale.runtime.atomic_files import write_text_atomically
from dlscale.runtime.device import Device
from dlscale.training.precision import Precision
from dlscale.workloads import get_workload

REPO = Path(__file__).resolve().parents[1]
ROLLOUT_STEPS = 40  # 10 days of 6-hour steps


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", default="runs/demo/00", help="a trained ERA5 run directory (make demo)")
    parser.add_argument("--lead", default="10d")
    parser.add_argument("--init-count", type=int, default=32, help="initial times per forecast trial")
    parser.add_argument("--batch-sizes", default="8,32", help="comma-separated initial times per batch")
    parser.add_argument(
        "--configs", default="short", help="configs of configs/vit_era5.yaml timed model-only"
    )
    parser.add_argument(
        "--amp-modes",
        default="",
        help="precisions of the model-only trials, e.g. none,bf16 (default: the config's)",
    )
    parser.add_argument("--model-only", action="store_true", help="only (c): no trained run needed")
    parser.add_argument(
        "--model-batch", type=int, default=1, help="initial times per model-only forward pass"
    )
    parser.add_argument("--model-batches", type=int, default=2, help="forward passes per model-only trial")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    return parser.parse_args(argv)


def forecast_trials(args: argparse.Namespace, batch_size: int) -> dict[str, Any]:
    """One warm-up, then ``--trials`` forecasts: steps/s in the model and rollout days/s of the whole pass."""
    steps_per_second, days_per_second = [], []
    for trial in range(args.trials + 1):
        document = dlscale.forecast(
            args.run, lead=args.lead, init_count=args.init_count, batch_size=batch_size
        )
        if trial:
            steps_per_second.append(document["throughput"]["forecast_steps_per_second"])
            days_per_second.append(document["throughput"]["rollout_days_per_second"])
    return {
        "batch_size": batch_size,
        "initial_times": document["initial_time_count"],
        "steps": len(document["lead_hours"]) - 1,
        "data": document["data"],
        "forecast_steps_per_second": steps_per_second,
        "rollout_days_per_second": days_per_second,
    }


def evaluate_trials(args: argparse.Namespace) -> dict[str, Any]:
    """One warm-up, then ``--trials`` evaluations of the test split: samples/s."""
    rates = []
    for trial in range(args.trials + 1):
        document = dlscale.evaluate(args.run, split="test")
        if trial:
            rates.append(document["samples"] / document["seconds"])
    return {"samples": document["samples"], "samples_per_second": rates}


def model_only_trials(args: argparse.Namespace, config: str, amp_mode: str, device: Device) -> dict[str, Any]:
    """Forward passes of ``config``'s model on random inputs: seconds per batch and per 10-day rollout."""
    settings = [f"train.amp_mode={amp_mode}"] if amp_mode else []
    cfg = load_run_config(REPO / "configs" / "vit_era5.yaml", config, settings)
    workload = get_workload(cfg.workload)
    torch.manual_seed(0)
    model = workload.build_model(cfg.model, cfg.data).to(device.torch).eval()
    predict = Precision(cfg.train.amp_mode, device).wrap_inference(model)
    batch = args.model_batch
    inputs = torch.randn(batch, cfg.data.n_in_channels, *cfg.data.img_size, device=device.torch)
    seconds = []
    with torch.inference_mode():
        for trial in range(args.trials + 1):
            device.synchronize()
            began = time.perf_counter()
            for _ in range(args.model_batches):
                predict(inputs)
            device.synchronize()
            if trial:
                seconds.append((time.perf_counter() - began) / args.model_batches)
    return {
        "config": config,
        "img_size": list(cfg.data.img_size),
        "batch_size": batch,
        "amp_mode": cfg.train.amp_mode,
        "parameters": sum(p.numel() for p in model.parameters()),
        "seconds_per_batch": seconds,
        "steps_per_second": [batch / s for s in seconds],
    }


def interval(values: list[float]) -> dict[str, float]:
    found = mean_interval(values)
    return {"mean": found.mean, "low": found.low, "high": found.high, "trials": found.trials}


def markdown(record: dict[str, Any]) -> str:
    """The record as the committed Markdown report."""
    lines = [
        f"# Forecast and evaluation throughput ({record['device']})",
        "",
        f"- date: {record['date']}; torch {record['torch']}; {record['platform']}",
        f"- command: `{record['command']}`",
        f"- run: `{record['run']}`; {record['forecast'][0]['data']}"
        if record["forecast"]
        else "- model only",
        "- means with 95 % intervals over the trials (one warm-up trial not counted)",
        "",
        "## dlscale forecast (the demo model, 10-day rollouts of the test split)",
        "",
        "| initial times per batch | initial times | forecast steps/s in the model | rollout days/s, whole pass |",
        "|---:|---:|---|---|",
    ]
    for entry in record["forecast"]:
        steps, days = entry["forecast_steps_per_second_interval"], entry["rollout_days_per_second_interval"]
        lines.append(f"| {entry['batch_size']} | {entry['initial_times']} | {_span(steps)} | {_span(days)} |")
    evaluation = record["evaluate"]
    if evaluation is not None:
        lines += [
            "",
            "A forecast step advances one initial time by 6 h; the whole pass adds reading the truth of every lead",
            "from disk and scoring the model, persistence and the climatology.",
            "",
            "## dlscale evaluate (the same checkpoint, test split)",
            "",
            f"{evaluation['samples']} samples: {_span(evaluation['samples_per_second_interval'])} samples/s.",
        ]
    lines += [
        "",
        "## Model only: what a 10-day rollout costs",
        "",
        "| config | grid | parameters | batch | precision | s per batch step | s per 10-day rollout of one batch |",
        "|---|---|---:|---:|---|---|---|",
    ]
    for entry in record["model_only"]:
        per_batch = entry["seconds_per_batch_interval"]
        rollout = {key: value * ROLLOUT_STEPS for key, value in per_batch.items() if key != "trials"}
        lines.append(
            f"| {entry['config']} | {entry['img_size'][0]}x{entry['img_size'][1]} | {entry['parameters']:,} | "
            f"{entry['batch_size']} | {entry['amp_mode']} | {_span(per_batch, 3)} | {_span(rollout, 1)} |"
        )
    return "\n".join(lines) + "\n"


def _span(found: dict[str, float], digits: int = 1) -> str:
    return f"{found['mean']:.{digits}f} ({found['low']:.{digits}f} to {found['high']:.{digits}f})"


def plot(record: dict[str, Any], path: Path) -> None:
    """Forecast steps/s against initial times per batch, with the trials' intervals."""
    figure = Figure(figsize=(6, 3.6), layout="constrained")
    axis = figure.subplots()
    for key, label in (
        ("forecast_steps_per_second_interval", "in the model"),
        ("rollout_days_per_second_interval", "whole pass, reading the truth and scoring included"),
    ):
        scale = 4.0 if key.startswith("rollout") else 1.0
        sizes = [entry["batch_size"] for entry in record["forecast"]]
        means = [entry[key]["mean"] * scale for entry in record["forecast"]]
        errors = [
            [(entry[key]["mean"] - entry[key]["low"]) * scale for entry in record["forecast"]],
            [(entry[key]["high"] - entry[key]["mean"]) * scale for entry in record["forecast"]],
        ]
        axis.errorbar(sizes, means, yerr=errors, marker="o", capsize=4, label=label)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("initial times per batch")
    axis.set_ylabel("forecast steps / s")
    axis.set_ylim(bottom=0)
    axis.grid(alpha=0.3)
    axis.legend()
    axis.set_title(f"dlscale forecast, demo model, {record['device']} (95% CI)", fontsize="medium")
    figure.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if not args.model_only and not (Path(args.run) / "checkpoints").is_dir():
        print(
            f"{args.run}: no trained run; train the demo first (make demo), or --model-only", file=sys.stderr
        )
        return 2
    device = Device.select()
    forecast, evaluation = [], None
    if not args.model_only:
        for size in (int(value) for value in args.batch_sizes.split(",")):
            entry = forecast_trials(args, size)
            entry["forecast_steps_per_second_interval"] = interval(entry["forecast_steps_per_second"])
            entry["rollout_days_per_second_interval"] = interval(entry["rollout_days_per_second"])
            forecast.append(entry)
        evaluation = evaluate_trials(args)
        evaluation["samples_per_second_interval"] = interval(evaluation["samples_per_second"])
    model_only = []
    for config in (name for name in args.configs.split(",") if name):
        for amp_mode in args.amp_modes.split(","):
            entry = model_only_trials(args, config, amp_mode.strip(), device)
            entry["seconds_per_batch_interval"] = interval(entry["seconds_per_batch"])
            model_only.append(entry)
    threads = torch.get_num_threads()
    device_name = f"cpu-{threads}-threads" if device.torch.type == "cpu" else device.name
    record = {
        "device": device_name,
        "date": datetime.now().strftime("%Y-%m-%d"),
        "torch": str(torch.__version__),
        "platform": platform.platform(),
        "command": command_line(
            "benchmarks/forecast_throughput.py", argv if argv is not None else sys.argv[1:]
        ),
        "run": args.run,
        "forecast": forecast,
        "evaluate": evaluation,
        "model_only": model_only,
    }
    out = Path(args.out)
    stem = out / f"{record['date']}-{device_name.replace(' ', '-')}-forecast-throughput"
    write_text_atomically(stem.with_suffix(".json"), json.dumps(record, indent=2) + "\n")
    write_text_atomically(stem.with_suffix(".md"), markdown(record))
    if forecast:
        plot(record, stem.with_suffix(".png"))
    print(markdown(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
