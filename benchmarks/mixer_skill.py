"""Skill at equal cost: the ViT's three token mixers (``model.mixer``: attention, afno, sfno) trained on the demo
data for the same wall-clock minutes, fine-tuned on their own rollouts for the same minutes again, then forecast
10 days ahead over the test split and scored against persistence and the data's WeatherBench2 climatology.

    OMP_NUM_THREADS=2 PYTHONPATH=src python benchmarks/mixer_skill.py [--pretrain-minutes 3]
        [--finetune-minutes 4] [--mixers attention afno sfno] [--runs-dir runs/mixer_skill] [--blocks 8]
        [--days 1 3 5 10] [--reuse] [--out DIR] [--from-json RECORD]

Equal minutes. Each model runs the same recipe (the ``demo`` config and its ``afno_demo``/``sfno_demo``
twins: embed 128, depth 4, patch 4, batch 16, AdamW at 2e-3 with a cosine schedule), and only the number of
optimizer steps differs: it is set so that each model's training takes the same seconds. A model's seconds per
step are measured first (calibration: one epoch of one-step training from scratch, then one epoch of the
fine-tuning curriculum from its weights, each timed by the run's own ``train_seconds``: the steps alone,
without validation or start-up), and a run trains the whole epochs nearest to budget / seconds per step
(``train.num_epochs``: dlscale trains whole epochs). The realized seconds of the real runs
are in the record beside the budget, so that any drift (another process on the machine) shows.

The phases, each a ``dlscale train`` process on its own:

1. one-step training from scratch for ``--pretrain-minutes``;
2. the multi-step curriculum of docs/after-training.md ("Multi-step fine-tuning, measured"): from the weights
   of 1 (``--resume_weights_only``), K = 2 for the first quarter of the steps, 4 for the second, 8 for the
   second half, at lr 3e-4 with 10 warm-up steps, for ``--finetune-minutes``.

Scoring reuses ``multistep_forecast_skill.py``: ``dlscale.forecast`` over ``--blocks`` contiguous blocks of
initial times of the test split, 95% Student-t intervals over the blocks, differences paired by block (the
attention model is the reference). The targets of issue 48 are checked on those: a new mixer whose 5-day RMSE
is below the climatology's on all four channels (paired by block: the interval of model minus climatology lies
below 0; the point estimate is given too), and the best 1-day RMSE of the new mixers no worse than the ViT's.

Results: ``benchmarks/results/<date>-cpu-mixer-skill.{json,md,png}``; ``--from-json RECORD`` writes the .md
and .png again from a record. ``--reuse`` scores runs already trained under ``--runs-dir`` (their training
numbers are read back from their summaries).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import multistep_forecast_skill as skill
from benchmark_text import command_line

REPO = Path(__file__).resolve().parents[1]
CONFIG_OF = {"attention": "demo", "afno": "afno_demo", "sfno": "sfno_demo"}
FINETUNE_SETTINGS = ("optim.lr=3e-4", "optim.warmup=10")
TITLE = "Skill at equal cost: the three mixers"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pretrain-minutes", type=float, default=3.0)
    parser.add_argument("--finetune-minutes", type=float, default=4.0)
    parser.add_argument("--mixers", nargs="+", default=list(CONFIG_OF), choices=list(CONFIG_OF))
    parser.add_argument("--runs-dir", type=Path, default=REPO / "runs" / "mixer_skill")
    parser.add_argument("--split", default="test")
    parser.add_argument("--lead", default="10d")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--channels", nargs="+", default=["z500", "t850", "t2m", "u10"])
    parser.add_argument("--days", type=float, nargs="+", default=[1, 3, 5, 10])
    parser.add_argument("--reuse", action="store_true", help="score the runs already under --runs-dir")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    parser.add_argument("--from-json", type=Path, help="write the Markdown and PNG of this record again")
    args = parser.parse_args(argv)
    if args.mixers[0] != "attention" and args.from_json is None:
        parser.error("the first mixer is the reference of the paired differences: put attention first")
    return args


def curriculum(steps: int) -> str:
    """The docs' 2-4-8 curriculum (0=2, 100=4, 200=8 of 400 steps) scaled to ``steps``."""
    return f"step 0=2, {max(1, steps // 4)}=4, {max(2, steps // 2)}=8"


def run_dir(args: argparse.Namespace, mixer: str, tag: str) -> Path:
    return args.runs_dir / CONFIG_OF[mixer] / tag


def train(
    args: argparse.Namespace, mixer: str, tag: str, settings: list[str], resume: Path | None = None
) -> dict:
    """One ``dlscale train`` process; returns its summary.json (its ``train_seconds`` are the steps alone)."""
    command = [sys.executable, "-m", "dlscale", "train", "--config", CONFIG_OF[mixer], "--run_num", tag,
               "--expdir", str(args.runs_dir), "--progress", "lines"]  # fmt: skip
    if resume is not None:
        command += ["--resume", str(resume), "--resume_weights_only"]
    for setting in settings:
        command += ["--set", setting]
    directory = run_dir(args, mixer, tag)
    print(f"[{time.strftime('%H:%M:%S')}] {mixer} {tag}: {' '.join(command[2:])}", flush=True)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{mixer} {tag} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    summary = json.loads((directory / "summary.json").read_text())
    summary["process_seconds"] = time.perf_counter() - started
    summary["run_dir"] = shown(directory)
    print(f"    {summary['global_step']} steps, {summary['train_seconds']:.1f} s training, "
          f"{summary['process_seconds']:.1f} s process, val loss {summary['final']['val_loss']:.4f}", flush=True)  # fmt: skip
    return summary


def shown(path: Path) -> str:
    """``path`` relative to the repository when it lies in it (the record names runs as the docs do)."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def latest_checkpoint(args: argparse.Namespace, mixer: str, tag: str) -> Path:
    return run_dir(args, mixer, tag) / "checkpoints" / "ckpt_latest.pt"


def phase_numbers(summary: dict, budget_seconds: float | None = None) -> dict[str, Any]:
    out = {
        "run": summary["run_dir"],
        "steps": summary["global_step"],
        "train_seconds": summary["train_seconds"],
        "seconds_per_step": summary["train_seconds"] / max(summary["global_step"], 1),
        "val_loss": summary["final"]["val_loss"],
    }
    if budget_seconds is not None:
        out["budget_seconds"] = budget_seconds
    return out


def epochs_for(budget_seconds: float, calibration: dict[str, Any]) -> int:
    """Whole epochs nearest to ``budget_seconds`` at the calibration's seconds per step (one epoch at least)."""
    return max(1, round(budget_seconds / (calibration["seconds_per_step"] * calibration["steps"])))


def train_all(args: argparse.Namespace) -> dict[str, Any]:
    """Calibrate, then train and fine-tune every mixer for the same seconds; the numbers of each phase."""
    pretrain_budget = args.pretrain_minutes * 60
    finetune_budget = args.finetune_minutes * 60
    out: dict[str, Any] = {}
    for mixer in args.mixers:
        numbers: dict[str, Any] = {"config": CONFIG_OF[mixer]}
        if args.reuse:
            for phase, tag in (("pretrain", "pretrain"), ("finetune", "finetune")):
                summary = json.loads((run_dir(args, mixer, tag) / "summary.json").read_text())
                numbers[phase] = phase_numbers({**summary, "run_dir": shown(run_dir(args, mixer, tag))})
            out[mixer] = numbers
            continue
        # calibration: one epoch from scratch, then one epoch of the curriculum from its weights; an epoch's
        # steps are the calibration's steps (runs train whole epochs, so the budget is rounded to the nearest)
        cal = train(args, mixer, "calibrate", ["train.num_epochs=1"])
        numbers["calibration_pretrain"] = phase_numbers(cal)
        cal_ft = train(
            args, mixer, "calibrate-ft",
            ["train.num_epochs=1", f"train.rollout_schedule={curriculum(cal['global_step'])}", *FINETUNE_SETTINGS],
            resume=latest_checkpoint(args, mixer, "calibrate"),
        )  # fmt: skip
        numbers["calibration_finetune"] = phase_numbers(cal_ft)
        pre_epochs = epochs_for(pretrain_budget, numbers["calibration_pretrain"])
        ft_epochs = epochs_for(finetune_budget, numbers["calibration_finetune"])
        ft_steps = ft_epochs * numbers["calibration_finetune"]["steps"]
        pre = train(args, mixer, "pretrain", [f"train.num_epochs={pre_epochs}"])
        numbers["pretrain"] = phase_numbers(pre, pretrain_budget)
        numbers["pretrain"]["epochs"] = pre_epochs
        ft = train(
            args, mixer, "finetune",
            [f"train.num_epochs={ft_epochs}", f"train.rollout_schedule={curriculum(ft_steps)}", *FINETUNE_SETTINGS],
            resume=latest_checkpoint(args, mixer, "pretrain"),
        )  # fmt: skip
        numbers["finetune"] = phase_numbers(ft, finetune_budget)
        numbers["finetune"]["epochs"] = ft_epochs
        numbers["finetune"]["curriculum"] = curriculum(ft_steps)
        out[mixer] = numbers
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import dlscale

    training = train_all(args)
    scoring = argparse.Namespace(
        run=[f"{mixer}={shown(run_dir(args, mixer, 'finetune'))}" for mixer in args.mixers], split=args.split,
        lead=args.lead, blocks=args.blocks, channels=args.channels, days=args.days,
    )  # fmt: skip
    record = skill.measure(scoring)
    record.update(
        benchmark="mixer_skill",
        title=TITLE,
        command=command_line("benchmarks/mixer_skill.py", sys.argv[1:]),
        threads=os.environ.get("OMP_NUM_THREADS", "default"),
        dlscale=dlscale.__version__,
        pretrain_minutes=args.pretrain_minutes,
        finetune_minutes=args.finetune_minutes,
        training=training,
    )
    return record


def paired(run: dict[str, Any], other: list[dict[str, Any]], forecaster: str, name: str, k: int) -> dict:
    """Mean and interval over blocks of this run's model RMSE minus ``forecaster``'s in ``other`` blocks."""
    return skill.interval(
        [a["model"]["rmse"][name][k] - b[forecaster]["rmse"][name][k]
         for a, b in zip(run["blocks"], other, strict=True)]
    )  # fmt: skip


def targets(record: dict[str, Any]) -> dict[str, Any]:
    """Issue 48's two targets on the record: 5-day RMSE below the climatology's on every channel (per new
    mixer), and the best 1-day RMSE of the new mixers against the ViT's (paired by block)."""
    runs = record["runs"]
    reference = record["reference"]
    five, one = skill.lead_index(record, 5), skill.lead_index(record, 1)
    out: dict[str, Any] = {"five_days": {}, "one_day": {}}
    for label, run in runs.items():
        rows = {}
        for name in record["channels"]:
            found = paired(run, run["blocks"], "climatology", name, five)
            rows[name] = {**found, "point_below": found["mean"] < 0, "interval_below": found["high"] < 0}
        out["five_days"][label] = {
            "channels": rows,
            "beats_on_all_point": all(row["point_below"] for row in rows.values()),
            "beats_on_all_interval": all(row["interval_below"] for row in rows.values()),
        }
    for name in record["channels"]:
        new = {
            label: skill.rmse_interval([b["model"]["rmse"][name][one] for b in run["blocks"]])["mean"]
            for label, run in runs.items()
            if label != reference
        }
        if not new:
            continue
        best = min(new, key=new.get)
        found = paired(runs[best], runs[reference]["blocks"], "model", name, one)
        out["one_day"][name] = {"best": best, **found, "no_worse_point": found["mean"] <= 0,
                                "worse_interval": found["low"] > 0}  # fmt: skip
    return out


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.2f}"


def markdown(record: dict[str, Any]) -> str:
    found = targets(record)
    lines = [
        f"# {TITLE} ({record['date'][:10]})",
        "",
        f"Command: `{record['command']}`",
        "",
        f"Device: {record['device']} ({record.get('threads', '?')} threads); torch {record['torch']}; dlscale "
        f"{record['dlscale']}. Budget per model: {record['pretrain_minutes']:g} min of one-step training, then "
        f"{record['finetune_minutes']:g} min of the 2-4-8 rollout curriculum (steps from a calibration, see the "
        "script's docstring).",
        "",
        "## Training at equal cost",
        "",
        "| mixer | calibrated s/step (1-step / curriculum) | steps (1-step / curriculum) | realized minutes "
        "(1-step / curriculum) | val loss after (1-step / curriculum) |",
        "|---|---|---|---|---|",
    ]
    for mixer, numbers in record["training"].items():
        cal = (numbers.get("calibration_pretrain"), numbers.get("calibration_finetune"))
        cal_text = " / ".join(f"{c['seconds_per_step']:.3f}" for c in cal) if all(cal) else "(reused)"
        pre, ft = numbers["pretrain"], numbers["finetune"]
        lines.append(
            f"| {mixer} | {cal_text} | {pre['steps']} / {ft['steps']} | {minutes(pre['train_seconds'])} / "
            f"{minutes(ft['train_seconds'])} | {pre['val_loss']:.4f} / {ft['val_loss']:.4f} |"
        )
    lines += [
        "",
        "The validation loss is the one-step relative L2 loss on the validation split (the curriculum's runs "
        "validate one step too, so the two columns compare).",
        "",
        "## The targets",
        "",
        "5-day RMSE minus the climatology's, paired by block (below 0: the model beats the climatology):",
        "",
        "| mixer | " + " | ".join(record["channels"]) + " | beats it on all four |",
        "|---|" + "---|" * (len(record["channels"]) + 1),
    ]
    for label, row in found["five_days"].items():
        cells = [skill.interval_text(row["channels"][name]) for name in record["channels"]]
        verdict = "yes" if row["beats_on_all_interval"] else ("point estimate only" if row["beats_on_all_point"]
                                                              else "no")  # fmt: skip
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {verdict} |")
    lines += [
        "",
        f"1-day RMSE of the best new mixer minus the ViT's ({record['reference']}), paired by block (at or below "
        "0: no worse):",
        "",
        "| channel | best new mixer | difference | no worse |",
        "|---|---|---|---|",
    ]
    for name, row in found["one_day"].items():
        verdict = "yes" if row["no_worse_point"] else ("worse" if row["worse_interval"] else "within noise")
        lines.append(f"| {name} | {row['best']} | {skill.interval_text(row)} | {verdict} |")
    five = skill.lead_index(record, 5)
    lines += [
        "",
        "What limits the 5-day target: the ACC at 5 days, paired with the RMSE against the climatology's. A "
        "forecast with the truth's variance and anomaly correlation ACC has a mean squared error of 2 (1 - ACC) "
        "times the climatology's, so it beats the climatology only where its ACC is above 0.5 (a damped forecast "
        "needs a little less, one with more variance than the truth more):",
        "",
        "| mixer | " + " | ".join(f"{name} ACC" for name in record["channels"]) + " |",
        "|---|" + "---|" * len(record["channels"]),
    ]
    for label, run in record["runs"].items():
        cells = []
        for name in record["channels"]:
            values = [block["model"]["acc"][name][five] for block in run["blocks"]]
            cells.append(skill.interval_text(skill.interval(values), 2) if None not in values else "-")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", skill.markdown(record).split("\n", 4)[-1]]
    return "\n".join(lines)


def plot(record: dict[str, Any], path: Path) -> None:
    skill.plot(record, path)


def main(argv: list[str] | None = None) -> int:
    return skill.record_or_rewrite(parse_args(argv), measure, "mixer-skill", markdown, plot)


if __name__ == "__main__":
    raise SystemExit(main())
