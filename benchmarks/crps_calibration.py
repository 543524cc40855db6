"""Issue 50: is a CRPS-trained ensemble calibrated? Its spread/skill ratio per channel and lead and its CRPS against
the gaussian-perturbed ensemble of the same base model, with 95% intervals over blocks of initial times, and what
a training step costs against the number of members.

    OMP_NUM_THREADS=2 PYTHONPATH=src python benchmarks/crps_calibration.py --base runs/demo/00 \\
        [--crps-run runs/crps_demo/ft] [--finetune-iters 400] [--perturb gaussian:0.75] [--members 16 32] \\
        [--blocks 8] [--per-block 3] [--cost-members 1 2 4 8] [--out DIR] [--from-json RECORD]

1. The CRPS model: the base run's weights (a deterministic ``demo``) fine-tuned as ``crps_demo`` (4 noise
   channels, 4 members a sample; its noise channels' input weights start at zero, so it starts as the base
   model) for ``--finetune-iters`` steps at lr 3e-4 with 10 warm-up steps (the multi-step fine-tune's rate), unless
   ``--crps-run`` already holds a finished run.
2. The two ensembles on ``--split`` (test): ``--blocks`` x ``--per-block`` initial times evenly spread over the split,
   in ``--blocks`` runs of consecutive ones (initial times close in time share their weather: each block is one
   sample), for every size in ``--members``: the CRPS model's own noise (``--perturb noise``) and the base model
   with ``--perturb`` (``gaussian:0.75``: the scale issue 39's benchmark chose on the validation year, record
   ``benchmarks/results/2026-11-27-cpu-ensemble-forecast-skill.md``). Student-t intervals over the blocks, of
   each block's spread/skill ratio and CRPS; the two ensembles' CRPS compared paired by block.
3. The cost: ``dlscale bench``'s SYNTHETIC trials (the training step on device-resident batches, no I/O) of the
   deterministic ``demo`` (M = 1) and of ``crps_demo`` with each of ``--cost-members``: milliseconds per training
   sample (a sample's M members included) with the interval of the trials, and the activations ``dlscale plan``
   traces for the step (a CPU has no device-memory peak to read).

The issue's targets: the CRPS model's spread/skill in [0.8, 1.25] at 1, 3 and 5 days on z500, t850, t2m and u10;
its CRPS at 5 days below the gaussian ensemble's on all four, intervals clear of 0. Results:
``benchmarks/results/<date>-cpu-crps-calibration.{json,md,png}``; ``--from-json RECORD`` writes the .md and .png
again.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmark_text import command_line
from ensemble_forecast_skill import _ensemble_scores
from multistep_forecast_skill import (
    blocks_of,
    channel_panels,
    interval,
    interval_text,
    lead_index,
    record_or_rewrite,
)

from dlscale.report.forecast_selection import lead_text

REPO = Path(__file__).resolve().parents[1]
BAND = (0.8, 1.25)  # dlscale.scoring.calibration.CALIBRATED_BAND
ENSEMBLES = ("crps", "gaussian")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--base", default="runs/demo/00", help="the deterministic run both ensembles start from"
    )
    parser.add_argument("--crps-run", default="runs/crps_demo/ft")
    parser.add_argument("--finetune-iters", type=int, default=400)
    parser.add_argument(
        "--cost-members",
        type=int,
        nargs="*",
        default=[1, 2, 4, 8],
        help="members of the cost trials; none (the option alone) measures no cost",
    )
    parser.add_argument(
        "--split-members",
        type=int,
        nargs="*",
        default=[2, 4, 8, 16],
        help="members of the phase timing (noise, forward, loss, backward, optimizer) of a one-step CRPS step",
    )
    parser.add_argument(
        "--gaussian-from",
        type=Path,
        help="take the gaussian ensembles from this earlier record instead of forecasting them again (the same "
        "base, perturbation, split, lead, blocks and sizes are required: they are seeded, so they are the same)",
    )
    parser.add_argument(
        "--paired",
        type=Path,
        nargs=2,
        metavar=("RECORD", "OTHER"),
        help="print the CRPS model of RECORD minus that of OTHER, paired by block (two records of the same blocks), "
        "and measure nothing",
    )
    parser.add_argument(
        "--name",
        default="crps-calibration",
        help="the record's name: <date>-cpu-NAME.{json,md,png} (another CRPS model's record "
        "beside the first)",
    )
    add_block_arguments(parser, lead="10d", days=[1, 3, 5, 10])
    return parser.parse_args(argv)


def add_block_arguments(parser: argparse.ArgumentParser, lead: str, days: list[float]) -> None:
    """The options of an ensemble benchmark scored over blocks of initial times (this one's and
    channel_perturbation_skill.py's): the one-scale perturbation, the sizes, the split and lead, the blocks, the
    channels and days reported, and where the record goes."""
    parser.add_argument("--perturb", default="gaussian:0.75")
    parser.add_argument("--members", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--split", default="test")
    parser.add_argument("--lead", default=lead)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--per-block", type=int, default=3)
    parser.add_argument("--channels", nargs="+", default=["z500", "t850", "t2m", "u10"])
    parser.add_argument("--days", type=float, nargs="+", default=days)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--from-json", type=Path, help="write the Markdown and PNG of this record again")


def fine_tune(args: argparse.Namespace) -> dict[str, Any]:
    """Train the CRPS model from the base run's weights (unless it is there); its summary."""
    run = REPO / args.crps_run
    if run.parent.name != "crps_demo":
        raise SystemExit(
            f"--crps-run {args.crps_run}: expected EXPDIR/crps_demo/NAME (where dlscale train writes)"
        )
    summary_path = run / "summary.json"
    if summary_path.is_file() and json.loads(summary_path.read_text()).get("outcome") == "finished":
        return json.loads(summary_path.read_text())
    command = [sys.executable, "-m", "dlscale", "train", "--config", "crps_demo", "--expdir", str(run.parents[1]),
               "--run_num", run.name, "--resume", str(REPO / args.base / "checkpoints" / "ckpt_latest.pt"),
               "--resume_weights_only", "--progress", "lines", "--set", f"train.num_iters={args.finetune_iters}",
               "--set", "optim.lr=3e-4", "--set", "optim.warmup=10"]  # fmt: skip
    print(" ".join(command[2:]), flush=True)
    subprocess.run(command, cwd=REPO, check=True)
    return json.loads(summary_path.read_text())


def cost(args: argparse.Namespace) -> list[dict[str, Any]]:
    """SYNTHETIC training-step throughput of the deterministic demo and of crps_demo with M members, and the
    activations ``dlscale plan`` traces for the step (a CPU has no device-memory peak to read)."""
    import dlscale
    from dlscale.config import load_run_config
    from dlscale.run.config_plan import traced_plan_of

    rows = []
    for members in args.cost_members:
        if members == 1:
            config, overrides = "demo", []
        else:
            config, overrides = "crps_demo", [f"train.ensemble_members={members}"]
        overrides += [f"log.expdir={REPO / 'runs' / 'crps_cost'}", "bench.ntrials=5", "bench.nbatches=8",
                      "bench.run_io=false", "bench.run_full=false"]  # fmt: skip
        print(f"cost: {config} with {members} member(s)", flush=True)
        results = dlscale.bench("configs/vit_era5.yaml", config, overrides)
        series = results.tests["SYNTHETIC"]
        per_sample = [1000.0 / rate for rate in series.trial_throughput]  # ms per training sample (M members)
        cfg = load_run_config(REPO / "configs" / "vit_era5.yaml", config, overrides)
        memory = traced_plan_of(cfg, 1, 80.0).plan.requested_row.memory
        activations = None if memory is None else memory.activations / 2**30
        rows.append({"members": members, "config": config, "ms_per_sample": per_sample,
                     "planned_activations_gib": activations})  # fmt: skip
    return rows


PHASES = ("noise", "forward", "loss", "backward", "optimizer")


def time_split(members: int, config: str = "crps_demo", repeats: int = 7) -> dict[str, Any]:
    """Where a one-step CRPS training step of ``config`` with ``members`` members spends its time on this CPU:
    each phase timed alone (a CPU runs every op before the call returns, so the clock needs no sync), the median
    of ``repeats`` steps after two warm-up steps, milliseconds per training sample."""
    import statistics
    import time

    import torch

    from dlscale.config import load_run_config
    from dlscale.scoring.metrics import latitude_weights
    from dlscale.training.ensemble_loss import MemberNoise, ensemble_crps
    from dlscale.workloads import get_workload

    cfg = load_run_config(REPO / "configs" / "vit_era5.yaml", config, [f"train.ensemble_members={members}"])
    workload = get_workload(cfg.workload)
    torch.manual_seed(0)
    model = workload.build_model(cfg.model, cfg.data).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    grid = tuple(cfg.data.img_size)
    batch = cfg.train.global_batch_size
    state = torch.randn(batch, cfg.data.n_in_channels, *grid)
    truth = torch.randn(batch, cfg.data.n_out_channels, *grid)
    noise = MemberNoise(0, cfg.model.noise_channels, grid)
    weights = latitude_weights(workload.image_latitudes(cfg.data))
    seconds: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for step in range(repeats + 2):
        clock = time.perf_counter()
        drawn = noise.draw(step, 0, 0, batch, members, state.device)
        marks = [time.perf_counter()]
        prediction = model(torch.cat([state.repeat_interleave(members, dim=0), drawn], dim=1))
        marks.append(time.perf_counter())
        loss = ensemble_crps(prediction.view(batch, members, *prediction.shape[1:]), truth, weights)
        marks.append(time.perf_counter())
        loss.backward()
        marks.append(time.perf_counter())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        marks.append(time.perf_counter())
        if step >= 2:
            for phase, start, end in zip(PHASES, [clock, *marks[:-1]], marks, strict=True):
                seconds[phase].append(end - start)
    per_sample = {phase: 1000.0 * statistics.median(values) / batch for phase, values in seconds.items()}
    return {"members": members, "batch": batch, "repeats": repeats, "ms_per_sample": per_sample}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    import dlscale

    summary = fine_tune(args)
    count = args.blocks * args.per_block
    probe = dlscale.forecast(args.base, split=args.split, lead=args.lead, init_count=count, figures=False)
    blocks = blocks_of(probe["initial_times"], args.blocks)
    earlier = None if args.gaussian_from is None else earlier_gaussians(args, blocks, probe["lead_hours"])
    if earlier is not None:  # one block forecast again: the reused numbers must be what this base gives now
        size = args.members[0]
        (again,) = block_ensembles(
            args, args.base, blocks[:1], size, args.perturb, f"gaussian {size} (check)"
        )
        check_same(again, earlier["ensembles"][f"gaussian {size}"][0], args)
    ensembles: dict[str, Any] = {}
    for members in args.members:
        for name, run, perturb in (("crps", args.crps_run, "noise"), ("gaussian", args.base, args.perturb)):
            label = f"{name} {members}"
            if name == "gaussian" and earlier is not None:
                ensembles[label] = earlier["ensembles"][label]
                continue
            ensembles[label] = block_ensembles(args, run, blocks, members, perturb, label)
    return {
        "benchmark": "crps_calibration",
        "date": datetime.now().isoformat(timespec="seconds"),
        "command": command_line("benchmarks/crps_calibration.py", sys.argv[1:]),
        "device": "cpu",
        "threads": os.environ.get("OMP_NUM_THREADS", "default"),
        "host": platform.node(),
        "torch": str(torch.__version__),
        "dlscale": dlscale.__version__,
        "base": args.base,
        "crps_run": args.crps_run,
        "finetune": {key: summary.get(key) for key in ("global_step", "train_seconds")}
        | {"val_loss": summary["final"]["val_loss"]},
        "recipe": recipe(REPO / args.crps_run),
        "perturb": args.perturb,
        "gaussian_from": None if args.gaussian_from is None else str(args.gaussian_from),
        "split": args.split,
        "lead": args.lead,
        "blocks": block_spans(blocks),
        "lead_hours": probe["lead_hours"],
        "channels": args.channels,
        "days": args.days,
        "members": args.members,
        "units": {name: probe["units"][name] for name in args.channels},
        "ensembles": ensembles,
        "cost": cost(args),
        "time_split": [time_split(members) for members in args.split_members],
    }


def block_spans(blocks: list[list[str]]) -> list[list[Any]]:
    """Each block of initial times as the record keeps it: [first, last, how many]."""
    return [[block[0], block[-1], len(block)] for block in blocks]


def earlier_gaussians(
    args: argparse.Namespace, blocks: list[list[str]], lead_hours: list[float]
) -> dict[str, Any]:
    """The earlier record whose gaussian ensembles this one reuses, once it is shown to have forecast the same
    ones (seeded members: the same settings give the same numbers)."""
    earlier = json.loads(args.gaussian_from.read_text())
    wanted = {
        "base": args.base,
        "perturb": args.perturb,
        "split": args.split,
        "lead_hours": lead_hours,
        "blocks": block_spans(blocks),
    }
    for key, value in wanted.items():
        if earlier.get(key) != value:
            raise SystemExit(
                f"--gaussian-from {args.gaussian_from}: its {key} is {earlier.get(key)!r}, not {value!r}"
            )
    missing = [size for size in args.members if f"gaussian {size}" not in earlier["ensembles"]]
    if missing or not set(args.channels) <= set(earlier["channels"]):
        raise SystemExit(
            f"--gaussian-from {args.gaussian_from}: it lacks the sizes {missing} or the channels {args.channels}"
        )
    return earlier


def check_same(again: dict[str, Any], kept: dict[str, Any], args: argparse.Namespace) -> None:
    """Exit unless a block forecast again scores what the earlier record kept for it (to float32 rounding)."""
    import math

    for key in ("crps", "spread_skill"):
        for name in args.channels:
            for new, old in zip(again[key][name], kept[key][name], strict=True):
                undefined = [value is None or math.isnan(value) for value in (new, old)]  # lead 0's ratio
                if undefined[0] != undefined[1] or (
                    not undefined[0] and not math.isclose(new, old, rel_tol=1e-4, abs_tol=1e-6)
                ):
                    raise SystemExit(
                        f"--gaussian-from {args.gaussian_from}: its first block's {key} of {name} was {old}, "
                        f"and the base gives {new} now; forecast the gaussian ensembles again (drop the option)"
                    )


def recipe(run: Path) -> dict[str, Any]:
    """How the CRPS model was trained, from its run's config.yaml: members, noise channels, rollouts, the rate."""
    from dlscale.config.yaml_source import read_config_file

    (config,) = read_config_file(run / "config.yaml").values()  # {config name: resolved config}
    train, model = config.get("train", {}), config.get("model", {})
    return {
        "ensemble_members": train.get("ensemble_members"),
        "noise_channels": model.get("noise_channels"),
        "rollout_steps": train.get("rollout_steps"),
        "rollout_schedule": train.get("rollout_schedule"),
        "lr": config.get("optim", {}).get("lr"),
    }


def recipe_text(record: dict[str, Any]) -> str:
    """The training recipe in words (records written before it was kept say nothing)."""
    found = record.get("recipe")
    if not found:
        return ""
    steps = (f"rollouts `{found['rollout_schedule']}`" if found.get("rollout_schedule")
             else f"{found.get('rollout_steps') or 1}-step")  # fmt: skip
    return (
        f"; trained with {found['ensemble_members']} members a sample, {found['noise_channels']} noise "
        f"channels, {steps}, lr {found['lr']}"
    )


def block_ensembles(
    args: argparse.Namespace, run: str, blocks: list[list[str]], members: int, perturb: str, label: str
) -> list[dict[str, Any]]:
    """One ensemble forecast of ``run`` per block of initial times (``args``' split, lead and channels), each
    reduced to what the record keeps; ``label`` names it in the progress lines."""
    import dlscale

    kept = []
    for number, block in enumerate(blocks):
        print(f"{label} members: block {number + 1}/{len(blocks)}", flush=True)
        document = dlscale.forecast(run, split=args.split, lead=args.lead, init=",".join(block), members=members,
                                    perturb=perturb, figures=False)  # fmt: skip
        kept.append(_ensemble_scores(document, args.channels))
    return kept


def values(record: dict[str, Any], label: str, key: str, name: str, k: int) -> list[float]:
    return [block[key][name][k] for block in record["ensembles"][label]]


def paired_crps(
    record: dict[str, Any], label: str, other: dict[str, Any], other_label: str, name: str, k: int
) -> dict[str, float]:
    """The interval of ``record``'s ensemble ``label`` minus ``other``'s ``other_label`` in CRPS of ``name`` at lead
    index ``k``, paired by block (the two scored the same blocks)."""
    pairs = zip(
        values(record, label, "crps", name, k), values(other, other_label, "crps", name, k), strict=True
    )
    return interval([a - b for a, b in pairs])


def summarize(record: dict[str, Any]) -> dict[str, Any]:
    """Per ensemble, channel and day: spread/skill and CRPS with intervals, whether the ratio's mean is in the
    band, and per size the CRPS difference crps - gaussian paired by block."""
    out: dict[str, Any] = {}
    step_days = record["lead_hours"][1] / 24
    for label in record["ensembles"]:
        for name in record["channels"]:
            for days in sorted({step_days, *record["days"]}):
                k = lead_index(record, days)
                if k is None:
                    continue
                ratio = interval(values(record, label, "spread_skill", name, k))
                row = {"spread_skill": ratio, "in_band": BAND[0] <= ratio["mean"] <= BAND[1],
                       "crps": interval(values(record, label, "crps", name, k))}  # fmt: skip
                if label.startswith("crps "):
                    other = f"gaussian {label.split()[1]}"
                    row["crps_minus_gaussian"] = paired_crps(record, label, record, other, name, k)
                out.setdefault(label, {}).setdefault(name, {})[str(days)] = row
    return out


def markdown(record: dict[str, Any]) -> str:
    table = summarize(record)
    # the first model step too: the lead a one-step CRPS model was trained on
    step_days = record["lead_hours"][1] / 24
    shown = sorted({step_days, *record["days"]})
    channels, days = record["channels"], [d for d in shown if lead_index(record, d) is not None]
    head = (
        "| ensemble | "
        + " | ".join(f"{n} {lead_text(d * 24)}" for n in channels for d in days if d <= 5)
        + " |"
    )
    lines = [
        f"# CRPS-trained ensembles against gaussian ones ({record['date'][:10]})",
        "",
        f"Command: `{record['command']}`",
        "",
        f"Device: cpu ({record['threads']} threads); torch {record['torch']}; dlscale {record['dlscale']}. Base "
        f"`{record['base']}`; CRPS model `{record['crps_run']}` (fine-tuned {record['finetune']['global_step']} "
        f"steps in {record['finetune']['train_seconds'] / 60:.1f} min, validation loss "
        f"{record['finetune']['val_loss']:.4f} on its zero-noise member{recipe_text(record)}); gaussian ensemble `--perturb "
        f"{record['perturb']}`. {len(record['blocks'])} blocks of {record['blocks'][0][2]} initial times "
        f"({record['blocks'][0][0]} .. {record['blocks'][-1][1]}), 95% Student-t intervals over the blocks.",
        "",
        f"## Spread/skill (band {BAND[0]} to {BAND[1]}; **bold**: the mean in the band)",
        "",
        head,
        "|---|" + "---|" * (head.count("|") - 2),
    ]
    for label in record["ensembles"]:
        cells = []
        for name in channels:
            for d in days:
                if d > 5:
                    continue
                row = table[label][name][str(d)]
                text = interval_text(row["spread_skill"], 2)
                cells.append(f"**{text}**" if row["in_band"] else text)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "## CRPS at 5 days: the CRPS model's minus the gaussian ensemble's, paired by block (below 0: "
              "better)", "", "| members | " + " | ".join(f"{n} ({record['units'][n]})" for n in channels) + " |",
              "|---|" + "---|" * len(channels)]  # fmt: skip
    for members in record["members"]:
        label = f"crps {members}"
        cells = [interval_text(table[label][name]["5"]["crps_minus_gaussian"]) if "5" in table[label][name]
                 else "-" for name in channels]  # fmt: skip
        lines.append(f"| {members} | " + " | ".join(cells) + " |")
    lines += split_lines(record.get("time_split") or [])
    if not record["cost"]:
        return "\n".join(lines) + "\n"
    lines += ["", "## Cost of a training step against the members (SYNTHETIC trials, no I/O)", "",
              "| members M | ms per training sample | vs M = 1 | activations, `dlscale plan` (GiB) |",
              "|---|---|---|---|"]  # fmt: skip
    base = None
    for row in record["cost"]:
        found = interval(row["ms_per_sample"])
        base = base or found["mean"]
        planned = row.get("planned_activations_gib")
        lines.append(f"| {row['members']} | {interval_text(found)} | {found['mean'] / base:.2f} | "
                     f"{'-' if planned is None else f'{planned:.3f}'} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def split_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The phase timing's table: milliseconds per training sample in each phase, and the loss's share."""
    if not rows:
        return []
    lines = ["", f"## Where a one-step CRPS training step's time goes (ms per training sample, median of "
             f"{rows[0]['repeats']} steps, batch {rows[0]['batch']})", "",
             "| members M | " + " | ".join(PHASES) + " | total | the loss's share (its forward) |",
             "|---|" + "---|" * (len(PHASES) + 2)]  # fmt: skip
    for row in rows:
        found = row["ms_per_sample"]
        total = sum(found.values())
        cells = " | ".join(f"{found[phase]:.2f}" for phase in PHASES)
        lines.append(f"| {row['members']} | {cells} | {total:.1f} | {100 * found['loss'] / total:.1f} % |")
    return lines


def plot(record: dict[str, Any], path: Path) -> None:
    """Spread/skill against lead per channel for every ensemble, the band shaded."""
    channels = record["channels"]
    figure, axes = channel_panels(channels, 4.6, 3.8)
    leads = [hours / 24 for hours in record["lead_hours"]]
    for axis, name in zip(axes, channels, strict=True):
        for label in record["ensembles"]:
            means = [
                interval(values(record, label, "spread_skill", name, k))["mean"] for k in range(1, len(leads))
            ]
            kind, size = label.split()
            style = "-" if size == str(record["members"][0]) else ":"  # the sizes of one kind nearly overlap
            axis.plot(leads[1:], means, label=label, color="C0" if kind == "crps" else "C1", linestyle=style)
        ratio_panel(axis, name)
    axes[0].legend(fontsize=8)
    figure.suptitle("CRPS-trained vs gaussian-perturbed ensembles: spread/skill (grey: the calibrated band)")
    figure.savefig(path, dpi=110)


def ratio_panel(axis: Any, name: str) -> None:
    """A channel's spread/skill panel: the calibrated band shaded, 1 drawn, its labels."""
    axis.axhspan(*BAND, color="0.85", zorder=0)
    axis.axhline(1.0, color="black", linewidth=0.8)
    axis.set_title(name)
    axis.set_xlabel("lead (days)")
    axis.set_ylabel("spread/skill")
    axis.grid(alpha=0.3)


def paired_lines(record: dict[str, Any], other: dict[str, Any]) -> list[str]:
    """Per CRPS ensemble size both records hold and per day: ``record``'s CRPS model minus ``other``'s, paired by
    block, with 95% intervals (the two records must have scored the same blocks)."""
    if record["blocks"] != other["blocks"] or record["lead_hours"] != other["lead_hours"]:
        raise SystemExit("--paired: the two records did not score the same blocks and leads")
    lines = []
    for members in sorted(set(record["members"]) & set(other["members"])):
        label = f"crps {members}"
        for days in record["days"]:
            k = lead_index(record, days)
            if k is None:
                continue
            cells = [
                f"{name} {interval_text(paired_crps(record, label, other, label, name, k))}"
                for name in record["channels"]
            ]
            lines.append(f"{members} members, {lead_text(days * 24)}: " + "; ".join(cells))
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.paired is not None:
        first, second = (json.loads(path.read_text()) for path in args.paired)
        print(
            f"CRPS of {first['crps_run']} minus {second['crps_run']}, paired by block ({first['split']} split):"
        )
        print("\n".join(paired_lines(first, second)))
        return 0
    return record_or_rewrite(args, measure, args.name, markdown, plot)


if __name__ == "__main__":
    raise SystemExit(main())
