"""What ``dlscale evaluate`` reports: the metrics document, its CSV, the figures, and the console lines.

The directory ``eval/<split>-<checkpoint>/`` holds ``metrics.json`` (strict JSON: NaN is ``null``),
``metrics.csv`` and the figures a run draws of its validation (prediction vs target, skill per channel,
per-class accuracy, confusion matrix), written together: a reader sees the previous evaluation or the whole
new one.

Units: ``metrics.json`` holds the metrics as the evaluator computed them (the values the run's loggers and
``summary.json`` have: ERA5's RMSEs of normalized fields), and under ``units`` each metric's unit and the scale
to it where the evaluator knows them; ``metrics.csv`` gives those metrics in their unit (``value * scale``),
named in its ``unit`` column ("normalized" where that is all that is known; empty for a loss, an accuracy or a
skill score, which are fractions or the workload's own). Skill scores are fractions (1 perfect, 0 the
baseline's error), as the log lines give them.
"""

from __future__ import annotations

import csv
import io
import logging
from pathlib import Path
from typing import Any

from dlscale.report.figures import save_png, validation_figures
from dlscale.report.summary import final_line, report_skill
from dlscale.runtime.output_directory import write_results_directory
from dlscale.runtime.strict_json import to_json
from dlscale.scoring.evaluator import EvalSummary

log = logging.getLogger("dlscale.train")

METRICS_JSON = "metrics.json"
METRICS_CSV = "metrics.csv"
CSV_COLUMNS = ("metric", "value", "baseline", "unit")


def evaluation_document(validation: EvalSummary, identity: dict[str, Any]) -> dict[str, Any]:
    """``metrics.json``: ``identity`` (split, checkpoint, config...), then the metrics as ``summary.json``'s
    ``final`` names them (``loss`` for its ``val_loss``), each class's accuracy and confusion for a classifier."""
    document = {
        **identity,
        "samples": validation.samples,
        "seconds": validation.seconds,
        "loss": validation.loss,
        **validation.headline_numbers(),
        "metrics": dict(validation.scalars),
        "baseline_metrics": dict(validation.baseline_scalars),
        "lines": list(validation.lines),
    }
    # metric -> {"unit", "scale"}: the metric's value times scale is in unit
    document["units"] = {
        name: {"unit": unit, "scale": scale} for name, (unit, scale) in validation.units.items()
    }
    if validation.channel_skill is not None:
        document["channel_skill"] = validation.channel_skill.to_dict()
    counts = validation.class_counts
    if counts is not None:
        document["classes"] = {
            "names": counts.names(),
            "accuracy": [float(a) for a in counts.per_class_accuracy()],
            "confusion": counts.confusion.tolist(),  # row: true class, column: predicted class
        }
    return document


def metrics_csv(document: dict[str, Any]) -> str:
    """``metric,value,baseline,unit`` rows: the loss, every metric (with the baseline's where it has one) in
    its unit where the document's ``units`` give one, each channel's skill against the baseline and each
    class's accuracy."""
    baseline, units = document["baseline_metrics"], document.get("units", {})
    rows = [("loss", document["loss"], document["baseline_loss"], "")]
    for name, value in document["metrics"].items():
        stated = units.get(name, {"unit": "", "scale": 1.0})
        scale = stated["scale"]
        rows.append((name, _times(value, scale), _times(baseline.get(name), scale), stated["unit"]))
    skill = document.get("channel_skill")
    if skill is not None:
        rows += [(f"skill/{name}", entry["skill"], None, "") for name, entry in skill["channels"].items()]
    classes = document.get("classes")
    if classes is not None:
        rows += [
            (f"accuracy/{name}", accuracy, None, "")
            for name, accuracy in zip(classes["names"], classes["accuracy"], strict=True)
        ]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    writer.writerows((name, _cell(value), _cell(base), unit) for name, value, base, unit in rows)
    return out.getvalue()


def _times(value: float | None, scale: float) -> float | None:
    return None if value is None else value * scale


def _cell(value: Any) -> str:
    return "" if value is None else repr(float(value))


def write_evaluation(
    directory: Path, document: dict[str, Any], validation: EvalSummary, title: str
) -> list[Path]:
    """Write ``metrics.json``, ``metrics.csv`` and the figures into ``directory`` as one (replacing an earlier
    evaluation's); the paths written. A failed write leaves the earlier directory as it was."""
    split = document["split"]
    figures = validation_figures(validation, title, "validation" if split == "valid" else split)
    names = [f"{stem}.png" for stem in figures]
    document["files"] = [METRICS_JSON, METRICS_CSV, *names]

    def fill(tmp: Path) -> None:
        for stem, figure in figures.items():
            save_png(figure, tmp / f"{stem}.png")
        (tmp / METRICS_CSV).write_text(metrics_csv(document))
        (tmp / METRICS_JSON).write_text(to_json(document))  # each file is flushed before the directory moves

    # Where it goes is chosen by the run (or checkpoint) evaluated: the advice of a failed write names that.
    write_results_directory(
        directory, fill, "the evaluation", "RUN_DIR|CHECKPOINT (its eval/ is written there)"
    )
    return [directory / name for name in document["files"]]


def log_evaluation(document: dict[str, Any], validation: EvalSummary, written: list[Path]) -> None:
    """The lines the end of a run prints, for this evaluation: the workload's metric lines, the loss and
    headline next to the baseline's, the skill per channel; then where the files are."""
    for line in validation.lines:
        log.info("%s", line)
    what = f"{document['split']} split, {document['samples']} samples, {document['checkpoint_name']}"
    log.info("Evaluation (%s): %s", what, final_line({**document, "val_loss": document["loss"]}))
    if validation.channel_skill is not None:
        report_skill(validation.channel_skill)
    if written:
        log.info("Outputs of this evaluation:")
        log.info("  metrics:     %s, %s", written[0], written[1].name)
        for figure in written[2:]:
            log.info("  figure:      %s", figure)
