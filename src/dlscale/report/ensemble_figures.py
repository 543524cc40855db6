"""An ensemble forecast's figures, drawn from ``scores.json``'s ``ensemble`` entry alone
(:mod:`dlscale.report.ensemble_report` describes it), for the headline channels, a column each:

* ``ensemble.png``: the ensemble's CRPS beside the control's MAE (the CRPS of a one-member ensemble), the spread
  beside the ensemble mean's RMSE, and the spread/skill ratio, each against lead, scaled to the leads after 0
  where lead 0 (the perturbed initial states) lies far above them, its value written in the panel;
* ``rank_histograms.png``: where the truth falls among the members at 1, 3 and 5 days (flat when calibrated).

Built with ``matplotlib.figure.Figure`` (no pyplot), as :mod:`dlscale.report.forecast_figures`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from dlscale.report.forecast_figures import (
    PANEL_INCHES,
    float_array,
    forecaster_styles,
    origin_text,
    set_wrapped_title,
)
from dlscale.report.forecast_selection import lead_text
from dlscale.scoring.calibration import CALIBRATED_BAND
from dlscale.scoring.rollout import ENSEMBLE, MODEL

ENSEMBLE_FIGURE = "ensemble.png"
RANK_HISTOGRAM_FIGURE = "rank_histograms.png"
ROW_INCHES = 3.0  # one row of panels' height
TITLE_INCHES = 0.8
RANK_LABEL = "truth's rank among the members (0: below all)"


def ensemble_figures(document: dict[str, Any]) -> dict[str, Figure]:
    """File name -> figure: :data:`ENSEMBLE_FIGURE`, and :data:`RANK_HISTOGRAM_FIGURE` where the forecast
    reaches a histogram's lead; none for a document without an ensemble (a deterministic forecast)."""
    if document.get("ensemble") is None:
        return {}
    figures = {ENSEMBLE_FIGURE: ensemble_figure(document)}
    histograms = rank_histogram_figure(document)
    if histograms is not None:
        figures[RANK_HISTOGRAM_FIGURE] = histograms
    return figures


def ensemble_figure(document: dict[str, Any]) -> Figure:
    """Three rows per headline channel against lead (days, or hours below two days): the ensemble's CRPS and
    the control's MAE; the spread, times sqrt((M+1)/M), and the ensemble mean's RMSE, so that the two lines
    of a calibrated ensemble meet; the spread/skill ratio (the same correction) with the line at 1 and the
    band :data:`CALIBRATED_BAND` shaded."""
    entry = document["ensemble"]
    members = entry["members"]
    names = document["headline_channels"]
    width = max(PANEL_INCHES[0] * len(names), 6.0)
    figure = Figure(figsize=(width, 3 * ROW_INCHES + TITLE_INCHES), layout="constrained")
    axes = figure.subplots(3, len(names), squeeze=False, sharex=True)
    in_hours = document["lead_hours"][-1] < 48
    leads = np.asarray(document["lead_hours"]) / (1 if in_hours else 24)
    marker = "o" if len(leads) <= 13 else None
    styles = forecaster_styles(list(document["scores"]))
    ensemble_colour, control_colour = styles[ENSEMBLE][0], styles[MODEL][0]
    correction = math.sqrt((members + 1) / members)
    low, high = CALIBRATED_BAND

    drawn: dict[Any, list[tuple[str, np.ndarray]]] = {}  # axis -> its lines' (label, values)

    def plot(axis, values, colour: str, style: str, label: str) -> None:
        axis.plot(leads, values, style, color=colour, label=label, marker=marker, markersize=3)
        drawn.setdefault(axis, []).append((label, np.asarray(values, dtype=np.float64)))

    for column, name in enumerate(names):
        crps_axis, spread_axis, ratio_axis = axes[:, column]
        unit = document["units"].get(name, "")
        in_unit = f" [{unit}]" if unit else ""

        plot(crps_axis, float_array(entry["crps"][name]), ensemble_colour, "-", "ensemble CRPS")
        plot(crps_axis, float_array(entry["deterministic_crps"][name]), control_colour, "-", "control's MAE")
        crps_axis.set_title(name)
        crps_axis.set_ylabel(f"CRPS{in_unit}")

        rmse = float_array(document["scores"][ENSEMBLE]["rmse"][name])
        plot(spread_axis, rmse, ensemble_colour, "-", "ensemble mean's RMSE")
        spread = correction * float_array(entry["spread"][name])
        plot(spread_axis, spread, ensemble_colour, "--", f"spread x sqrt({members + 1}/{members})")
        spread_axis.set_ylabel(f"RMSE and spread{in_unit}")

        ratio_axis.axhspan(low, high, color="C2", alpha=0.12, linewidth=0, label=f"{low:g} to {high:g}")
        ratio_axis.axhline(1.0, color="black", linewidth=0.8, label="calibrated: 1")
        plot(ratio_axis, float_array(entry["spread_skill"][name]), ensemble_colour, "-", "spread/skill")
        ratio_axis.set_ylabel("spread/skill ratio")
        ratio_axis.set_xlabel(f"lead time [{'hours' if in_hours else 'days'}]")
        for axis in (crps_axis, spread_axis, ratio_axis):
            axis.grid(alpha=0.3)
            shown = (low, high) if axis is ratio_axis else ()  # the band stays in view
            scale_without_lead_0(axis, drawn[axis], shown)
    for row in range(3):
        axes[row, 0].legend(loc="best", fontsize="small")
    title = (
        f"{origin_text(document)}: ensemble of {members} members ({entry['perturbation']}); "
        "CRPS, spread and spread/skill (latitude-weighted) by lead time"
    )
    set_wrapped_title(figure, title, width)
    return figure


def scale_without_lead_0(
    axis: Any,
    lines: list[tuple[str, np.ndarray]],
    shown: Sequence[float] = (),
    margin: float = 0.06,
    squash: float = 0.5,
) -> None:
    """Scale ``axis`` to its lines' later leads (and the values of ``shown``) when a line's lead 0 lies more
    than ``squash`` times their range above them all, and name that lead-0 value in the panel: the perturbed
    initial states' spread (``gaussian:0.75`` on the demo: 13 K on t850, against 4 to 5 K after the first step)
    would otherwise squash the leads that matter into the bottom of the panel. Nothing changes otherwise."""
    later = np.concatenate([values[1:] for _, values in lines]) if lines else np.empty(0)
    later = np.concatenate([later[np.isfinite(later)], np.asarray(shown, dtype=np.float64)])
    first = [
        (label, float(values[0])) for label, values in lines if len(values) > 1 and np.isfinite(values[0])
    ]
    if later.size == 0 or not first:
        return
    bottom, top = float(later.min()), float(later.max())
    span = (top - bottom) or abs(top) or 1.0
    above = [(label, value) for label, value in first if value > top + squash * span]
    if not above:
        return
    bottom = min(bottom, *(value for _, value in first))
    axis.set_ylim(bottom - margin * span, top + margin * span)
    text = "; ".join(f"{label} {float(f'{value:.3g}'):g}" for label, value in above)  # 1410, not 1.41e+03
    axis.text(
        0.02,
        0.98,
        f"at lead 0, off the scale: {text}",
        transform=axis.transAxes,
        va="top",
        fontsize="x-small",
        wrap=True,
    )


def rank_histogram_figure(document: dict[str, Any]) -> Figure | None:
    """A row per histogram's lead (1, 3 and 5 days where the forecast reaches them), a column per headline
    channel: the share of the grid points and initial times at which the truth has each rank 0..M among the
    M members, with the flat line 1/(M+1) of a calibrated ensemble (a U: too little spread; a dome: too much;
    a slope: a bias). None when the forecast reaches none of those leads."""
    entry = document["ensemble"]
    histograms = entry["rank_histograms"]
    if not histograms:
        return None
    members = entry["members"]
    names = document["headline_channels"]
    width = max(PANEL_INCHES[0] * len(names), 6.0)
    height = len(histograms) * ROW_INCHES + TITLE_INCHES
    figure = Figure(figsize=(width, height), layout="constrained")
    axes = figure.subplots(len(histograms), len(names), squeeze=False, sharex=True, sharey=True)
    ranks = np.arange(members + 1)
    flat = 1.0 / (members + 1)
    colour = forecaster_styles(list(document["scores"]))[ENSEMBLE][0]
    for row, histogram in enumerate(histograms):
        for column, name in enumerate(names):
            axis = axes[row, column]
            axis.bar(ranks, _shares(histogram["counts"][name]), width=0.85, color=colour, linewidth=0)
            axis.axhline(flat, color="black", linewidth=0.9, linestyle="--", label=f"flat: 1/{members + 1}")
            axis.set_title(f"{name} at +{lead_text(histogram['lead_hours'])}", fontsize="medium")
            axis.xaxis.set_major_locator(MaxNLocator(nbins=8, steps=[1, 2, 4, 5, 10], integer=True))
            axis.grid(alpha=0.3, axis="y")
            if column == 0:
                axis.set_ylabel("share of points")
            if row == len(histograms) - 1:
                axis.set_xlabel(RANK_LABEL)
    axes[0, 0].set_xlim(-0.6, members + 0.6)
    # The flat line is named in the title: a legend would hide bars, wherever they rise.
    title = (
        f"{origin_text(document)}: rank histograms of the truth among the {members} members "
        f"(dashed: 1/{members + 1}, flat when calibrated; U: too little spread; a dome: too much spread; piled "
        "at one end: a bias)"
    )
    set_wrapped_title(figure, title, width)
    return figure


def _shares(counts: list[int | None]) -> np.ndarray:
    """Counts as shares of their total (NaN where a count is missing, all NaN without any)."""
    values = float_array(counts)
    total = np.nansum(values)
    return values / total if total > 0 else np.full_like(values, np.nan)
