"""Confidence intervals of repeated throughput trials and the comparison of two configs' speeds."""

from __future__ import annotations

import math
import statistics

import pytest

from dlscale.perf.bench.intervals import compare_throughputs, mean_interval, ratio_interval, t_quantile_975


@pytest.mark.parametrize(
    ("df", "expected"),
    [
        (1, 12.706),
        (2, 4.303),
        (10, 2.228),
        (30, 2.042),
        (31, 2.0395),
        (40, 2.0211),
        (60, 2.0003),
        (120, 1.9799),
    ],
)
def test_t_quantile_matches_known_values(df: int, expected: float) -> None:
    assert t_quantile_975(df) == pytest.approx(expected, abs=0.001)


def test_t_quantile_rounds_fractional_df_down_and_is_infinite_below_one() -> None:
    assert t_quantile_975(2.9) == t_quantile_975(2)
    assert t_quantile_975(0.5) == math.inf
    assert t_quantile_975(0) == math.inf
    assert t_quantile_975(100_000) == pytest.approx(1.95996, abs=0.0001)


def test_mean_interval_by_hand() -> None:
    # mean 12, s = 2, se = 2 / sqrt(3), t(2) = 4.303
    interval = mean_interval([10.0, 12.0, 14.0])
    half = 4.303 * 2 / math.sqrt(3)
    assert interval.mean == pytest.approx(12.0)
    assert interval.low == pytest.approx(12.0 - half)
    assert interval.high == pytest.approx(12.0 + half)
    assert interval.half_width == pytest.approx(half)
    assert interval.trials == 3
    assert "3 trials" in interval.describe()


def test_mean_interval_of_one_trial_is_infinite_and_of_none_raises() -> None:
    interval = mean_interval([5.0])
    assert (interval.mean, interval.low, interval.high) == (5.0, -math.inf, math.inf)
    assert "no interval" in interval.describe()
    with pytest.raises(ValueError):
        mean_interval([])


def test_speed_up_interval_is_welch_on_the_logarithms_by_hand() -> None:
    candidate, incumbent = [110.0, 112.0, 114.0], [100.0, 101.0, 102.0]
    logs_c, logs_i = [math.log(v) for v in candidate], [math.log(v) for v in incumbent]
    se_c, se_i = statistics.variance(logs_c) / 3, statistics.variance(logs_i) / 3
    welch_df = (se_c + se_i) ** 2 / (se_c**2 / 2 + se_i**2 / 2)
    assert 3 <= welch_df < 4  # -> t(3) = 3.182
    difference, half = statistics.mean(logs_c) - statistics.mean(logs_i), 3.182 * math.sqrt(se_c + se_i)
    comparison = compare_throughputs(candidate, incumbent)
    assert comparison.ratio == pytest.approx(
        statistics.geometric_mean(candidate) / statistics.geometric_mean(incumbent)
    )
    assert comparison.low == pytest.approx(math.exp(difference - half))
    assert comparison.high == pytest.approx(math.exp(difference + half))
    assert comparison.outcome == "faster"


def test_a_noisy_slow_speed_up_has_a_positive_interval_equal_to_the_verdicts_ratio_interval() -> None:
    # The case: a candidate whose two trials scatter widely, "FULL 0.17x (95% CI -0.15x-0.48x)" on the
    # linear scale.
    candidate, incumbent = [10.0, 24.0], [100.0, 101.0]
    assert mean_interval(candidate).low < 0  # where the linear interval's lower bound came from
    comparison = compare_throughputs(candidate, incumbent)
    interval = ratio_interval(candidate, incumbent)
    expected = (interval.ratio, interval.low, interval.high)
    assert (comparison.ratio, comparison.low, comparison.high) == expected
    assert 0 < comparison.low < comparison.ratio < comparison.high
    assert comparison.outcome == "within noise"  # the interval reaches above 1: two trials cannot tell
    text = comparison.describe()
    assert "-0." not in text and text.startswith(f"{interval.ratio:.2f}x (95% CI ")


def test_a_small_bound_is_printed_with_significant_digits() -> None:
    comparison = compare_throughputs([3.0, 5.0, 4.0], [100.0, 101.0, 99.0])
    assert comparison.outcome == "slower" and comparison.low < 0.1
    assert f"95% CI {comparison.low:.2g}x-" in comparison.describe()


def test_clearly_faster() -> None:
    comparison = compare_throughputs([130.0, 131.0, 129.0], [100.0, 101.0, 99.0])
    assert comparison.outcome == "faster"
    assert comparison.ratio == pytest.approx(1.3, rel=1e-4)
    assert 1 < comparison.low < comparison.ratio < comparison.high
    assert not comparison.could_gain
    assert comparison.describe().endswith(": faster")


def test_clearly_slower() -> None:
    comparison = compare_throughputs([100.0, 101.0, 99.0], [130.0, 131.0, 129.0])
    assert comparison.outcome == "slower"
    assert comparison.high < 1
    assert not comparison.could_gain


def test_overlapping_trials_are_within_noise() -> None:
    comparison = compare_throughputs([101.0, 111.0, 91.0], [100.0, 110.0, 90.0])
    assert comparison.outcome == "within noise"
    assert comparison.low < 1 < comparison.high
    assert not comparison.could_gain  # a 1 % estimate: not worth more trials
    behind = compare_throughputs([99.0, 109.0, 89.0], [100.0, 110.0, 90.0])
    assert behind.ratio < 1 < behind.high
    assert behind.outcome == "within noise"  # not slower: the interval reaches above 1


def test_faster_beyond_noise_but_below_min_gain_is_within_noise() -> None:
    comparison = compare_throughputs([101.0, 101.1, 100.9], [100.0, 100.1, 99.9], min_gain=0.02)
    assert comparison.low > 1  # the gain is real ...
    assert comparison.outcome == "within noise"  # ... but not worth a knob
    assert not comparison.could_gain  # and more trials would not make it worth one
    assert "below the 2%" in comparison.describe()
    assert (
        compare_throughputs([101.0, 101.1, 100.9], [100.0, 100.1, 99.9], min_gain=0.005).outcome == "faster"
    )


def test_a_single_trial_is_within_noise_with_an_infinite_interval() -> None:
    comparison = compare_throughputs([130.0], [100.0, 101.0, 99.0])
    assert comparison.outcome == "within noise"
    assert (comparison.low, comparison.high) == (0.0, math.inf)  # no bound, and still no negative one
    assert comparison.ratio == pytest.approx(130 / statistics.geometric_mean([100.0, 101.0, 99.0]))
    assert comparison.could_gain  # a second measurement could confirm it
    assert "too few trials" in comparison.describe()
    assert compare_throughputs([130.0, 131.0], [100.0]).outcome == "within noise"


def test_identical_trials_with_zero_variance() -> None:
    same = compare_throughputs([100.0] * 3, [100.0] * 3)
    assert (same.ratio, same.low, same.high, same.outcome) == (1.0, 1.0, 1.0, "within noise")
    assert not same.could_gain
    faster = compare_throughputs([120.0] * 3, [100.0] * 3)
    assert (faster.low, faster.high, faster.outcome) == (pytest.approx(1.2), pytest.approx(1.2), "faster")
    slower = compare_throughputs([80.0] * 3, [100.0] * 3)
    assert slower.outcome == "slower"


def test_could_gain_only_for_a_worthwhile_estimate_within_noise() -> None:
    wide = compare_throughputs([100.0, 115.0, 115.0], [100.0, 100.5, 99.5])  # 1.10x, wide interval
    assert wide.outcome == "within noise"
    assert wide.could_gain
    small = compare_throughputs([100.0, 111.0, 92.0], [100.0, 100.5, 99.5])  # 1.01x: not worth a knob
    assert small.outcome == "within noise"
    assert not small.could_gain


def test_incumbent_must_be_positive() -> None:
    with pytest.raises(ValueError):
        compare_throughputs([1.0, 2.0], [0.0, 0.0])


# ---- the ratio of two rates, on the logarithms --------------------------------------------------------------


def test_ratio_interval_is_welch_on_the_logarithms() -> None:
    # log means 2 and 0, variances 2 and 0: Welch's df is 1 (t = 12.706), the standard error 1
    interval = ratio_interval([math.e, math.e**3], [1.0, 1.0])
    assert interval.ratio == pytest.approx(math.e**2)
    assert interval.low == pytest.approx(math.exp(2 - 12.706), rel=1e-3)
    assert interval.high == pytest.approx(math.exp(2 + 12.706), rel=1e-3)
    exact = ratio_interval([50.0, 50.0], [200.0, 200.0])
    assert exact.low == exact.ratio == exact.high == pytest.approx(0.25)


def test_ratio_interval_scales_with_the_rates_and_inverts() -> None:
    a, b = [30.0, 33.0, 29.0], [100.0, 104.0, 97.0]
    base, scaled, inverse = ratio_interval(a, b), ratio_interval([10 * v for v in a], b), ratio_interval(b, a)
    assert (scaled.ratio, scaled.low, scaled.high) == pytest.approx(
        (10 * base.ratio, 10 * base.low, 10 * base.high)
    )
    assert (inverse.ratio, inverse.low, inverse.high) == pytest.approx(
        (1 / base.ratio, 1 / base.high, 1 / base.low)
    )


def test_a_loader_a_hundred_times_faster_is_so_beyond_noise_where_a_linear_interval_goes_negative() -> None:
    # The documented bench (docs/speed.md) on a busy 2-core machine: two IO trials 20% apart, two SYNTHETIC
    # trials close together.
    io, synthetic = [27446.5, 33401.1], [159.6, 160.4]
    assert mean_interval(io).low < 0  # a rate below zero: the linear interval says nothing here
    interval = ratio_interval(synthetic, io)
    assert 0 < interval.low < interval.ratio < interval.high < 0.02


def test_ratio_interval_covers_the_true_ratio_about_95_percent_of_the_time() -> None:
    # Seeded log-normal trials (10% scatter on one side, 3% on the other), true ratio 0.5, 3 trials each.
    import random

    rng = random.Random(7)
    covered = 0
    repeats = 2000
    for _ in range(repeats):
        numerator = [50.0 * math.exp(rng.gauss(0, 0.10)) for _ in range(3)]
        denominator = [100.0 * math.exp(rng.gauss(0, 0.03)) for _ in range(3)]
        interval = ratio_interval(numerator, denominator)
        covered += interval.low <= 0.5 <= interval.high
    assert 0.93 <= covered / repeats <= 0.995  # Welch's df rounded down: a little conservative


def test_ratio_interval_of_one_trial_is_unbounded_and_rates_must_be_positive() -> None:
    single = ratio_interval([120.0], [100.0, 101.0])
    assert single.ratio == pytest.approx(120 / math.sqrt(100 * 101)) and math.isinf(single.high)
    assert "no interval" in single.describe()
    with pytest.raises(ValueError, match="> 0"):
        ratio_interval([0.0, 1.0], [1.0, 1.0])
