"""The throughput picture shared by a bench run, a sweep and the ladder: IO, SYNTHETIC and FULL side by side."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from matplotlib.figure import Figure

from dlscale.perf.bench.intervals import mean_interval
from dlscale.perf.bench.report import TEST_NAMES, TrialSeries


def throughput_figure(
    labels: Sequence[str],
    results: Sequence[Mapping[str, tuple[float, float]]],
    title: str,
    xlabel: str = "",
    error_label: str = "95% CI",
) -> Figure:
    """IO, SYNTHETIC and FULL mean global samples/s per label, one panel per test, each on its own linear axis
    from zero (IO often runs 100x faster than the step: on one axis, or a log one, the others could not be read).

    ``results[i]`` maps a test name to (mean, error) for ``labels[i]``; the error bar is ``error_label`` (the 95%
    interval's half-width for bench and sweep, the trials' std for older records). Missing tests are left out.
    """
    names = [name for name in TEST_NAMES if any(name in r for r in results)]
    panels = max(1, len(names))
    width = max(3.2, 0.9 * len(labels) + 1.6)
    # Few labels: the tests side by side; many (a ladder, a long sweep): one above the other, or they get too wide.
    if len(labels) <= 4:
        figure = Figure(figsize=(width * panels, 3.9), layout="constrained")
        axes = figure.subplots(1, panels, squeeze=False)[0]
    else:
        figure = Figure(figsize=(width, 2.7 * panels + 0.6), layout="constrained")
        axes = figure.subplots(panels, 1, squeeze=False)[:, 0]
    for axis, name in zip(axes, names, strict=False):
        positions = [i for i, r in enumerate(results) if name in r]
        means = [results[i][name][0] for i in positions]
        errors = [results[i][name][1] for i in positions]
        axis.bar(positions, means, 0.6, yerr=errors, capsize=3, color=_COLOURS[name])
        for x, mean, error in zip(positions, means, errors, strict=True):
            # above the error bar's cap, which the number would otherwise sit on
            text = f"{mean:,.0f}" if mean >= 100 else f"{mean:.3g}"
            axis.annotate(
                text, (x, mean + error), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=7
            )
        axis.set_xticks(range(len(labels)), labels, fontsize=8)
        axis.set_ylim(bottom=0)
        axis.margins(y=0.15)
        axis.set_title(name, fontsize=9)
        axis.set_xlabel(xlabel)
        axis.set_ylabel(f"global samples/s (error bar: {error_label})", fontsize=8)
        axis.grid(axis="y", alpha=0.3)
    figure.suptitle(title, fontsize=10)
    return figure


def plotted_interval(series: TrialSeries) -> tuple[float, float]:
    """(mean, half-width of the 95% interval; 0 when one trial gives none) of a test, for the error bars."""
    interval = mean_interval(series.trial_throughput)
    return interval.mean, interval.half_width if math.isfinite(interval.half_width) else 0.0


_COLOURS = {"IO": "tab:green", "SYNTHETIC": "tab:orange", "FULL": "tab:blue"}
