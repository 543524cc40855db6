"""What multi-step fine-tuning buys a forecast: RMSE and ACC per lead of several trained runs on one split, with
95% intervals over blocks of initial times, and each run set against a reference run (paired by block).

    OMP_NUM_THREADS=2 PYTHONPATH=src python benchmarks/multistep_forecast_skill.py \\
        --run 1-step=runs/demo/00 --run K=1=runs/demo/ft-k1 --run K=2=runs/demo/ft-k2 --run K=4=runs/demo/ft-k4 \\
        [--split test] [--lead 10d] [--blocks 8] [--channels z500 t850 t2m u10] [--days 1 3 5 7 10]

Intervals. Consecutive initial times (12 h apart) are far from independent: the same weather system is in
several of them, so a t-interval over ~240 initial times would be several times too narrow. The initial times
are cut into ``--blocks`` contiguous blocks of equal size (two weeks each on the demo's test year), each block is
forecast and scored on its own with ``dlscale.forecast`` (WeatherBench2's RMSE: the square root of the block's
mean squared error; the ACC: the block's mean), and the intervals are Student-t intervals over the blocks: for the
RMSE, of the blocks' mean squared errors, then square-rooted (the whole split's RMSE is the root of their mean,
as the blocks are of equal size). Comparisons with the reference run are paired (the same blocks of initial
times): the interval of the mean difference of the blocks' RMSEs; "better" means that interval lies below 0.

Each run's block directories land under its ``forecast/`` (named by their initial times); the record keeps the
numbers, the command, the device and the versions. Results: ``benchmarks/results/<date>-<device>-multistep-
forecast-skill.{json,md,png}``; ``--from-json RECORD`` writes the Markdown and PNG again from a record.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmark_text import command_line
from matplotlib.figure import Figure

from dlscale.perf.bench.intervals import mean_interval
from dlscale.runtime.atomic_files import write_text_atomically

REPO = Path(__file__).resolve().parents[1]
FORECASTERS = ("model", "persistence", "climatology")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--run", action="append", default=[], help="LABEL=RUN_DIR (the first is the reference)"
    )
    parser.add_argument("--split", default="test")
    parser.add_argument("--lead", default="10d")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--channels", nargs="+", default=["z500", "t850", "t2m", "u10"])
    parser.add_argument("--days", type=float, nargs="+", default=[1, 3, 5, 7, 10])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--from-json", type=Path, help="write the Markdown and PNG of this record again")
    args = parser.parse_args(argv)
    if args.from_json is None and len(args.run) < 2:
        parser.error("give at least two --run LABEL=RUN_DIR (the first is the reference)")
    return args


def interval(values: list[float]) -> dict[str, float]:
    """Mean and 95% Student-t interval of ``values`` (one per block)."""
    found = mean_interval(values)
    return {"mean": found.mean, "low": found.low, "high": found.high}


def rmse_interval(block_rmse: list[float]) -> dict[str, float]:
    """The split's RMSE (the root of the blocks' mean MSE) with the interval of that mean, square-rooted."""
    found = interval([value**2 for value in block_rmse])
    return {
        key: math.sqrt(max(value, 0.0)) if math.isfinite(value) else value for key, value in found.items()
    }


def blocks_of(initial_times: list[str], count: int) -> list[list[str]]:
    """``count`` contiguous blocks of equal size (the last few initial times dropped when they do not divide)."""
    size = len(initial_times) // count
    if size < 1:
        raise SystemExit(f"{len(initial_times)} initial times cannot make {count} blocks")
    return [initial_times[k * size : (k + 1) * size] for k in range(count)]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    import dlscale

    # label may itself hold "=" (K=2=runs/...): the run directory is after the last "="
    runs = [(text.rsplit("=", 1)[0], text.rsplit("=", 1)[1]) for text in args.run]
    probe = dlscale.forecast(runs[0][1], split=args.split, lead=args.lead)
    blocks = blocks_of(probe["initial_times"], args.blocks)
    lead_hours = probe["lead_hours"]
    per_run: dict[str, Any] = {}
    for label, run in runs:
        documents = []
        for number, block in enumerate(blocks):
            print(f"{label}: block {number + 1}/{len(blocks)} ({block[0]} .. {block[-1]})", flush=True)
            documents.append(dlscale.forecast(run, split=args.split, lead=args.lead, init=",".join(block)))
        per_run[label] = {"run": run, "blocks": [_scores_of(doc, args.channels) for doc in documents]}
        per_run[label]["climatology"] = documents[0].get("climatology")
    return {
        "benchmark": "multistep_forecast_skill",
        "date": datetime.now().isoformat(timespec="seconds"),
        "command": command_line("benchmarks/multistep_forecast_skill.py", sys.argv[1:]),
        "device": "cpu",
        "host": platform.node(),
        "torch": str(torch.__version__),
        "dlscale": dlscale.__version__,
        "split": args.split,
        "lead": args.lead,
        "blocks": [[block[0], block[-1], len(block)] for block in blocks],
        "lead_hours": lead_hours,
        "channels": args.channels,
        "days": args.days,
        "units": {name: probe["units"][name] for name in args.channels},
        "reference": runs[0][0],
        "runs": per_run,
    }


def _six_digits(values: list[float | None] | None) -> list[float | None] | None:
    """A lead's scores to 6 significant digits (the record stays small; the intervals are far wider)."""
    return None if values is None else [None if v is None else float(f"{v:.6g}") for v in values]


def _scores_of(document: dict[str, Any], channels: list[str]) -> dict[str, Any]:
    scores = document["scores"]
    return {
        forecaster: {
            metric: {name: _six_digits((scores[forecaster].get(metric) or {}).get(name)) for name in channels}
            for metric in ("rmse", "acc", "bias")
        }
        for forecaster in FORECASTERS
        if forecaster in scores
    }


def lead_index(record: dict[str, Any], days: float) -> int | None:
    hours = days * 24
    for index, value in enumerate(record["lead_hours"]):
        if abs(value - hours) < 1e-6:
            return index
    return None


def summarize(record: dict[str, Any]) -> dict[str, Any]:
    """Per run, forecaster, channel and reported day: RMSE and ACC with intervals; per fine-tuned run the paired
    RMSE difference to the reference."""
    out: dict[str, Any] = {}
    reference = record["runs"][record["reference"]]["blocks"]
    for label, run in record["runs"].items():
        rows = out.setdefault(label, {})
        for forecaster in FORECASTERS:
            if forecaster not in run["blocks"][0]:
                continue
            for name in record["channels"]:
                for days in record["days"]:
                    k = lead_index(record, days)
                    if k is None:
                        continue
                    rmse = [block[forecaster]["rmse"][name][k] for block in run["blocks"]]
                    row = {"rmse": rmse_interval(rmse)}
                    acc = [block[forecaster]["acc"][name] for block in run["blocks"]]
                    if all(values is not None and values[k] is not None for values in acc):
                        row["acc"] = interval([values[k] for values in acc])
                    if forecaster == "model" and label != record["reference"]:
                        base = [block["model"]["rmse"][name][k] for block in reference]
                        row["rmse_minus_reference"] = interval(
                            [a - b for a, b in zip(rmse, base, strict=True)]
                        )
                    rows.setdefault(forecaster, {}).setdefault(name, {})[str(days)] = row
    return out


def interval_text(found: dict[str, float], digits: int = 3) -> str:
    if not math.isfinite(found["low"]):
        return f"{found['mean']:.{digits}g}"
    return f"{found['mean']:.{digits}g} ({found['low']:.{digits}g} to {found['high']:.{digits}g})"


def markdown(record: dict[str, Any]) -> str:
    table = summarize(record)
    labels = list(record["runs"])
    blocks = record["blocks"]
    lines = [
        f"# {record.get('title', 'Multi-step fine-tuning')}: forecast skill on the {record['split']} split "
        f"({record['date'][:10]})",
        "",
        f"Command: `{record['command']}`",
        "",
        f"Device: {record['device']}; torch {record['torch']}; dlscale {record['dlscale']}. Lead {record['lead']}; "
        f"{len(blocks)} blocks of {blocks[0][2]} initial times ({blocks[0][0]} .. {blocks[-1][1]}); 95% Student-t "
        "intervals over the blocks (see the script's docstring). Runs: "
        + ", ".join(f"{label} = `{run['run']}`" for label, run in record["runs"].items())
        + f"; the reference is {record['reference']}.",
        "",
    ]
    climatology = record["runs"][labels[0]].get("climatology")
    if climatology:
        lines += [f"Climatology (ACC reference and baseline): {json.dumps(climatology)}", ""]
    days = record["days"]
    head = ["| run | " + " | ".join(f"{d:g} d" for d in days) + " |", "|---|" + "---|" * len(days)]

    def row(label: str, cells_of: dict[str, Any], key: str) -> str:
        return f"| {label} | " + " | ".join(interval_text(cells_of[str(d)][key]) for d in days) + " |"

    for name in record["channels"]:
        unit = record["units"].get(name, "")
        lines += [f"## {name} RMSE ({unit})", "", *head]
        lines += [row(label, table[label]["model"][name], "rmse") for label in labels]
        for forecaster in ("persistence", "climatology"):
            if forecaster in table[labels[0]]:
                lines.append(row(forecaster, table[labels[0]][forecaster][name], "rmse"))
        lines += ["", f"{name}: RMSE minus the reference's, paired by block (below 0: better)", "", *head]
        lines += [row(label, table[label]["model"][name], "rmse_minus_reference") for label in labels[1:]]
        if "acc" in table[labels[0]]["model"][name][str(days[0])]:
            lines += ["", f"{name} ACC", "", *head]
            lines += [row(label, table[label]["model"][name], "acc") for label in labels]
        lines.append("")
    if record.get("meaning"):
        lines += ["## What it means", "", record["meaning"], ""]
    return "\n".join(lines)


def channel_panels(channels: list[str], width: float = 5.0, height: float = 4.2) -> tuple[Figure, Any]:
    """A figure of one row of panels, one per channel, ``width`` x ``height`` inches each."""
    figure = Figure(figsize=(width * len(channels), height), layout="constrained")
    return figure, figure.subplots(1, len(channels), squeeze=False)[0]


def plot(record: dict[str, Any], path: Path) -> None:
    """RMSE against lead for each channel: every run a line with its interval band, the baselines dashed."""
    channels = record["channels"]
    figure, axes = channel_panels(channels)
    days = [hours / 24 for hours in record["lead_hours"]]
    for axis, name in zip(axes, channels, strict=True):
        for label, run in record["runs"].items():
            per_lead = []
            for k in range(1, len(days)):
                per_lead.append(rmse_interval([block["model"]["rmse"][name][k] for block in run["blocks"]]))
            x = days[1:]
            (line,) = axis.plot(x, [p["mean"] for p in per_lead], label=label)
            axis.fill_between(x, [p["low"] for p in per_lead], [p["high"] for p in per_lead], alpha=0.2,
                              color=line.get_color())  # fmt: skip
        reference = record["runs"][record["reference"]]["blocks"]
        for forecaster, style in (("persistence", ":"), ("climatology", "--")):
            if forecaster in reference[0]:
                values = [rmse_interval([b[forecaster]["rmse"][name][k] for b in reference])["mean"]
                          for k in range(1, len(days))]  # fmt: skip
                axis.plot(days[1:], values, style, color="0.3", label=forecaster)
        axis.set_title(f"{name}")
        axis.set_xlabel("lead (days)")
        axis.set_ylabel(f"RMSE ({record['units'].get(name, '')})")
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    title = record.get("title", "Multi-step fine-tuning")
    figure.suptitle(f"{title}: RMSE on the {record['split']} split (bands: 95% over blocks)")
    figure.savefig(path, dpi=110)


def write_results(record: dict[str, Any], stem: Path, markdown=markdown, plot=plot) -> None:
    """The record as JSON, Markdown (``markdown(record)``) and PNG (``plot(record, path)``) beside ``stem``."""
    write_text_atomically(stem.with_suffix(".json"), json.dumps(record))
    write_text_atomically(stem.with_suffix(".md"), markdown(record))
    plot(record, stem.with_suffix(".png"))
    print(f"wrote {stem}.json, .md, .png")


def record_or_rewrite(args: argparse.Namespace, measure, name: str, markdown=markdown, plot=plot) -> int:
    """Measure and write ``<date>-<device>-<name>.*``, or with ``--from-json`` write a record's Markdown and PNG
    again."""
    if args.from_json is not None:
        record = json.loads(args.from_json.read_text())
        write_results(record, args.from_json.with_suffix(""), markdown, plot)
        return 0
    record = measure(args)
    write_results(record, args.out / f"{record['date'][:10]}-{record['device']}-{name}", markdown, plot)
    return 0


def main(argv: list[str] | None = None) -> int:
    return record_or_rewrite(parse_args(argv), measure, "multistep-forecast-skill")


if __name__ == "__main__":
    raise SystemExit(main())
