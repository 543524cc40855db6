"""The ensemble's figures, drawn from a hand-made ``scores.json`` document: ``ensemble.png`` has three panels
per headline channel whose lines are the document's CRPS, control MAE, corrected spread, ensemble-mean RMSE
and spread/skill ratio; ``rank_histograms.png`` a panel per histogram's lead and channel whose bars are the
counts' shares, with the flat line 1/(M+1); a deterministic forecast's document gets neither, and the score
directory's figures include them only for an ensemble."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from dlscale.report.ensemble_figures import (
    ENSEMBLE_FIGURE,
    RANK_HISTOGRAM_FIGURE,
    ensemble_figure,
    ensemble_figures,
    rank_histogram_figure,
)
from dlscale.report.figures import save_png
from dlscale.report.scores_directory import score_figures
from dlscale.runtime.strict_json import to_json
from dlscale.scoring.calibration import CALIBRATED_BAND

CHANNELS = ("z500", "t2m")
UNITS = {"z500": "m^2/s^2", "t2m": "K"}


def hand_made_document(
    members: int = 4,
    lead_hours: Sequence[float] = (0.0, 12.0, 24.0, 36.0),
    channels: Sequence[str] = CHANNELS,
    histogram_leads: Sequence[float] = (24.0,),
) -> dict[str, Any]:
    """A forecast's document with an ensemble entry: every score a different number, growing with lead, so
    that a line drawn from the wrong score or channel differs; rank counts with a U shape."""
    rng = np.random.default_rng(3)

    def per_channel(scale: float) -> dict[str, list[float]]:
        return {
            name: (
                scale * (c + 1) * (1 + np.arange(len(lead_hours))) + rng.uniform(0, 0.1, len(lead_hours))
            ).tolist()
            for c, name in enumerate(channels)
        }

    spread, rmse = per_channel(0.8), per_channel(1.1)
    ratio = {
        name: (math.sqrt((members + 1) / members) * np.divide(spread[name], rmse[name])).tolist()
        for name in channels
    }
    histograms = [
        {
            "lead_hours": hours,
            "counts": {name: rng.integers(50, 500, members + 1).tolist() for name in channels},
        }
        for hours in histogram_leads
    ]
    return {
        "workload": "earth",
        "split": "test",
        "checkpoint_name": "ckpt_latest",
        "initial_time_count": 8,
        "lead_hours": list(lead_hours),
        "headline_channels": list(channels),
        "units": {name: UNITS.get(name, "K") for name in channels},
        "scores": {
            "model": {"rmse": per_channel(1.3), "bias": per_channel(0.1), "acc": None},
            "ensemble": {"rmse": rmse, "bias": per_channel(0.05), "acc": None},
            "persistence": {"rmse": per_channel(2.0), "bias": per_channel(0.2), "acc": None},
        },
        "ensemble": {
            "members": members,
            "perturbation": "Gaussian initial-state noise of 0.05 standard deviations, correlated over 500 km",
            "crps": per_channel(0.5),
            "deterministic_crps": per_channel(0.7),
            "spread": spread,
            "spread_skill": ratio,
            "spread_skill_uncorrected": {
                name: np.divide(spread[name], rmse[name]).tolist() for name in channels
            },
            "rank_histograms": histograms,
        },
    }


def line_labelled(axis, label: str):
    (line,) = [line for line in axis.get_lines() if line.get_label() == label]
    return line


def test_the_ensemble_figure_draws_the_documents_scores_in_three_rows_per_channel():
    document = hand_made_document(members=4)
    entry = document["ensemble"]
    figure = ensemble_figure(document)
    assert len(figure.axes) == 3 * len(CHANNELS)
    axes = np.asarray(figure.axes).reshape(3, len(CHANNELS))
    for column, name in enumerate(CHANNELS):
        crps_axis, spread_axis, ratio_axis = axes[:, column]
        assert crps_axis.get_title() == name
        assert UNITS[name] in crps_axis.get_ylabel() and UNITS[name] in spread_axis.get_ylabel()
        expected = {
            (crps_axis, "ensemble CRPS"): entry["crps"][name],
            (crps_axis, "control's MAE"): entry["deterministic_crps"][name],
            (spread_axis, "ensemble mean's RMSE"): document["scores"]["ensemble"]["rmse"][name],
            # times sqrt((M+1)/M): a calibrated ensemble's spread meets the RMSE
            (spread_axis, "spread x sqrt(5/4)"): np.sqrt(5 / 4) * np.asarray(entry["spread"][name]),
            (ratio_axis, "spread/skill"): entry["spread_skill"][name],
        }
        for (axis, label), values in expected.items():
            line = line_labelled(axis, label)
            np.testing.assert_allclose(line.get_xdata(), document["lead_hours"])  # below 2 days: hours
            np.testing.assert_allclose(line.get_ydata(), values)
        np.testing.assert_allclose(line_labelled(ratio_axis, "calibrated: 1").get_ydata(), [1.0, 1.0])
        assert "hours" in ratio_axis.get_xlabel()


def test_leads_of_two_days_or_more_are_drawn_in_days():
    document = hand_made_document(lead_hours=(0.0, 24.0, 48.0, 72.0))
    crps_axis = ensemble_figure(document).axes[0]
    np.testing.assert_allclose(line_labelled(crps_axis, "ensemble CRPS").get_xdata(), [0, 1, 2, 3])


def test_the_title_names_the_members_and_the_perturbation():
    document = hand_made_document(members=4)
    title = " ".join(ensemble_figure(document)._suptitle.get_text().split())
    assert "4 members" in title and "correlated over 500 km" in title


def test_the_rank_histograms_are_the_counts_shares_with_the_flat_line():
    members = 4
    document = hand_made_document(members=members, histogram_leads=(24.0, 72.0))
    histograms = document["ensemble"]["rank_histograms"]
    figure = rank_histogram_figure(document)
    assert len(figure.axes) == len(histograms) * len(CHANNELS)
    axes = np.asarray(figure.axes).reshape(len(histograms), len(CHANNELS))
    for row, histogram in enumerate(histograms):
        for column, name in enumerate(CHANNELS):
            axis = axes[row, column]
            counts = np.asarray(histogram["counts"][name], dtype=np.float64)
            bars = axis.patches
            assert len(bars) == members + 1
            np.testing.assert_allclose([bar.get_height() for bar in bars], counts / counts.sum())
            np.testing.assert_allclose(
                [bar.get_x() + bar.get_width() / 2 for bar in bars], range(members + 1)
            )
            flat = line_labelled(axis, f"flat: 1/{members + 1}")
            np.testing.assert_allclose(flat.get_ydata(), [1 / (members + 1)] * 2)
            assert name in axis.get_title()
    assert "1d" in axes[0, 0].get_title() and "3d" in axes[1, 0].get_title()
    assert "rank" in axes[-1, 0].get_xlabel()


def test_a_deterministic_forecast_gets_no_ensemble_figure():
    document = hand_made_document()
    del document["ensemble"]
    del document["scores"]["ensemble"]
    assert ensemble_figures(document) == {}


def test_a_forecast_short_of_a_day_gets_no_rank_histograms():
    document = hand_made_document(histogram_leads=())
    assert list(ensemble_figures(document)) == [ENSEMBLE_FIGURE]


def test_the_score_directory_draws_the_ensemble_figures_only_for_an_ensemble():
    ensemble = hand_made_document()
    assert {ENSEMBLE_FIGURE, RANK_HISTOGRAM_FIGURE} <= set(score_figures(ensemble))
    deterministic = hand_made_document()
    del deterministic["ensemble"]
    del deterministic["scores"]["ensemble"]
    assert not {ENSEMBLE_FIGURE, RANK_HISTOGRAM_FIGURE} & set(score_figures(deterministic))


def test_scores_that_are_nan_in_the_json_document_are_gaps_not_a_crash(tmp_path):
    document = hand_made_document()
    for key in ("crps", "spread", "spread_skill"):
        document["ensemble"][key]["z500"][0] = float("nan")
    document["scores"]["ensemble"]["rmse"]["t2m"][-1] = float("inf")
    read_back = json.loads(to_json(document))  # strict JSON: NaN is written as null
    assert read_back["ensemble"]["crps"]["z500"][0] is None
    figures = ensemble_figures(read_back)
    for name, figure in figures.items():
        assert isinstance(figure, Figure)
        save_png(figure, tmp_path / name)
        assert (tmp_path / name).stat().st_size > 0
    crps = line_labelled(figures[ENSEMBLE_FIGURE].axes[0], "ensemble CRPS").get_ydata()
    assert np.isnan(crps[0]) and np.isfinite(crps[1:]).all()


@pytest.mark.parametrize("members", [1, 50])
def test_few_or_many_members_draw(members):
    document = hand_made_document(members=members, histogram_leads=(24.0,))
    figures = ensemble_figures(document)
    for figure in figures.values():
        FigureCanvasAgg(figure).draw()
    assert len(figures[RANK_HISTOGRAM_FIGURE].axes[0].patches) == members + 1


def test_lead_0_far_above_the_later_leads_does_not_squash_them_and_is_named_in_the_panel():
    # Perturbed initial states: the spread and CRPS at lead 0 far above every later lead (13 K on t850 for
    # gaussian:0.75, against 3 to 5 K after it).
    document = hand_made_document(lead_hours=(0.0, 24.0, 48.0, 72.0))
    entry = document["ensemble"]
    entry["spread"]["t2m"][0] = 100.0
    entry["crps"]["t2m"][0] = 50.0
    axes = np.asarray(ensemble_figure(document).axes).reshape(3, len(CHANNELS))
    crps_axis, spread_axis, ratio_axis = axes[:, CHANNELS.index("t2m")]
    for axis, lead_0 in ((crps_axis, 50.0), (spread_axis, 100.0 * np.sqrt(5 / 4))):
        later = np.concatenate([line.get_ydata()[1:] for line in axis.get_lines()])
        bottom, top = axis.get_ylim()
        assert later.max() <= top < lead_0 and bottom <= later.min()  # the later leads fill the panel
        (note,) = [text.get_text() for text in axis.texts]
        assert "at lead 0" in note and f"{float(f'{lead_0:.3g}'):g}" in note
        assert any(line.get_ydata()[0] == pytest.approx(lead_0) for line in axis.get_lines())  # still drawn
    low, high = CALIBRATED_BAND  # 0.8 to 1.25
    assert ratio_axis.get_ylim()[0] <= low and ratio_axis.get_ylim()[1] >= high  # the band stays in view
    # z500's lead 0 is within its later leads: its panels are scaled as matplotlib scales them
    assert not axes[0, CHANNELS.index("z500")].texts


def test_the_rank_histograms_title_reads_a_dome_as_too_much_spread():
    title = " ".join(rank_histogram_figure(hand_made_document())._suptitle.get_text().split())
    assert "U: too little spread" in title and "a dome: too much spread" in title
