"""What a tune leaves behind: the tuned YAML, a markdown table, a PNG of the climb and a JSON record.

The tuned YAML holds one config, ``<config>_tuned``, that ``extends`` the original (``FILE:NAME``, relative to the
tuned file) and sets only the keys that differ from it: the kept knobs, the run length and warm-up a new batch
size needs, and the command line's own ``--set``/flags, so that ``dlscale train --yaml_config tuned.yaml --config
<config>_tuned`` trains exactly what the tune measured. Its header comments say what changed and why.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from dlscale.config.yaml_source import dump_yaml
from dlscale.perf.bench.intervals import mean_interval
from dlscale.tuning.climb import TrialRecord, TuneResult


def changed_sections(original: Mapping[str, Any], tuned: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of ``tuned`` (a ``RunConfig.to_dict()``) whose values differ from ``original``'s, by section."""
    sections: dict[str, Any] = {}
    for section, values in tuned.items():
        if not isinstance(values, dict):
            if original.get(section) != values:
                sections[section] = values
            continue
        changed = {k: v for k, v in values.items() if original.get(section, {}).get(k) != v}
        if changed:
            sections[section] = changed
    return sections


def extends_reference(original_file: Path, config: str, tuned_file: Path) -> str:
    """``FILE:NAME`` for the tuned file's ``extends``: FILE relative to the tuned file's folder when it can be."""
    original = original_file.resolve()
    try:
        path = os.path.relpath(original, tuned_file.resolve().parent)
    except ValueError:  # another drive (Windows)
        path = str(original)
    # Both in the project being worked in (tuned/ beside configs/): a relative path, so the pair commits and moves
    # together. Otherwise (a shipped config, another tree) an absolute one, which survives moving the tuned file.
    here = Path.cwd().resolve()
    if not (original.is_relative_to(here) and tuned_file.resolve().is_relative_to(here)):
        path = str(original)
    return f"{path}:{config}"


def tuned_yaml(name: str, extends: str, sections: Mapping[str, Any], header: Sequence[str]) -> str:
    """The tuned file's text: header comments, then config ``name`` extending ``extends`` with ``sections``."""
    comments = "".join(f"# {line}\n" if line else "#\n" for line in header)
    return comments + dump_yaml({name: {"extends": extends, **sections}})


def _interval_text(trials: Sequence[float]) -> str:
    return mean_interval(trials).describe()


def yaml_header(
    result: TuneResult, command: str, device: str, date: str, tuned_name: str, out: Path
) -> list[str]:
    """The comment lines at the top of the tuned YAML."""
    start, final = result.path[0].measurement, result.path[-1].measurement
    lines = [
        f"Tuned by dlscale tune on {device}, {date}.",
        f"  {command}",
        f"Train it: dlscale train --yaml_config {out} --config {tuned_name}",
        f"FULL at the start: {_interval_text(start.full)}",
        f"FULL tuned:        {_interval_text(final.full)}",
    ]
    if result.speedup is not None:
        lines.append(f"Speed-up: {result.speedup.describe()}")
    lines.append(
        "Kept:" if len(result.path) > 1 else "Kept: nothing (the config as it is was the fastest found)"
    )
    for trial in result.trials:
        if trial.kept:
            lines.append(f"  {trial.candidate.label}: {trial.reason}")
    lines.append(f"Stopped: {result.stop_reason}. Every trial: the .md and .json beside this file.")
    return lines


def _decision_reason(trial: TrialRecord) -> str:
    reason = trial.reason
    if trial.numerics is not None and trial.decision == "kept":
        reason += f"; numerics: loss {trial.numerics.loss:.5g} within tolerance"
    return reason.replace("|", "/")


def tune_table(result: TuneResult) -> list[str]:
    """Markdown: the climb (one row per trial), then the changes kept."""
    lines = [
        "| # | change | verdict before | FULL samples/s (95% CI) | speed-up over current | decision | why |",
        "|---:|---|---|---:|---:|---|---|",
    ]
    start = result.path[0].measurement
    lines.append(f"| 0 | start | {start.verdict} | {_interval_cell(start.full)} | 1.00x | start | |")
    verdict_before = start.verdict
    for trial in result.trials:
        m = trial.measurement
        full = _interval_cell(m.full) if m is not None and m.full else "-"
        ratio = f"{trial.comparison.ratio:.2f}x" if trial.comparison is not None else "-"
        lines.append(
            f"| {trial.number} | `{trial.candidate.label}` | {verdict_before} | {full} | {ratio} | "
            f"{trial.decision} | {_decision_reason(trial)} |"
        )
        if trial.kept and m is not None:
            verdict_before = m.verdict
    return lines


def _interval_cell(trials: Sequence[float]) -> str:
    interval = mean_interval(trials)
    if not math.isfinite(interval.half_width):
        return f"{interval.mean:.1f}"
    return f"{interval.mean:.1f} ± {interval.half_width:.1f}"


def tune_figure(result: TuneResult, title: str) -> Figure:
    """FULL samples/s of every trial with its 95% interval: the kept ones joined as the climb, the verdict
    written above each rung, the rejected ones grey with their decision."""
    figure = Figure(figsize=(max(6.0, 0.75 * (len(result.trials) + 1) + 2.5), 4.6), layout="constrained")
    axis = figure.add_subplot(1, 1, 1)
    points = [(0, "start", result.path[0].measurement, "kept")]
    points += [(t.number, t.candidate.label, t.measurement, t.decision) for t in result.trials]
    climb_x, climb_y = [], []
    for x, _label, measurement, decision in points:
        if measurement is None or not measurement.full:  # not measured: say why at the foot of its column
            axis.annotate(
                decision.replace(" ", "\n", 1),
                (x, 0.02),
                xycoords=("data", "axes fraction"),
                ha="center",
                va="bottom",
                fontsize=7,
                color="0.4",
            )
            continue
        interval = mean_interval(measurement.full)
        half = interval.half_width if math.isfinite(interval.half_width) else 0.0
        kept = decision == "kept"
        axis.errorbar(
            [x],
            [interval.mean],
            yerr=[half],
            fmt="o" if kept else "x",
            capsize=4,
            color="tab:blue" if kept else "0.55",
            markersize=7 if kept else 6,
        )
        if kept:
            climb_x.append(x)
            climb_y.append(interval.mean)
            axis.annotate(
                measurement.verdict,
                (x, interval.mean + half),
                xytext=(0, 5),
                textcoords="offset points",
                ha="center",
                fontsize=7,
                color="tab:blue",
            )
        else:
            axis.annotate(
                decision,
                (x, interval.mean - half),
                xytext=(0, -11),
                textcoords="offset points",
                ha="center",
                fontsize=7,
                color="0.4",
            )
    axis.plot(climb_x, climb_y, "-", color="tab:blue", alpha=0.6, label="kept (the climb)")
    axis.plot([], [], "x", color="0.55", label="rejected")
    axis.set_xticks(
        [p[0] for p in points], [_wrap(p[1]) for p in points], fontsize=7, rotation=30, ha="right"
    )
    axis.set_ylim(bottom=0)
    axis.margins(y=0.15)
    axis.set_xlabel("trial (in the order tried)")
    axis.set_ylabel("FULL global samples/s (mean, 95% CI)")
    axis.set_title(title, fontsize=10)
    axis.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0.0, 0.12))
    start_mean = mean_interval(result.path[0].measurement.full).mean
    if start_mean > 0:  # the same axis read as speed-up over the start
        right = axis.secondary_yaxis(
            "right", functions=(lambda y: y / start_mean, lambda ratio: ratio * start_mean)
        )
        right.set_ylabel("speed-up over the start")
    axis.grid(axis="y", alpha=0.3)
    return figure


def _wrap(label: str) -> str:
    return label.replace(" ", "\n")


def tune_document(result: TuneResult, context: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON record: the context (config, device, command, date), every trial, the path and the result."""

    def trial_json(trial: TrialRecord) -> dict[str, Any]:
        return {
            "number": trial.number,
            "knob": trial.candidate.knob,
            "change": dict(trial.candidate.changes),
            "label": trial.candidate.label,
            "why": trial.candidate.why,
            "changes_numerics": trial.candidate.numerics,
            "decision": trial.decision,
            "reason": trial.reason,
            "lr_note": trial.lr_note,
            "measurement": trial.measurement.to_json() if trial.measurement else None,
            "speedup": trial.comparison.to_json() if trial.comparison else None,
            "numerics": trial.numerics.to_json() if trial.numerics else None,
        }

    return {
        **context,
        "options": {
            "budget_s": result.options.budget_s,
            "loss_tolerance": result.options.loss_tolerance,
            "min_gain": result.options.min_gain,
        },
        "start": {"settings": result.start, "measurement": result.path[0].measurement.to_json()},
        "start_numerics": result.start_check.to_json() if result.start_check else None,
        "path": [
            {"label": p.label, "full": _summary(p.measurement.full), "verdict": p.measurement.verdict}
            for p in result.path
        ],
        "trials": [trial_json(t) for t in result.trials],
        "changes": dict(result.changes),
        "speedup": result.speedup.to_json() if result.speedup else None,
        "stop_reason": result.stop_reason,
        "table": tune_table(result),
    }


def _summary(trials: Sequence[float]) -> dict[str, float]:
    interval = mean_interval(trials)
    return {"mean": interval.mean, "low": interval.low, "high": interval.high, "trials": interval.trials}
