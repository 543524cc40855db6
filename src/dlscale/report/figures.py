"""Figures a person would rather look at than read: prediction vs target, and loss curves.

Built with ``matplotlib.figure.Figure`` (no pyplot), so they work in any thread and without a display.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from dlscale.training.evaluate import ExampleImage


def prediction_figure(example: ExampleImage, title: str = "") -> Figure:
    """Target, prediction, their difference and (if any) the baseline's difference, for one channel."""
    panels: list[tuple[str, np.ndarray, str]] = [
        ("target", example.target, "viridis"),
        ("prediction", example.prediction, "viridis"),
        ("prediction - target", example.prediction - example.target, "RdBu_r"),
    ]
    if example.baseline is not None:
        panels.append((f"{example.baseline_name} - target", example.baseline - example.target, "RdBu_r"))
    figure = Figure(figsize=(4.2 * len(panels), 3.2), layout="constrained")
    low, high = float(np.min(example.target)), float(np.max(example.target))
    error_limit = max(float(np.max(np.abs(panel))) for name, panel, _ in panels[2:]) or 1.0
    for index, (name, image, cmap) in enumerate(panels):
        axis = figure.add_subplot(1, len(panels), index + 1)
        limits = (low, high) if index < 2 else (-error_limit, error_limit)
        shown = axis.imshow(image, cmap=cmap, vmin=limits[0], vmax=limits[1], aspect="auto")
        axis.set_title(f"{example.channel}: {name}", fontsize=9)
        axis.set_xticks([])
        axis.set_yticks([])
        figure.colorbar(shown, ax=axis, shrink=0.8)
    if title:
        figure.suptitle(title, fontsize=10)
    return figure


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
    when the losses span more than a decade.
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
    metric_axis = figure.add_subplot(1, 2, 2)
    if history:
        name = history[-1]["headline"]
        metric_axis.plot(steps, [row["headline_value"] for row in history], "s-", color="C2", label=name)
        if history[-1].get("baseline_headline") is not None:
            metric_axis.axhline(history[-1]["baseline_headline"], color="gray", ls="--", label=baseline)
        metric_axis.set_ylabel(name)
        metric_axis.legend(fontsize=8)
    metric_axis.set_xlabel("optimizer step")
    if title:
        figure.suptitle(title, fontsize=10)
    return figure


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
