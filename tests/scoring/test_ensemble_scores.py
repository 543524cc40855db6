"""The ensemble scores follow WeatherBench2: the fair CRPS tends to a Gaussian's closed form, matches a direct sum
over member pairs and is 0 for two members that bracket the truth symmetrically; one member's CRPS is its MAE;
a calibrated ensemble's corrected spread/skill ratio is 1; exchangeable members give a flat rank histogram (with
ties too) and a biased ensemble a skewed one; batches score as one call; rows weigh by cos(latitude)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dlscale.scoring.ensemble_scores import EnsembleScores

LATITUDES = np.linspace(-80.0, 80.0, 8)


def row_weights(latitudes: np.ndarray) -> np.ndarray:
    """cos(latitude) per row, averaging 1: written here, not taken from the module."""
    weights = np.cos(np.deg2rad(latitudes))
    return weights / weights.mean()


def weighted_grid_mean(values: np.ndarray, latitudes: np.ndarray) -> np.ndarray:
    """(..., H, W) -> (...): the latitude-weighted mean over the grid."""
    return (values * row_weights(latitudes)[:, None]).mean(axis=(-2, -1))


def scored(members: np.ndarray, truth: np.ndarray, latitudes=LATITUDES, seed: int = 0) -> EnsembleScores:
    scores = EnsembleScores(1, members.shape[2], members.shape[1], latitudes, seed=seed)
    scores.add(0, torch.from_numpy(members), torch.from_numpy(truth))
    return scores


def gaussian_crps(mean: np.ndarray, sigma: float, observed: np.ndarray) -> np.ndarray:
    """The closed-form CRPS of N(mean, sigma^2) for the observation (Gneiting & Raftery 2007)."""
    z = (observed - mean) / sigma
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return sigma * (z * (2.0 * cdf - 1.0) + 2.0 * pdf - 1.0 / math.sqrt(math.pi))


def test_the_crps_of_many_gaussian_members_tends_to_the_gaussian_closed_form():
    rng = np.random.default_rng(0)
    n_times, n_members, height, width, sigma = 4, 2000, 8, 32, 2.0
    mean = rng.normal(size=(n_times, 1, height, width)) * 5.0
    truth = mean + rng.normal(size=mean.shape) * 3.0  # not calibrated: the CRPS holds for any truth
    members = mean[:, None] + sigma * rng.normal(size=(n_times, n_members, 1, height, width))
    crps = scored(members, truth).crps()[0, 0]
    expected = weighted_grid_mean(gaussian_crps(mean, sigma, truth), LATITUDES).mean()
    # The fair estimator is unbiased for each point's Gaussian CRPS; its standard error per point is at most
    # sqrt(E(X - y)^2 / M) for E|X - y| plus sigma / sqrt(M) for half of E|X - X'| (a U-statistic, standard
    # error at most 2 sd / sqrt(M)); the points are independent, so the weighted mean's standard error is the
    # quadrature sum weighted by w / sum w. 5 of them: about 1% of the CRPS here, where dropping the spread term
    # or doubling it moves the CRPS by over 50%.
    weights = np.broadcast_to(row_weights(LATITUDES)[:, None], (height, width))
    per_point = (np.sqrt(sigma**2 + (truth - mean) ** 2) + sigma) / math.sqrt(n_members)
    standard_error = np.sqrt((weights**2 * per_point**2).sum(axis=(-2, -1)).sum()) / (weights.sum() * n_times)
    assert abs(crps - expected) < 5 * standard_error
    assert 5 * standard_error < 0.02 * expected  # the bound is tight enough to mean something


def test_the_crps_and_the_other_scores_match_a_direct_computation_over_member_pairs():
    rng = np.random.default_rng(1)
    n_times, n_members, n_channels = 3, 5, 2
    truth = rng.normal(size=(n_times, n_channels, 8, 6))
    members = truth[:, None] + rng.normal(size=(n_times, n_members, n_channels, 8, 6)) * [[[[1.0]], [[3.0]]]]
    scores = scored(members, truth)
    skill = np.abs(members - truth[:, None]).mean(axis=1)
    pairs = sum(
        np.abs(members[:, m] - members[:, n]) for m in range(n_members) for n in range(n_members) if m != n
    )
    crps = skill - 0.5 * pairs / (n_members * (n_members - 1))
    np.testing.assert_allclose(scores.crps()[0], weighted_grid_mean(crps, LATITUDES).mean(axis=0), rtol=1e-6)
    squared_error = (members.mean(axis=1) - truth) ** 2
    expected_rmse = np.sqrt(weighted_grid_mean(squared_error, LATITUDES).mean(axis=0))
    np.testing.assert_allclose(scores.ensemble_mean_rmse()[0], expected_rmse, rtol=1e-6)
    variance = ((members - members.mean(axis=1, keepdims=True)) ** 2).sum(axis=1) / (n_members - 1)
    expected_spread = np.sqrt(weighted_grid_mean(variance, LATITUDES).mean(axis=0))
    np.testing.assert_allclose(scores.spread()[0], expected_spread, rtol=1e-6)
    expected_ratio = math.sqrt((n_members + 1) / n_members) * expected_spread / expected_rmse
    np.testing.assert_allclose(scores.spread_skill_ratio()[0], expected_ratio, rtol=1e-6)


def test_two_members_that_bracket_the_truth_have_a_fair_crps_of_zero():
    # members 0 and 2, truth 1: E|X - y| = 1; the fair E|X - X'| = (|0 - 2| + |2 - 0|) / (2 * 1) = 2, so the
    # CRPS is 1 - 2 / 2 = 0 (the biased 1/M^2 estimator would give 1 - 1 / 2 = 0.5).
    members = np.zeros((1, 2, 1, 8, 6))
    members[:, 1] = 2.0
    truth = np.ones((1, 1, 8, 6))
    assert scored(members, truth).crps()[0, 0] == pytest.approx(0.0, abs=1e-12)
    # members 0 and 2, truth 3: E|X - y| = 2, CRPS = 2 - 1 = 1
    assert scored(members, truth * 3.0).crps()[0, 0] == pytest.approx(1.0)


def test_one_member_has_the_mae_as_its_crps_and_no_spread():
    rng = np.random.default_rng(2)
    truth = rng.normal(size=(2, 1, 8, 6))
    member = truth + rng.normal(size=truth.shape)
    scores = scored(member[:, None], truth)
    mae = weighted_grid_mean(np.abs(member - truth), LATITUDES).mean()
    assert scores.crps()[0, 0] == pytest.approx(mae)
    assert np.isnan(scores.spread()[0, 0])
    assert np.isnan(scores.spread_skill_ratio()[0, 0])
    assert scores.ensemble_mean_rmse()[0, 0] > 0


def test_a_perfectly_calibrated_ensemble_has_a_spread_skill_ratio_near_one():
    rng = np.random.default_rng(3)
    n_times, n_members, height, width = 4, 4, 32, 64
    latitudes = np.linspace(-87.0, 87.0, height)
    centre = rng.normal(size=(n_times, 1, height, width)) * 10.0  # what is known at each point
    truth = centre + rng.normal(size=centre.shape)  # truth and members: the same distribution around it
    members = centre[:, None] + rng.normal(size=(n_times, n_members, 1, height, width))
    ratio = scored(members, truth, latitudes).spread_skill_ratio()[0, 0]
    # ratio^2 = spread^2 / skill^2, each a weighted mean of independent squares: relative standard errors
    # sqrt(2 / n) (skill) and sqrt(2 / (n (M - 1))) (spread), n the effective number of points
    # (sum w)^2 / sum w^2; the ratio's is half their quadrature sum. 4 of them (about 0.04 here). Without the
    # sqrt((M + 1) / M) factor the ratio tends to sqrt(4 / 5) = 0.89.
    weights = np.broadcast_to(row_weights(latitudes)[:, None], (height, width))
    effective = n_times * weights.sum() ** 2 / (weights**2).sum()
    standard_error = 0.5 * math.sqrt(2 / effective + 2 / (effective * (n_members - 1)))
    assert 4 * standard_error < 0.05
    assert ratio == pytest.approx(1.0, abs=4 * standard_error)


def chi_square(counts: np.ndarray) -> float:
    expected = counts.sum() / counts.size
    return float(((counts - expected) ** 2 / expected).sum())


# the 99.99% quantile of a chi-square with 4 degrees of freedom (5 bins): a flat histogram exceeds it once in 1e4
CHI_SQUARE_4_DOF_9999 = 23.51


def test_exchangeable_members_give_a_flat_rank_histogram_and_a_biased_ensemble_a_skewed_one():
    rng = np.random.default_rng(4)
    n_members = 4
    values = rng.normal(size=(3, n_members + 1, 2, 8, 16))  # truth and members exchangeable
    truth, members = values[:, 0], values[:, 1:].copy()
    members[:, :, 1] += 1.0  # channel 1's members run high: its truth ranks low
    histograms = scored(members, truth).rank_histogram()[0]
    assert histograms.shape == (2, n_members + 1)
    np.testing.assert_array_equal(histograms.sum(axis=1), [3 * 8 * 16, 3 * 8 * 16])
    flat, biased = histograms
    assert chi_square(flat) < CHI_SQUARE_4_DOF_9999
    assert biased[0] > 3 * biased[-1]
    assert chi_square(biased) > 5 * CHI_SQUARE_4_DOF_9999


def test_ties_are_broken_at_random_so_a_discrete_exchangeable_ensemble_is_flat_too():
    rng = np.random.default_rng(5)
    n_members = 4
    values = rng.integers(0, 2, size=(4, n_members + 1, 1, 8, 16)).astype(np.float64)  # ties everywhere
    truth, members = values[:, 0], values[:, 1:]
    histogram = scored(members, truth, seed=7).rank_histogram()[0, 0]
    assert histogram.sum() == 4 * 8 * 16
    assert chi_square(histogram) < CHI_SQUARE_4_DOF_9999
    again = scored(members, truth, seed=7).rank_histogram()[0, 0]
    np.testing.assert_array_equal(histogram, again)  # the seed makes it reproducible


def test_scoring_in_batches_of_initial_times_gives_what_one_call_gives():
    rng = np.random.default_rng(6)
    truth = rng.normal(size=(5, 2, 8, 6))
    members = truth[:, None] + rng.normal(size=(5, 3, 2, 8, 6))
    whole = scored(members, truth)
    batched = EnsembleScores(2, 2, 3, LATITUDES)
    batched.add(1, torch.from_numpy(members[:2]), torch.from_numpy(truth[:2]))
    batched.add(1, torch.from_numpy(members[2:]), torch.from_numpy(truth[2:]))
    for name in ("ensemble_mean_rmse", "crps", "spread", "spread_skill_ratio"):
        np.testing.assert_allclose(getattr(batched, name)()[1], getattr(whole, name)()[0], rtol=1e-12)
        assert np.isnan(getattr(batched, name)()[0]).all()  # lead 0 never scored: undefined, not 0
    np.testing.assert_array_equal(batched.rank_histogram()[1], whole.rank_histogram()[0])
    assert batched.rank_histogram()[0].sum() == 0


def test_rows_weigh_by_the_cosine_of_their_latitude():
    latitudes = np.array([90.0, 30.0, 0.0, -30.0, -90.0])
    truth = np.zeros((1, 1, 5, 4))
    at_the_poles = np.zeros((1, 2, 1, 5, 4))
    at_the_poles[:, :, :, [0, -1]] = [[[[3.0]]], [[[5.0]]]]  # two members wrong at the poles only
    at_the_equator = np.zeros((1, 2, 1, 5, 4))
    at_the_equator[:, :, :, 2] = [[[3.0]], [[5.0]]]
    poles = scored(at_the_poles, truth, latitudes)
    equator = scored(at_the_equator, truth, latitudes)
    for name in ("ensemble_mean_rmse", "crps", "spread"):
        assert getattr(poles, name)()[0, 0] == pytest.approx(0.0, abs=1e-6)  # cos(90) = 0
        assert getattr(equator, name)()[0, 0] > 0.5
    # members 3 and 5 against 0: CRPS = (3 + 5) / 2 - 0.5 * |3 - 5| * 2 / (2 * 1) = 3 on the equator's row, which
    # weighs 1 / mean(cos) among the 5 rows
    weight = 1.0 / np.cos(np.deg2rad(latitudes)).mean()
    assert equator.crps()[0, 0] == pytest.approx((4.0 - 0.5 * 2.0) * weight / 5)


def test_members_and_truth_that_disagree_name_both_shapes():
    scores = EnsembleScores(1, 2, 3, LATITUDES)
    with pytest.raises(ValueError, match=r"members \(1, 3, 2, 8, 6\) and truth \(1, 2, 8, 5\)"):
        scores.add(0, torch.zeros(1, 3, 2, 8, 6), torch.zeros(1, 2, 8, 5))
    with pytest.raises(ValueError, match=r"members \(1, 4, 2, 8, 6\) have 4 members.* set up for 3"):
        scores.add(0, torch.zeros(1, 4, 2, 8, 6), torch.zeros(1, 2, 8, 6))
