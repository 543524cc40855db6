"""WeatherBench2's 61-day window: its triangular weights, and the weighted sum around the year's 366 days."""

from __future__ import annotations

import numpy as np
import pytest

from dlscale.data.era5.climatology.window import circular_window_sum, window_weights, windowed_mean


def test_the_61_day_weights_rise_linearly_from_zero_to_the_centre_and_average_one():
    weights = window_weights(61)
    offsets = np.arange(-30, 31)
    unscaled = 1.0 - np.abs(offsets) / 30.0  # 0 at +-30 days, 1 at the centre
    np.testing.assert_allclose(weights, unscaled / unscaled.mean(), rtol=1e-12)
    assert weights[0] == weights[-1] == 0.0
    assert weights.sum() == pytest.approx(61.0)


@pytest.mark.parametrize("size", [0, 1, 2, 60])
def test_a_window_that_is_not_odd_and_at_least_3_days_is_refused(size):
    with pytest.raises(ValueError, match="odd number of days"):
        window_weights(size)


@pytest.mark.parametrize(("size", "axis"), [(61, 0), (7, 1)])
def test_the_windowed_sum_wraps_around_the_year_as_a_direct_sum_does(size, axis):
    rng = np.random.default_rng(size)
    values = 5e4 + 1e3 * rng.standard_normal((366, 3, 2))  # geopotential-sized: the sums must not lose it
    values = np.moveaxis(values, 0, axis)
    half = size // 2
    weights = window_weights(size)
    days = np.moveaxis(values, axis, 0)
    direct = np.stack(
        [sum(weights[k + half] * days[(d + k) % 366] for k in range(-half, half + 1)) for d in range(366)]
    )
    got = circular_window_sum(values, size, axis)
    np.testing.assert_allclose(np.moveaxis(got, axis, 0), direct, rtol=1e-12)


def test_the_windowed_mean_skips_missing_years_and_leaves_days_without_data_nan():
    sums = np.zeros(366)
    counts = np.zeros(366, dtype=np.int32)
    sums[:10], counts[:10] = 2.0 * 3.0, 2  # days 1..10: two years, each 3.0
    sums[10:20], counts[10:20] = 5.0, 1  # days 11..20: one year, 5.0
    mean = windowed_mean(sums, counts, 61)
    assert mean[0] == pytest.approx(_direct_mean(sums, counts, 0))
    assert mean[0] == pytest.approx(3.0 + 2.0 * _share_of_one_year(counts, 0))
    assert np.isnan(mean[100])  # more than 30 days from any data
    assert not np.isnan(mean[-25])  # 25 days before 1 January: day 1 is in its window (wrap-around)


def _direct_mean(sums: np.ndarray, counts: np.ndarray, day: int) -> float:
    weights = window_weights(61)
    around = [(day + k) % 366 for k in range(-30, 31)]
    return float((weights * sums[around]).sum() / (weights * counts[around]).sum())


def _share_of_one_year(counts: np.ndarray, day: int) -> float:
    """The weight of the one-year days (value 5 = 3 + 2) in the window's weighted count."""
    weights = window_weights(61)
    around = np.array([(day + k) % 366 for k in range(-30, 31)])
    single = (counts[around] == 1) * weights
    return float(single.sum() / (weights * counts[around]).sum())
