"""The throughput picture shared by a bench run, a sweep and the ladder: IO, SYNTHETIC and FULL side by side."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.figure import Figure

from dlscale.perf.bench_report import TEST_NAMES


def throughput_figure(
    labels: Sequence[str], results: Sequence[Mapping[str, tuple[float, float]]], title: str, xlabel: str = ""
) -> Figure:
    """Grouped bars of mean global samples/s (error bar: the trials' std) per label and test.

    ``results[i]`` maps a test name (IO, SYNTHETIC, FULL) to (mean, std) for ``labels[i]``; missing tests are
    left out.
    """
    figure = Figure(figsize=(max(5.0, 1.3 * len(labels) + 2), 3.8), layout="constrained")
    axis = figure.add_subplot(1, 1, 1)
    width = 0.8 / len(TEST_NAMES)
    for offset, name in enumerate(TEST_NAMES):
        positions = [
            i + (offset - (len(TEST_NAMES) - 1) / 2) * width for i, r in enumerate(results) if name in r
        ]
        values = [r[name] for r in results if name in r]
        if positions:
            axis.bar(
                positions, [m for m, _ in values], width, yerr=[s for _, s in values], capsize=3, label=name
            )
    axis.set_xticks(range(len(labels)), labels, fontsize=8)
    heights = [mean for r in results for mean, _ in r.values() if mean > 0]
    if heights and max(heights) > 20 * min(heights):
        axis.set_yscale("log")  # e.g. IO 50x above SYNTHETIC: on a linear axis the other bars would vanish
    axis.set_xlabel(xlabel)
    axis.set_ylabel("global samples/s")
    axis.set_title(title, fontsize=10)
    axis.legend(fontsize=8)
    return figure


def save_figure(figure: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return path
