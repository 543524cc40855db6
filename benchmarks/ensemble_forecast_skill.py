"""What an ensemble buys a forecast: CRPS and spread/skill per lead for ensembles of several sizes, against the
deterministic forecast's MAE (the CRPS of a one-member ensemble), with 95% intervals over blocks of initial times,
and the time each member costs; the perturbation scale chosen on the validation split, not the test split.

    OMP_NUM_THREADS=2 PYTHONPATH=src python benchmarks/ensemble_forecast_skill.py --run runs/demo/00 \\
        [--scales 0.5 0.75 1.0] [--length-km 500] [--choose-members 8] [--choose-init-count 16] \\
        [--choose-days 5] [--members 8 16 32] [--split test] [--lead 10d] [--blocks 8] [--per-block 3]

1. Choosing the scale (``--split valid`` always): an ensemble of ``--choose-members`` from ``--choose-init-count``
   initial times spread over the validation year, for each of ``--scales`` (``--perturb gaussian:SCALE:LENGTH``);
   the chosen scale is the one whose spread/skill ratio at ``--choose-days`` is closest to 1 (the mean over the
   channels of |log ratio|).
2. Scoring on ``--split``: ``--blocks`` x ``--per-block`` initial times evenly spread over the split (as
   ``--init-count`` spreads them), cut into ``--blocks`` runs of ``--per-block`` consecutive ones (two weeks each
   on the demo's test year: initial times close in time share their weather, so each block is one sample);
   every ensemble size forecasts every block with
   ``dlscale.forecast(..., members=N)``. Intervals are Student-t intervals over the blocks: of the blocks' CRPS, of
   the blocks' mean squared errors (then square-rooted), of the blocks' spread/skill ratios; comparisons with
   the deterministic forecast (member 0, the control) are paired by block: "better" means the interval of the
   difference lies below 0.
   Every forecast is written without figures (``figures=False``): they change no number and cost seconds.
3. Time per member: the model's seconds per member and model step (``throughput.model_seconds /
   forecast_steps``), and the whole rollout's (reading and scoring included). Kept for every block, but a CPU
   measurement is only fair on an idle machine: ``--time-into RECORD`` times ``--time-trials`` forecasts of one
   member and of each ensemble size alone and adds them to the record, which the Markdown then shows.

Results: ``benchmarks/results/<date>-<device>-ensemble-forecast-skill.{json,md,png}``; ``--from-json RECORD``
writes the Markdown and PNG again from a record.
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
from multistep_forecast_skill import (
    blocks_of,
    interval,
    interval_text,
    lead_index,
    record_or_rewrite,
    rmse_interval,
    write_results,
)

REPO = Path(__file__).resolve().parents[1]
CALIBRATED = (0.7, 1.3)  # the band for the spread/skill ratio


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", help="the trained run directory")
    parser.add_argument("--scales", type=float, nargs="+", default=[0.5, 0.75, 1.0])
    parser.add_argument("--length-km", type=float, default=500.0)
    parser.add_argument("--choose-members", type=int, default=8)
    parser.add_argument("--choose-init-count", type=int, default=16)
    parser.add_argument("--choose-days", type=float, default=5.0)
    parser.add_argument("--members", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--split", default="test")
    parser.add_argument("--lead", default="10d")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--per-block", type=int, default=3)
    parser.add_argument("--channels", nargs="+", default=["z500", "t850", "t2m", "u10"])
    parser.add_argument("--days", type=float, nargs="+", default=[1, 3, 5, 7, 10])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--from-json", type=Path, help="write the Markdown and PNG of this record again")
    parser.add_argument(
        "--time-into",
        type=Path,
        help="time the members alone (an idle machine) and add it to this record: --time-trials forecasts of "
        "--time-init-count initial times and --time-lead for 1 member and each of --members",
    )
    parser.add_argument("--time-trials", type=int, default=3)
    parser.add_argument("--time-init-count", type=int, default=4)
    parser.add_argument("--time-lead", default="2d")
    args = parser.parse_args(argv)
    if args.from_json is None and args.time_into is None and args.run is None:
        parser.error("give --run RUN_DIR (or --from-json RECORD)")
    return args


def _perturb(scale: float, length_km: float) -> str:
    return f"gaussian:{scale:g}:{length_km:g}"


def _ensemble_scores(document: dict[str, Any], channels: list[str]) -> dict[str, Any]:
    """What the record keeps of one forecast: per channel and lead, the scores below, and the timings."""
    ensemble, scores = document["ensemble"], document["scores"]
    keys = ("crps", "deterministic_crps", "spread", "spread_skill")
    kept = {key: {name: ensemble[key][name] for name in channels} for key in keys}
    kept["control_rmse"] = {name: scores["model"]["rmse"][name] for name in channels}
    kept["ensemble_mean_rmse"] = {name: scores["ensemble"]["rmse"][name] for name in channels}
    throughput = document["throughput"]
    kept["throughput"] = {key: throughput[key] for key in ("forecast_steps", "model_seconds", "seconds")}
    return kept


def choose_scale(args: argparse.Namespace) -> dict[str, Any]:
    import dlscale

    trials = []
    for scale in args.scales:
        print(f"choosing: scale {scale:g} on the valid split", flush=True)
        document = dlscale.forecast(
            args.run,
            split="valid",
            lead=f"{args.choose_days:g}d",
            init_count=args.choose_init_count,
            members=args.choose_members,
            perturb=_perturb(scale, args.length_km),
            figures=False,
        )
        ratios = {name: document["ensemble"]["spread_skill"][name][-1] for name in args.channels}
        distance = sum(abs(math.log(r)) for r in ratios.values()) / len(ratios)
        trials.append({"scale": scale, "spread_skill": ratios, "mean_abs_log_ratio": distance})
    best = min(trials, key=lambda trial: trial["mean_abs_log_ratio"])
    return {
        "split": "valid",
        "members": args.choose_members,
        "init_count": args.choose_init_count,
        "days": args.choose_days,
        "trials": trials,
        "chosen_scale": best["scale"],
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    import dlscale

    choice = choose_scale(args)
    perturb = _perturb(choice["chosen_scale"], args.length_km)
    # The deterministic forecast of blocks x per-block initial times evenly spread over the split: consecutive
    # runs of per-block of them are the blocks.
    count = args.blocks * args.per_block
    probe = dlscale.forecast(args.run, split=args.split, lead=args.lead, init_count=count, figures=False)
    blocks = blocks_of(probe["initial_times"], args.blocks)
    per_size: dict[str, Any] = {}
    for members in args.members:
        documents = []
        for number, block in enumerate(blocks):
            print(
                f"{members} members: block {number + 1}/{len(blocks)} ({block[0]} .. {block[-1]})", flush=True
            )
            documents.append(
                dlscale.forecast(
                    args.run,
                    split=args.split,
                    lead=args.lead,
                    init=",".join(block),
                    members=members,
                    perturb=perturb,
                    figures=False,
                )
            )
        per_size[str(members)] = [_ensemble_scores(document, args.channels) for document in documents]
    return {
        "benchmark": "ensemble_forecast_skill",
        "date": datetime.now().isoformat(timespec="seconds"),
        "command": command_line("benchmarks/ensemble_forecast_skill.py", sys.argv[1:]),
        "device": "cpu",
        "host": platform.node(),
        "torch": str(torch.__version__),
        "dlscale": dlscale.__version__,
        "run": args.run,
        "split": args.split,
        "lead": args.lead,
        "perturb": perturb,
        "choice": choice,
        "blocks": [[block[0], block[-1], len(block)] for block in blocks],
        "lead_hours": probe["lead_hours"],
        "channels": args.channels,
        "days": args.days,
        "units": {name: probe["units"][name] for name in args.channels},
        "climatology": probe.get("climatology"),
        "climatology_rmse": {name: probe["scores"]["climatology"]["rmse"][name] for name in args.channels}
        if "climatology" in probe["scores"]
        else None,
        "ensembles": per_size,
    }


def summarize(record: dict[str, Any]) -> dict[str, Any]:
    """Per ensemble size, channel and reported day: CRPS, the control's MAE, their paired difference, the
    ensemble mean's RMSE and the control's with the paired difference, and the spread/skill ratio."""
    out: dict[str, Any] = {}
    for size, blocks in record["ensembles"].items():
        for name in record["channels"]:
            for days in record["days"]:
                k = lead_index(record, days)
                if k is None:
                    continue

                def values(key: str, k: int = k, name: str = name, blocks: list = blocks) -> list[float]:
                    return [block[key][name][k] for block in blocks]

                crps, mae = values("crps"), values("deterministic_crps")
                mean_rmse, control_rmse = values("ensemble_mean_rmse"), values("control_rmse")
                out.setdefault(size, {}).setdefault(name, {})[str(days)] = {
                    "crps": interval(crps),
                    "mae": interval(mae),
                    "crps_minus_mae": interval([a - b for a, b in zip(crps, mae, strict=True)]),
                    "ensemble_mean_rmse": rmse_interval(mean_rmse),
                    "control_rmse": rmse_interval(control_rmse),
                    "mean_rmse_minus_control": interval(
                        [a - b for a, b in zip(mean_rmse, control_rmse, strict=True)]
                    ),
                    "spread_skill": interval(values("spread_skill")),
                }
        seconds = [b["throughput"]["model_seconds"] / b["throughput"]["forecast_steps"] for b in blocks]
        whole = [b["throughput"]["seconds"] / b["throughput"]["forecast_steps"] for b in blocks]
        out[size]["time"] = {
            "model_ms_per_member_step": interval([1000 * s for s in seconds]),
            "rollout_ms_per_member_step": interval([1000 * s for s in whole]),
        }
    return out


def markdown(record: dict[str, Any]) -> str:
    table = summarize(record)
    sizes = list(record["ensembles"])
    blocks, days, choice = record["blocks"], record["days"], record["choice"]
    lines = [
        f"# Ensembles: CRPS and spread/skill on the {record['split']} split ({record['date'][:10]})",
        "",
        f"Command: `{record['command']}`",
        "",
        f"Device: {record['device']}; torch {record['torch']}; dlscale {record['dlscale']}. Run `{record['run']}`; "
        f"lead {record['lead']}; {len(blocks)} blocks of {blocks[0][2]} initial times ({blocks[0][0]} .. "
        f"{blocks[-1][1]}); 95% Student-t intervals over the blocks (see the script's docstring). Perturbation "
        f"`--perturb {record['perturb']}`; member 0 is the control (the deterministic forecast).",
        "",
        f"## The scale, chosen on the validation split ({choice['members']} members, {choice['init_count']} "
        f"initial times, spread/skill at {choice['days']:g} days)",
        "",
        "| scale | " + " | ".join(record["channels"]) + " | mean abs log ratio |",
        "|---|" + "---|" * (len(record["channels"]) + 1),
    ]
    for trial in choice["trials"]:
        ratios = " | ".join(f"{trial['spread_skill'][name]:.3g}" for name in record["channels"])
        mark = " (chosen)" if trial["scale"] == choice["chosen_scale"] else ""
        lines.append(f"| {trial['scale']:g}{mark} | {ratios} | {trial['mean_abs_log_ratio']:.3g} |")
    lines.append("")
    head = ["| members | " + " | ".join(f"{d:g} d" for d in days) + " |", "|---|" + "---|" * len(days)]

    def row(label: str, cells: dict[str, Any], key: str) -> str:
        return (
            f"| {label} | "
            + " | ".join(interval_text(cells[str(d)][key]) for d in days if str(d) in cells)
            + " |"
        )

    for name in record["channels"]:
        unit = record["units"].get(name, "")
        lines += [
            f"## {name}",
            "",
            f"CRPS ({unit}); the control's MAE (the CRPS of one member) last",
            "",
            *head,
        ]
        lines += [row(size, table[size][name], "crps") for size in sizes]
        lines += [row("control MAE", table[sizes[0]][name], "mae"), ""]
        lines += [f"CRPS minus the control's MAE, paired by block (below 0: better), {unit}", "", *head]
        lines += [row(size, table[size][name], "crps_minus_mae") for size in sizes]
        lines += ["", "Spread/skill ratio (1: calibrated)", "", *head]
        lines += [row(size, table[size][name], "spread_skill") for size in sizes]
        lines += ["", f"Ensemble-mean RMSE ({unit}); the control's last", "", *head]
        lines += [row(size, table[size][name], "ensemble_mean_rmse") for size in sizes]
        lines += [row("control", table[sizes[0]][name], "control_rmse"), ""]
        lines += ["Ensemble-mean RMSE minus the control's, paired by block (below 0: better)", "", *head]
        lines += [row(size, table[size][name], "mean_rmse_minus_control") for size in sizes]
        lines.append("")
    lines += _time_lines(record, table, sizes)
    if record.get("meaning"):
        lines += ["## What it means", "", record["meaning"], ""]
    return "\n".join(lines)


def _time_lines(record: dict[str, Any], table: dict[str, Any], sizes: list[str]) -> list[str]:
    """The time per member: from the idle timing runs when the record has them, else from the scoring runs."""
    lines = ["## Time per member", ""]
    timing = record.get("timing")
    if timing is None:
        lines += ["Measured during the scoring runs (not on an idle machine).", ""]
        rows = [(size, table[size]["time"]) for size in sizes]
    else:
        lines += [
            f"{timing['trials']} forecasts of each size alone after one untimed ({timing['init_count']} initial "
            f"times, lead {timing['lead']}, the default batch: the run's batch over the members), machine otherwise "
            "idle; the rollout's time holds reading the truth and the climatology, once for all members; "
            f"`{timing['command']}`.",
            "",
        ]
        rows = []
        for size, trials in timing["sizes"].items():
            model = [1000 * t["model_seconds"] / t["forecast_steps"] for t in trials]
            whole = [1000 * t["seconds"] / t["forecast_steps"] for t in trials]
            rows.append(
                (
                    size,
                    {
                        "model_ms_per_member_step": interval(model),
                        "rollout_ms_per_member_step": interval(whole),
                    },
                )
            )
    lines += ["| members | model ms per member-step | rollout ms per member-step |", "|---|---|---|"]
    for size, time in rows:
        lines.append(
            f"| {size} | {interval_text(time['model_ms_per_member_step'])} | {interval_text(time['rollout_ms_per_member_step'])} |"
        )
    return [*lines, ""]


def plot(record: dict[str, Any], path: Path) -> None:
    """Per channel: CRPS of each ensemble and the control's MAE against lead (top), spread/skill (bottom), with
    95% bands over the blocks."""
    channels, sizes = record["channels"], list(record["ensembles"])
    figure = Figure(figsize=(4.6 * len(channels), 7.4), layout="constrained")
    axes = figure.subplots(2, len(channels), squeeze=False)
    days = [hours / 24 for hours in record["lead_hours"]]
    x = days[1:]
    for column, name in enumerate(channels):
        top, bottom = axes[0, column], axes[1, column]
        for size in sizes:
            blocks = record["ensembles"][size]
            crps = [interval([b["crps"][name][k] for b in blocks]) for k in range(1, len(days))]
            (line,) = top.plot(x, [c["mean"] for c in crps], label=f"CRPS, {size} members")
            top.fill_between(
                x, [c["low"] for c in crps], [c["high"] for c in crps], alpha=0.2, color=line.get_color()
            )
            ratio = [interval([b["spread_skill"][name][k] for b in blocks]) for k in range(1, len(days))]
            bottom.plot(x, [r["mean"] for r in ratio], color=line.get_color(), label=f"{size} members")
            bottom.fill_between(x, [r["low"] for r in ratio], [r["high"] for r in ratio], alpha=0.2,
                                color=line.get_color())  # fmt: skip
        blocks = record["ensembles"][sizes[0]]
        mae = [
            interval([b["deterministic_crps"][name][k] for b in blocks])["mean"] for k in range(1, len(days))
        ]
        top.plot(x, mae, "--", color="0.2", label="control's MAE (1 member)")
        bottom.axhline(1.0, color="0.2", linewidth=0.8)
        bottom.axhspan(*CALIBRATED, color="tab:green", alpha=0.08, label="0.7 to 1.3")
        unit = record["units"].get(name, "")
        top.set_title(name)
        top.set_ylabel(f"CRPS / MAE ({unit})")
        bottom.set_ylabel("spread/skill (1: calibrated)")
        bottom.set_xlabel("lead (days)")
        for axis in (top, bottom):
            axis.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    axes[1, 0].legend(fontsize=8)
    figure.suptitle(
        f"Ensembles on the {record['split']} split, --perturb {record['perturb']} (scale chosen on the valid split); "
        "bands: 95% over blocks"
    )
    figure.savefig(path, dpi=110)


def time_members(args: argparse.Namespace) -> dict[str, Any]:
    """Seconds per member and model step of 1 member and of each ensemble size, ``--time-trials`` times each."""
    import dlscale

    record = json.loads(args.time_into.read_text())
    run = args.run or record["run"]
    timing: dict[str, Any] = {
        "lead": args.time_lead,
        "init_count": args.time_init_count,
        "trials": args.time_trials,
        "command": command_line("benchmarks/ensemble_forecast_skill.py", sys.argv[1:]),
        "sizes": {},
    }
    # One forecast untimed first: the first in a process pays for imports, allocations and the data's first reads.
    dlscale.forecast(
        run, split=record["split"], lead=args.time_lead, init_count=args.time_init_count, figures=False
    )
    for members in [1, *[int(size) for size in record["ensembles"]]]:
        trials = []
        for trial in range(args.time_trials):
            print(f"timing {members} member(s), trial {trial + 1}/{args.time_trials}", flush=True)
            options = {"members": members, "perturb": record["perturb"]} if members > 1 else {}
            document = dlscale.forecast(
                run,
                split=record["split"],
                lead=args.time_lead,
                init_count=args.time_init_count,
                figures=False,
                **options,
            )
            throughput = document["throughput"]
            trials.append({key: throughput[key] for key in ("forecast_steps", "model_seconds", "seconds")})
        timing["sizes"][str(members)] = trials
    record["timing"] = timing
    return record


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.time_into is not None:
        record = time_members(args)
        write_results(record, args.time_into.with_suffix(""), markdown, plot)
        return 0
    return record_or_rewrite(args, measure, "ensemble-forecast-skill", markdown, plot)


if __name__ == "__main__":
    raise SystemExit(main())
