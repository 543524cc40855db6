"""Calibration verdicts (dlscale.scoring.calibration): the spread/skill band, and the rank histograms' reliability
index, chi-square, slope and shape on histograms whose answer is known by construction."""

from __future__ import annotations

import numpy as np
import pytest

from dlscale.scoring.calibration import CALIBRATED_BAND, in_band, rank_histogram_reliability


def test_the_band_is_a_quarter_either_way_and_undefined_ratios_are_none():
    assert CALIBRATED_BAND == (0.8, 1.25)
    assert in_band([float("nan"), 0.79, 0.8, 1.0, 1.25, 1.26, None]) == [
        None,
        False,
        True,
        True,
        True,
        False,
        None,
    ]


def test_a_flat_histogram():
    found = rank_histogram_reliability([100] * 9)
    assert found["shape"] == "flat" and found["reliability_index"] == 0 and found["chi_square"] == 0
    assert found["slope"] == pytest.approx(0, abs=1e-12) and found["degrees_of_freedom"] == 8


def test_by_hand():
    # counts 30, 10, 20 of 60: shares 1/2, 1/6, 1/3 against 1/3 each
    found = rank_histogram_reliability([30, 10, 20])
    assert found["reliability_index"] == pytest.approx(1 / 6 + 1 / 6 + 0)
    assert found["chi_square"] == pytest.approx((10**2 + 10**2 + 0) / 20)
    # p_i / u = 1.5, 0.5, 1.0 at places 0, 0.5, 1: least-squares slope -0.5
    assert found["slope"] == pytest.approx(-0.5)


@pytest.mark.parametrize(
    ("counts", "shape", "slope_sign"),
    [
        ([50, 10, 10, 10, 10, 10, 50], "U", 0),  # too little spread: the truth outside the members
        ([5, 20, 40, 60, 40, 20, 5], "dome", 0),  # too much spread
        ([5, 10, 20, 30, 40, 50, 60], "sloped", 1),  # the truth ranks high: the members too low
        ([60, 50, 40, 30, 20, 10, 5], "sloped", -1),
    ],
)
def test_shapes(counts, shape, slope_sign):
    found = rank_histogram_reliability(counts)
    assert found["shape"] == shape
    if slope_sign:
        assert np.sign(found["slope"]) == slope_sign
    else:
        assert abs(found["slope"]) < 1e-9  # symmetric


def test_an_empty_histogram_has_no_numbers():
    found = rank_histogram_reliability([0, 0, 0])
    assert found["shape"] is None and found["reliability_index"] is None
