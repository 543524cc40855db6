"""Figures a person would rather look at than read: prediction vs target, the skill per channel against the
workload's baseline, a classifier's per-class accuracy and confusion matrix, and loss curves.

Built with ``matplotlib.figure.Figure`` (no pyplot), so they work in any thread and without a display.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter

from dlscale.scoring.evaluator import ChannelSkill, ClassCounts, EvalSummary, ExampleImage

MAX_CONFUSION_CLASSES = 20  # a bigger confusion matrix is a grey wall: only the per-class accuracy is drawn
LOWEST_SKILL_SHOWN = -1.0  # the skill axis stops here (a bar below it is cut, its value written)


def prediction_figure(example: ExampleImage, title: str = "") -> Figure:
    """Prediction and target on one colour scale, their difference on a diverging scale centred on 0, and (if
    any) the baseline's difference on the same one, for one channel.

    Values are in the example's unit (de-normalized) when it has one, else labelled "normalized value"; axes
    are degrees of longitude and latitude when the example has an extent, else pixels.
    """
    prediction, target = example.physical(example.prediction), example.physical(example.target)
    panels: list[tuple[str, np.ndarray]] = [
        ("prediction", prediction),
        ("target", target),
        ("prediction - target", prediction - target),
    ]
    if example.baseline is not None:
        panels.append((f"{example.baseline_name} - target", example.physical(example.baseline) - target))
    value_label = (
        f"{example.quantity or example.channel} [{example.unit}]" if example.unit else "normalized value"
    )
    error_label = f"difference [{example.unit}]" if example.unit else "difference (normalized)"
    low = float(min(np.nanmin(prediction), np.nanmin(target)))
    high = float(max(np.nanmax(prediction), np.nanmax(target)))
    error_limit = max(float(np.nanmax(np.abs(panel))) for _, panel in panels[2:]) or 1.0
    # A fixed layout: the constrained one measured every tick label and took two thirds of the drawing time.
    width = 4.2 * len(panels)
    figure = Figure(figsize=(width, 3.4))
    figure.subplots_adjust(left=0.75 / width, right=1 - 0.85 / width, bottom=0.16, top=0.84, wspace=0.34)
    for index, (name, image) in enumerate(panels):
        axis = figure.add_subplot(1, len(panels), index + 1)
        field = index < 2
        shown = axis.imshow(
            image,
            cmap="viridis" if field else "RdBu_r",
            norm=Normalize(low, high) if field else Normalize(-error_limit, error_limit),
            extent=example.extent,
            aspect="auto",
            interpolation="nearest",
        )
        axis.set_title(f"{example.channel}: {name}", fontsize=9)
        _label_axes(axis, example, first=index == 0)
        bar = figure.colorbar(shown, ax=axis, fraction=0.05, pad=0.03)
        bar.set_label(value_label if field else error_label, fontsize=8)
        bar.ax.tick_params(labelsize=7)
    if title:
        figure.suptitle(title, fontsize=10)
    return figure


def _label_axes(axis: Any, example: ExampleImage, first: bool) -> None:
    """Degrees east and north on an image with an extent, pixel numbers on one without; the y label and, for a
    crop, which part of the grid it is, on the first panel only."""
    axis.tick_params(labelsize=7)
    if example.extent is None:
        axis.set_xlabel("x (pixel)", fontsize=8)
        if first:
            axis.set_ylabel("y (pixel)", fontsize=8)
        return
    west, east, south, north = example.extent
    axis.xaxis.set_major_locator(FixedLocator(_degree_ticks(west, east)))
    axis.yaxis.set_major_locator(FixedLocator(_degree_ticks(south, north)))
    axis.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{_round(x):g}°E"))
    axis.yaxis.set_major_formatter(FuncFormatter(_latitude_text))
    region = f" ({example.region})" if example.region and first else ""
    axis.set_xlabel(f"longitude{region}", fontsize=8)
    if first:
        axis.set_ylabel("latitude", fontsize=8)


def _degree_ticks(low: float, high: float) -> list[float]:
    """Round-numbered degrees inside [low, high]: multiples of the largest usual step that gives >= 4 ticks."""
    low, high = min(low, high), max(low, high)
    for step in (60, 30, 20, 10, 5, 2, 1, 0.5, 0.25, 0.1):
        ticks = np.arange(np.ceil(low / step) * step, high + 1e-9, step)
        if len(ticks) >= 4:
            return [float(t) for t in ticks]
    return [low, high]


def _latitude_text(value: float, _position: Any) -> str:
    value = _round(value)
    return "0°" if value == 0 else f"{abs(value):g}°{'N' if value > 0 else 'S'}"


def _round(degrees: float) -> float:
    """Degrees without float noise, and without the sign of -0.0 ("-0°E")."""
    return round(float(degrees), 6) + 0.0


def class_accuracy_figure(counts: ClassCounts, title: str = "") -> Figure:
    """Each class's validation accuracy as a bar, sorted from worst to best, with the chance level (1 / classes)
    and the overall accuracy as lines."""
    accuracy = counts.per_class_accuracy()
    names = counts.names()
    order = sorted(range(len(names)), key=lambda c: (np.nan_to_num(accuracy[c], nan=-1.0), c))
    many = len(names) > 30
    font = 5 if many else 7
    width = max(6.0, min(0.12 * len(names) + 2, 14.0))
    # names upright while they fit under their bars, else turned; the bottom margin grows with the longest
    upright = _text_inches(names, font) < 0.9 * (width - 0.9) / len(names)
    label_room = 0.2 if upright else _text_inches(names, font)
    height = 3.2 + label_room
    figure = Figure(figsize=(width, height))
    figure.subplots_adjust(
        left=0.7 / width,
        right=1 - 0.2 / width,
        bottom=(0.4 + label_room) / height,
        top=1 - 0.65 / height,
    )
    axis = figure.add_subplot(1, 1, 1)
    heights = [0.0 if np.isnan(accuracy[c]) else 100 * accuracy[c] for c in order]
    axis.bar(range(len(order)), heights, color="C0", width=0.8)
    axis.axhline(100.0 / counts.num_classes, color="gray", ls="--", lw=1, label="chance (1 / classes)")
    total = counts.confusion.sum()
    if total:
        overall = 100.0 * np.trace(counts.confusion) / total
        axis.axhline(overall, color="C1", lw=1, label=f"overall {overall:.1f}%")
    axis.set_xticks(range(len(order)))
    axis.set_xticklabels([names[c] for c in order], rotation=0 if upright else 90, fontsize=font)
    axis.set_xlim(-0.6, len(order) - 0.4)
    axis.set_ylim(0, 100)
    axis.set_xlabel("class (sorted by accuracy)", fontsize=8)
    axis.set_ylabel("validation accuracy (%)", fontsize=8)
    axis.tick_params(axis="y", labelsize=8)
    # above the bars, which may reach any height
    axis.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2, frameon=False)
    if title:
        figure.suptitle(title, fontsize=10)
    return figure


def confusion_figure(counts: ClassCounts, title: str = "") -> Figure:
    """The confusion matrix as counts: rows the true class, columns the predicted one (each cell written)."""
    matrix = np.asarray(counts.confusion)
    names = counts.names()
    side = 0.42 * len(names)
    names_room = 0.45 + _text_inches(names, 7)  # the class names left of and under the matrix
    width, height = side + names_room + 1.2, side + names_room + 0.45  # + the colour bar; + the title
    figure = Figure(figsize=(width, height))
    figure.subplots_adjust(
        left=names_room / width, right=1 - 1.2 / width, bottom=names_room / height, top=1 - 0.45 / height
    )
    axis = figure.add_subplot(1, 1, 1)
    shown = axis.imshow(matrix, cmap="Blues", interpolation="nearest")
    ticks = range(len(names))
    axis.set_xticks(ticks, names, fontsize=7, rotation=90 if _text_inches(names, 7) > 0.35 else 0)
    axis.set_yticks(ticks, names, fontsize=7)
    axis.set_xlabel("predicted class", fontsize=8)
    axis.set_ylabel("true class", fontsize=8)
    threshold = matrix.max() / 2 if matrix.size else 0
    for (row, column), value in np.ndenumerate(matrix):
        if value:
            color = "white" if value > threshold else "black"
            axis.text(column, row, str(int(value)), ha="center", va="center", fontsize=6, color=color)
    # the colour bar in the right margin, as tall as the (square) matrix
    bar_axis = figure.add_axes((1 - 1.0 / width, names_room / height, 0.18 / width, side / height))
    bar = figure.colorbar(shown, cax=bar_axis)
    bar.set_label("validation samples", fontsize=8)
    bar.ax.tick_params(labelsize=7)
    axis.set_title(title or f"confusion matrix ({int(matrix.sum())} samples)", fontsize=9)
    return figure


def skill_figure(skill: ChannelSkill, title: str = "") -> Figure:
    """The skill score of every channel against the baseline, 1 - error / baseline's error, as a bar: a
    fraction, as the log lines and summary.json give it (1 perfect; above 0 the model beats the baseline, below
    it, in red, it does not); each bar's value is written on it."""
    scores = skill.skill()
    losing = set(skill.not_beating())
    names = list(skill.channels)
    many = len(names) > 24  # names written upright while they fit side by side
    width, height = max(6.0, min(0.42 * len(names) + 1.6, 14.0)), 4.0
    figure = Figure(figsize=(width, height))
    figure.subplots_adjust(
        left=0.75 / width,
        right=1 - 0.2 / width,
        bottom=(0.75 if many else 0.55) / height,
        top=1 - 0.85 / height,
    )
    axis = figure.add_subplot(1, 1, 1)
    finite = scores[np.isfinite(scores)]
    lowest = float(finite.min()) if finite.size else 0.0
    # room under the lowest bar for its value
    low = max(LOWEST_SKILL_SHOWN, min(-0.1, lowest - 0.1 * (1.0 - lowest)))
    heights = np.clip(np.nan_to_num(scores, nan=0.0), low, 1.0)
    colours = ["C3" if name in losing else "C0" for name in names]
    axis.bar(range(len(names)), heights, color=colours, width=0.75)
    axis.axhline(0.0, color="black", lw=0.8)
    for index, score in enumerate(scores):
        text = "n/a" if np.isnan(score) else f"{score:+.2f}"
        below, cut = heights[index] < 0, score < low
        # the value past the bar's end; a bar cut at the axis carries it inside, in white
        offset = (1 if cut else -1 if below else 1) * 0.015 * (1.0 - low)
        axis.text(
            index,
            heights[index] + offset,
            text,
            ha="center",
            va="bottom" if cut or not below else "top",
            fontsize=6,
            color="white" if cut else "C3" if names[index] in losing else "black",
        )
    axis.set_xticks(range(len(names)))
    axis.set_xticklabels(names, rotation=90 if many else 0, fontsize=7)
    axis.set_xlim(-0.6, len(names) - 0.4)
    axis.set_ylim(low, 1.0)
    axis.set_xlabel("output channel", fontsize=8)
    axis.set_ylabel(f"skill vs {skill.baseline_name}", fontsize=8)
    axis.tick_params(axis="y", labelsize=7)
    verdict = (
        f"{len(losing)} of {len(names)} channels {'does' if len(losing) == 1 else 'do'} not beat "
        f"{skill.baseline_name} (red)"
        if losing
        else f"every channel beats {skill.baseline_name}"
    )
    axis.set_title(
        f"skill = 1 - {skill.metric} / {skill.baseline_name}'s (1: perfect, 0: no better)\n{verdict}",
        fontsize=8,
    )
    if title:
        figure.suptitle(title, fontsize=10)
    return figure


def _text_inches(texts: Sequence[str], fontsize: float) -> float:
    """About how wide the longest of ``texts`` is in inches (a character is ~0.6 em of DejaVu Sans)."""
    return 0.6 * fontsize / 72 * max((len(text) for text in texts), default=0)


def validation_figures(
    validation: EvalSummary, title: str = "", samples: str = "validation"
) -> dict[str, Figure]:
    """Every figure of one validation, by file stem (``prediction_vs_target``, ``skill_vs_<baseline>``,
    ``class_accuracy``, ``confusion_matrix``): those the workload's evaluator asked for by what it put in its
    summary. ``title`` (e.g. "epoch 3") starts each figure's title; ``samples`` says whose samples they are
    ("first validation sample", "first test sample")."""
    lead = f"{title}, " if title else ""
    figures: dict[str, Figure] = {}
    if validation.example is not None:
        figures["prediction_vs_target"] = prediction_figure(
            validation.example, f"{lead}first {samples} sample"
        )
    if validation.channel_skill is not None:
        baseline = validation.channel_skill.baseline_name
        figures[f"skill_vs_{baseline.replace(' ', '_')}"] = skill_figure(
            validation.channel_skill, f"{lead}skill per channel against {baseline}"
        )
    counts = validation.class_counts
    if counts is not None:
        counted = f"{int(counts.confusion.sum())} {samples} samples"
        figures["class_accuracy"] = class_accuracy_figure(counts, f"{lead}per-class accuracy, {counted}")
        if counts.num_classes <= MAX_CONFUSION_CLASSES:
            figures["confusion_matrix"] = confusion_figure(counts, f"{lead}confusion matrix, {counted}")
    return figures


def loss_curve_figure(
    history: Sequence[dict[str, Any]],
    title: str = "",
    step_losses: tuple[Sequence[float], Sequence[float]] | None = None,
    loss_name: str | None = None,
) -> Figure:
    """The training loss of every optimizer step (light, with a smoothed line over it), the validation loss of
    every epoch, the baseline's validation loss, and the headline metric.

    ``step_losses``: (steps, losses) from ``<run>/metrics/steps.csv``; without them the training loss is the
    epochs' means. ``loss_name`` (e.g. "relative L2 error") labels the y-axis. The loss axis is logarithmic
    when the losses span more than a decade. The headline metric is in its physical unit where the rows'
    ``headline_unit`` gives it (ERA5's normalized RMSE times the channel's standard deviation, "[m/s]" on the
    axis), "(normalized)" where that is all it says, else as the evaluator computed it.
    """
    figure = Figure(figsize=(10, 3.6), layout="constrained")
    steps = [row["global_step"] for row in history]
    val_losses = [row["val_loss"] for row in history]
    loss_axis = figure.add_subplot(1, 2, 1)
    shown = list(val_losses)
    if step_losses is not None and len(step_losses[0]):
        x, y = np.asarray(step_losses[0], dtype=float), _finite_or_nan(step_losses[1])
        marker = "." if len(x) <= 200 else None  # a short run's steps stay visible under the smoothed line
        per_step = {"color": "C0", "lw": 0.8, "alpha": 0.4, "marker": marker, "markersize": 4}
        loss_axis.plot(x, y, "-", label="train loss (per step)", **per_step)
        if len(x) >= 5:
            loss_axis.plot(x, smoothed(y), "-", color="C0", lw=1.6, label="train loss (smoothed)")
        shown += list(y)
    else:
        train = [row["train_loss"] for row in history]
        loss_axis.plot(steps, train, "o-", color="C0", label="train loss")
        shown += train
    loss_axis.plot(steps, val_losses, "s-", color="C1", label="validation loss")
    baseline = (history[-1].get("baseline") or "baseline") if history else "baseline"
    if history and history[-1].get("baseline_loss") is not None:
        loss_axis.axhline(
            history[-1]["baseline_loss"], color="gray", ls="--", label=f"{baseline} (validation)"
        )
        shown.append(history[-1]["baseline_loss"])
    if spans_decades(shown):
        loss_axis.set_yscale("log")
    loss_axis.set_xlabel("optimizer step")
    loss_axis.set_ylabel(f"loss ({loss_name})" if loss_name else "loss")
    loss_axis.legend(fontsize=8)
    metric_axis = figure.add_subplot(1, 2, 2, sharex=loss_axis)  # the same steps side by side
    if history:
        name = history[-1]["headline"]
        unit, scale = headline_unit(history)
        values = [_scaled(row["headline_value"], scale) for row in history]
        metric_axis.plot(steps, values, "s-", color="C2", label=name)
        if history[-1].get("baseline_headline") is not None:
            metric_axis.axhline(
                history[-1]["baseline_headline"] * scale, color="gray", ls="--", label=baseline
            )
        shown_unit = "(normalized)" if unit == "normalized" else f"[{unit}]" if unit else ""
        metric_axis.set_ylabel(f"{name} {shown_unit}".rstrip())
        metric_axis.legend(fontsize=8)
    metric_axis.set_xlabel("optimizer step")
    if title:
        figure.suptitle(title, fontsize=10)
    return figure


def headline_unit(history: Sequence[dict[str, Any]]) -> tuple[str, float]:
    """(unit, scale) of the rows' headline metric (the latest row that states one; a run resumed from a
    checkpoint of an older dlscale has rows without it): ``("", 1.0)`` when none does."""
    for row in reversed(history):
        if row.get("headline_unit"):
            unit, scale = row["headline_unit"]
            return str(unit), float(scale)
    return "", 1.0


def _scaled(value: float | None, scale: float) -> float:
    return float("nan") if value is None else value * scale


def smoothed(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """A debiased exponential moving average (TensorBoard's smoothing) over about a tenth of the points (at most
    100); NaN points are skipped, and keep their NaN."""
    values = np.asarray(values, dtype=float)
    span = min(max(len(values) / 10, 1.0), 100.0)
    weight = 1.0 - 2.0 / (span + 1.0)
    out = np.full_like(values, np.nan)
    average, norm = 0.0, 0.0
    for index, value in enumerate(values):
        if np.isfinite(value):
            average = weight * average + (1 - weight) * value
            norm = weight * norm + (1 - weight)
            out[index] = average / norm
    return out


def spans_decades(values: Sequence[float | None]) -> bool:
    """Whether positive ``values`` span more than a factor of 10 (then a log axis shows them better); False
    when any is zero or negative."""
    finite = [v for v in values if v is not None and np.isfinite(v)]
    return bool(finite) and min(finite) > 0 and max(finite) / min(finite) > 10


def _finite_or_nan(values: Sequence[float]) -> np.ndarray:
    """Infinite values become NaN: a gap in the line (a log axis cannot show inf)."""
    array = np.asarray(values, dtype=float)
    return np.where(np.isfinite(array), array, np.nan)


def figure_to_rgb(figure: Figure) -> np.ndarray:
    """Render to an (H, W, 3) uint8 array (for TensorBoard images)."""
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def save_png(figure: Figure, path: Path) -> Path:
    """Write the figure as a PNG (creating the directory)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(figure)
    figure.savefig(path, dpi=110)
    return path
