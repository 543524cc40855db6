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


def loss_curve_figure(history: Sequence[dict[str, Any]], title: str = "") -> Figure:
    """Train and validation loss per epoch, the baseline's validation loss, and the headline metric."""
    figure = Figure(figsize=(10, 3.6), layout="constrained")
    steps = [row["global_step"] for row in history]
    loss_axis = figure.add_subplot(1, 2, 1)
    loss_axis.plot(steps, [row["train_loss"] for row in history], "o-", label="train loss")
    loss_axis.plot(steps, [row["val_loss"] for row in history], "s-", label="validation loss")
    baseline = (history[-1].get("baseline") or "baseline") if history else "baseline"
    if history and history[-1].get("baseline_loss") is not None:
        loss_axis.axhline(
            history[-1]["baseline_loss"], color="gray", ls="--", label=f"{baseline} (validation)"
        )
    loss_axis.set_xlabel("optimizer step")
    loss_axis.set_ylabel("loss")
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
