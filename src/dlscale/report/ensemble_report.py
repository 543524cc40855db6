"""What an ensemble forecast adds to ``scores.json``, ``scores.csv`` and the log.

``scores.json``'s ``ensemble`` entry (absent for a deterministic forecast)::

    "ensemble": {
      "members": 16,                        # M, the control (member 0) included
      "perturbation": "Gaussian initial-state noise of 0.05 standard deviations, correlated over 500 km",
      "perturbation_std": {channel: 95.3},  # gaussian: that noise in each channel's unit (absent for dropout)
      "crps": {channel: [per lead]},        # the ensemble's fair CRPS, channel units
      "deterministic_crps": {channel: [...]},  # the control's CRPS as a one-member ensemble: its MAE
      "spread": {channel: [...]},           # sqrt of the mean member variance (unbiased), channel units
      "spread_skill": {channel: [...]},     # sqrt((M+1)/M) spread / ensemble-mean RMSE: 1 when calibrated
      "spread_skill_uncorrected": {channel: [...]},  # spread / ensemble-mean RMSE (WeatherBench2's plot)
      "calibrated": {channel: [true, false, null, ...]},  # spread_skill within calibration_band (null: undefined)
      "calibration_band": [0.8, 1.25],
      "rank_histograms": [{"lead_hours": 24.0, "counts": {channel: [M + 1 counts]},  # at 1, 3, 5 days
                           "reliability": {channel: {"reliability_index": 0.12, "chi_square": ...,
                                                     "degrees_of_freedom": M, "slope": -0.3, "shape": "U"}}}, ...],
      "nonfinite_members": [3, 7],          # members that held NaN or infinite values (0: the control)
      "nonfinite_members_from_lead_hours": 12.0,  # the first lead where one did (null: none)
      "conventions": {...}
    }

The ensemble mean is a forecaster of ``scores`` (``ensemble``: its RMSE, bias and ACC, WeatherBench2's
ensemble-mean RMSE among them); the control is ``model``, the same forecast a deterministic ``dlscale forecast``
gives. ``scores.csv`` gets three columns more, ``crps``, ``spread`` and ``spread_skill``: the ensemble's on its
rows, the control's CRPS (its MAE) on the model's, empty elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dlscale.report.forecast_selection import lead_text, report_leads
from dlscale.scoring.calibration import CALIBRATED_BAND, in_band, rank_histogram_reliability
from dlscale.scoring.ensemble_scores import EnsembleScores
from dlscale.scoring.rollout import ENSEMBLE, MODEL, EnsembleRollout

RANK_HISTOGRAM_DAYS = (1, 3, 5)  # the leads whose rank histograms are kept (those the rollout reaches)
ENSEMBLE_COLUMNS = ("crps", "spread", "spread_skill")
ENSEMBLE_CONVENTIONS = {
    "members": "member 0 is the control (the unperturbed forecast, scored as 'model'); the ensemble's scores "
    "count every member, the control included",
    "crps": "the fair (unbiased) CRPS per grid point, E|X - y| - E|X - X'| / 2 with the M(M-1) denominator, "
    "latitude-weighted mean over the grid, then the mean over initial times (WeatherBench2's CRPS); a "
    "one-member ensemble's is its mean absolute error (deterministic_crps)",
    "spread": "the square root of the mean over initial times of the latitude-weighted grid mean of the members' "
    "unbiased variance (WeatherBench2's ensemble variance, root after the time mean)",
    "spread_skill": "sqrt((M + 1) / M) x spread / ensemble-mean RMSE: 1 for a calibrated ensemble of any size, "
    "below 1 under-dispersive; spread_skill_uncorrected drops the factor (WeatherBench2's figure)",
    "perturbation_std": "gaussian members: the initial-state noise's standard deviation in each channel's unit "
    "(SCALE x the channel's standard deviation over the training data), the mean over the grid",
    "rank_histograms": "counts of the truth's rank among the M members (0: below all) over every grid point and "
    "initial time, not weighted; ties broken at random: flat for a calibrated ensemble",
    "calibrated": "whether spread_skill lies within calibration_band (null where it is undefined, as at lead 0)",
    "reliability": "per rank histogram: reliability_index sum_i |p_i - 1/(M+1)| (0 flat), Pearson's chi_square "
    "of the counts with M degrees of freedom (no p-value: the counts are far from independent), slope of "
    "p_i (M+1) against rank i/M (above 0: the truth ranks high, the members too low), shape flat, U (too little "
    "spread), dome (too much) or sloped (a bias); dlscale.scoring.calibration",
}


def ensemble_entry(
    ensemble: EnsembleRollout | None,
    channel_names: Sequence[str],
    step_hours: float,
    steps: int,
) -> dict[str, Any] | None:
    """``scores.json``'s ``ensemble`` entry of an ensemble rollout; None without one."""
    if ensemble is None:
        return None
    scores = ensemble.members

    def per_channel(values: np.ndarray) -> dict[str, list[float]]:
        return {name: values[:, c].tolist() for c, name in enumerate(channel_names)}

    counts = scores.rank_histogram()
    nonfinite, first_lead = scores.nonfinite_members()
    histograms = [
        {
            "lead_hours": lead * step_hours,
            "counts": {name: counts[lead, c].tolist() for c, name in enumerate(channel_names)},
            "reliability": {
                name: rank_histogram_reliability(counts[lead, c].tolist())
                for c, name in enumerate(channel_names)
            },
        }
        for lead in report_leads(RANK_HISTOGRAM_DAYS, step_hours, steps)
    ]
    ratios = scores.spread_skill_ratio()
    return {
        "members": scores.n_members,
        "perturbation": ensemble.description,
        "crps": per_channel(scores.crps()),
        "deterministic_crps": per_channel(ensemble.control.crps()),
        "spread": per_channel(scores.spread()),
        "spread_skill": per_channel(ratios),
        "spread_skill_uncorrected": per_channel(_uncorrected_ratio(scores)),
        "calibrated": {name: in_band(ratios[:, c].tolist()) for c, name in enumerate(channel_names)},
        "calibration_band": list(CALIBRATED_BAND),
        "rank_histograms": histograms,
        "nonfinite_members": nonfinite,
        "nonfinite_members_from_lead_hours": None if first_lead is None else first_lead * step_hours,
        "conventions": ENSEMBLE_CONVENTIONS,
    }


def _uncorrected_ratio(scores: EnsembleScores) -> np.ndarray:
    """WeatherBench2's plain spread / ensemble-mean RMSE; NaN where the mean has no error (dropout members at
    lead 0 all start from the truth)."""
    skill = scores.ensemble_mean_rmse()
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(skill > 0, scores.spread() / skill, np.nan)


def ensemble_cells(document: dict[str, Any], forecaster: str, channel: str, lead: int) -> list[float | None]:
    """The CSV's ``crps``, ``spread`` and ``spread_skill`` of one row: the ensemble's on its rows, the control's
    CRPS on the model's, None elsewhere."""
    entry = document.get("ensemble")
    if entry is None:
        return []
    if forecaster == ENSEMBLE:
        return [entry[key][channel][lead] for key in ENSEMBLE_COLUMNS]
    if forecaster == MODEL:
        return [entry["deterministic_crps"][channel][lead], None, None]
    return [None, None, None]


def ensemble_lines(document: dict[str, Any]) -> list[str]:
    """The ensemble's table at the headline's leads: CRPS (the ensemble's and the control's MAE), spread and the
    spread/skill ratio per headline channel; no line for a deterministic forecast."""
    entry = document.get("ensemble")
    if entry is None or not document["headline"]:
        return []
    lead_hours = list(document["lead_hours"])
    width = max(8, *(len(row["channel"]) + 1 for row in document["headline"]))
    low, high = entry.get("calibration_band", CALIBRATED_BAND)
    lines = [
        f"{'channel':<{width}}{'lead':>5}  {'unit':<9}{'CRPS':>10}{'MAE ctrl':>10}{'spread':>10}{'spr/skill':>10}"
        f"  in [{low:g}, {high:g}]"
    ]
    for row in document["headline"]:
        name, lead = row["channel"], lead_hours.index(row["lead_hours"])
        unit = document["units"].get(name, "")
        values = (
            entry["crps"][name][lead],
            entry["deterministic_crps"][name][lead],
            entry["spread"][name][lead],
            entry["spread_skill"][name][lead],
        )
        cells = "".join(f"{_number(value):>10}" for value in values)
        calibrated = entry.get("calibrated", {}).get(name, [None] * (lead + 1))[lead]
        verdict = {True: "yes", False: "no", None: "-"}[calibrated]
        lines.append(f"{name:<{width}}{lead_text(row['lead_hours']):>5}  {unit:<9}{cells}  {verdict}")
    return lines


def rank_histogram_lines(document: dict[str, Any]) -> list[str]:
    """One line per headline channel: its rank histograms' shape and reliability index at each kept lead
    (``z500: 1d U 0.35, 3d U 0.21, 5d flat 0.07``); none for a deterministic forecast."""
    entry = document.get("ensemble")
    if entry is None or not entry.get("rank_histograms"):
        return []
    lines = [
        "Rank histograms (shape and reliability index, 0 when flat; U: too little spread, dome: too much):"
    ]
    for name in document.get("headline_channels", []):
        parts = []
        for histogram in entry["rank_histograms"]:
            found = histogram.get("reliability", {}).get(name)
            if found and found["shape"] is not None:
                parts.append(
                    f"{lead_text(histogram['lead_hours'])} {found['shape']} {found['reliability_index']:.2f}"
                )
        if parts:
            lines.append(f"  {name}: " + ", ".join(parts))
    return lines if len(lines) > 1 else []


def nonfinite_members_warning(document: dict[str, Any], shown: int = 10) -> str | None:
    """The console's warning when members of the ensemble held NaN or infinite values: which members, from which
    lead, whether the control (the model's own forecast) stayed finite, and what to try; None when none did."""
    entry = document.get("ensemble")
    if entry is None or not entry.get("nonfinite_members"):
        return None
    members = entry["nonfinite_members"]
    listed = ", ".join(str(member) for member in members[:shown])
    if len(members) > shown:
        listed += f" and {len(members) - shown} more"
    which = f"member {listed} holds" if len(members) == 1 else f"members {listed} hold"
    lead = lead_text(entry["nonfinite_members_from_lead_hours"])
    text = f"{which} NaN or infinite values from lead {lead} on (of {entry['members']} members)"
    if document.get("nonfinite_from_lead_hours") is None:
        gaussian = str(entry.get("perturbation", "")).startswith("Gaussian")
        remedy = (
            "try a smaller SCALE of --perturb gaussian:SCALE" if gaussian else "try --perturb gaussian:SCALE"
        )
        return (
            f"The ensemble's {text}, while the control (member 0, the model's own forecast) stays finite: the "
            "perturbed members leave the states the model can forecast (the model's own forecast does not fail), "
            f"and the ensemble's scores from there are NaN; {remedy}"
        )
    return f"The ensemble's {text}, the control (member 0, the model's own forecast) among them"


def perturbation_size_text(
    noise: np.ndarray, channel_names: Sequence[str], units: Sequence[str], shown: Sequence[str]
) -> str:
    """The ``shown`` channels' noise in their units, from ``noise`` (C, H, W), the standard deviation at each
    point (:func:`dlscale.scoring.perturbations.noise_in_units`): ``z500 1430 m^2/s^2, t850 13.2 K``, a range
    ``1.2 to 3.4 K`` for a channel whose size varies over the grid."""
    parts = []
    for name in shown:
        c = list(channel_names).index(name)
        low, high = float(np.min(noise[c])), float(np.max(noise[c]))
        size = _digits(low) if high - low <= 1e-3 * high else f"{_digits(low)} to {_digits(high)}"
        parts.append(f"{name} {size} {units[c]}".rstrip())
    return ", ".join(parts)


def _digits(value: float) -> str:
    """Three significant digits, written out where they can be (``1430``, ``13.2``, ``0.0123``), not ``1.43e+03``."""
    return f"{float(f'{value:.3g}'):g}"


def perturbation_std_entry(noise: np.ndarray, channel_names: Sequence[str]) -> dict[str, float]:
    """``scores.json``'s ``ensemble.perturbation_std``: each channel's noise in its unit, the mean over the grid
    of the standard deviation at each point (the same at every point for a channel normalized by one std)."""
    return {name: float(np.mean(noise[c])) for c, name in enumerate(channel_names)}


def _number(value: float | None) -> str:
    return "-" if value is None or not np.isfinite(value) else f"{value:.4g}"
