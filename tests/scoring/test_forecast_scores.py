"""The forecast scores follow WeatherBench2's conventions: the latitude-weighted RMSE takes its square root after
the mean over initial times, the bias is the signed weighted mean error, the ACC of the truth is 1 and of its mirror -1, the climatology has no ACC, and
scoring in batches of initial times gives what scoring at once does; a climatology per valid time (by day of
year and hour) is each initial time's own reference, and without one there is no ACC."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dlscale.scoring.forecast_scores import ForecastScores, anomaly_correlation

LATITUDES = np.array([60.0, 20.0, -20.0, -60.0])


def fields(n: int, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).normal(size=(n, 2, 4, 6)))


def test_the_square_root_comes_after_the_mean_over_initial_times():
    truth = torch.zeros(2, 1, 4, 6)
    forecast = torch.stack([torch.full((1, 4, 6), 1.0), torch.full((1, 4, 6), 3.0)])
    scores = ForecastScores(1, 1, LATITUDES)
    scores.add(0, forecast, truth)
    # sqrt((1 + 9) / 2), not the mean of the two RMSEs (2)
    assert scores.rmse()[0, 0] == pytest.approx(np.sqrt(5.0))


def test_rows_weigh_by_the_cosine_of_their_latitude():
    truth = torch.zeros(1, 1, 4, 6)
    forecast = torch.zeros(1, 1, 4, 6)
    forecast[0, 0, 0] = 2.0  # an error at 60 N only
    scores = ForecastScores(1, 1, LATITUDES)
    scores.add(0, forecast, truth)
    weights = np.cos(np.deg2rad(LATITUDES))
    expected = np.sqrt(4.0 * weights[0] / weights.sum())
    assert scores.rmse()[0, 0] == pytest.approx(expected)


def test_the_bias_is_the_weighted_mean_error_with_its_sign_averaged_over_initial_times():
    truth = fields(3, seed=2)
    forecast = truth.clone()
    forecast[:, 0] += 1.5  # channel 0 runs high everywhere
    forecast[0, 1, 0] -= 4.0  # channel 1: too low at 60 N, at the first initial time only
    scores = ForecastScores(1, 2, LATITUDES)
    scores.add(0, forecast[:2], truth[:2])  # in two batches: the same as at once
    scores.add(0, forecast[2:], truth[2:])
    weights = np.cos(np.deg2rad(LATITUDES))
    weights = weights / weights.mean()
    error = (forecast - truth).numpy()
    expected = (error.mean(axis=-1) * weights).mean(axis=-1).mean(axis=0)  # grid, then initial times
    np.testing.assert_allclose(scores.bias()[0], expected, rtol=1e-7)  # the weights are float32 cosines
    assert scores.bias()[0, 0] == pytest.approx(1.5)
    assert scores.bias()[0, 1] == pytest.approx(-4.0 * weights[0] / 4 / 3)  # a row of 4, one time in 3


def test_the_truth_correlates_perfectly_its_mirror_negatively_and_the_climatology_not_at_all():
    climatology = fields(1, seed=1)[0]
    truth = fields(3)
    scores = {name: ForecastScores(1, 2, LATITUDES) for name in ("truth", "mirror", "climatology")}
    scores["truth"].add(0, truth, truth, climatology)
    scores["mirror"].add(0, 2 * climatology - truth, truth, climatology)
    scores["climatology"].add(0, climatology.expand_as(truth), truth, climatology)
    np.testing.assert_allclose(scores["truth"].acc(), 1.0, rtol=1e-12)
    np.testing.assert_allclose(scores["mirror"].acc(), -1.0, rtol=1e-12)
    assert np.isnan(scores["climatology"].acc()).all()
    assert scores["truth"].rmse()[0] == pytest.approx([0.0, 0.0])


def test_acc_is_the_weighted_uncentred_correlation_of_the_anomalies():
    forecast, truth = fields(2, seed=2), fields(2, seed=3)
    weights = torch.cos(torch.deg2rad(torch.tensor(LATITUDES)))
    acc = anomaly_correlation(forecast, truth, weights)
    w = np.broadcast_to(weights.numpy().reshape(1, 1, -1, 1), forecast.shape)
    f, o = forecast.numpy(), truth.numpy()
    expected = (w * f * o).sum(axis=(-2, -1)) / np.sqrt(
        (w * f * f).sum(axis=(-2, -1)) * (w * o * o).sum(axis=(-2, -1))
    )
    np.testing.assert_allclose(acc.numpy(), expected, rtol=1e-12)


def test_batches_of_initial_times_score_as_one():
    climatology = fields(1, seed=4)[0]
    forecast, truth = fields(5, seed=5), fields(5, seed=6)
    whole, batched = ForecastScores(1, 2, LATITUDES), ForecastScores(1, 2, LATITUDES)
    whole.add(0, forecast, truth, climatology)
    batched.add(0, forecast[:2], truth[:2], climatology)
    batched.add(0, forecast[2:], truth[2:], climatology)
    np.testing.assert_allclose(batched.rmse(), whole.rmse(), rtol=1e-12)
    np.testing.assert_allclose(batched.acc(), whole.acc(), rtol=1e-12)


def test_each_initial_time_is_correlated_against_the_climatology_of_its_own_valid_time():
    """Truth = its valid time's climatology (a seasonal cycle: a different field per time) + an anomaly; the
    forecast keeps half the anomaly and adds noise. The ACC is numpy's correlation of the anomalies, each
    against its own time's climatology: a forecast that is the truth's cycle plus its anomaly has ACC 1
    where a single mean field would leave the cycle in both anomalies."""
    cycle = fields(4, seed=7) * 10.0  # (N, C, H, W): each initial time's climatology, far apart
    anomaly = fields(4, seed=8)
    truth = cycle + anomaly
    forecast = cycle + 0.5 * anomaly + 0.3 * fields(4, seed=9)
    scores, perfect, plain = (ForecastScores(1, 2, LATITUDES) for _ in range(3))
    scores.add(0, forecast, truth, cycle)
    perfect.add(0, truth, truth, cycle)
    plain.add(0, forecast, truth)
    w = np.cos(np.deg2rad(LATITUDES)).reshape(1, 1, -1, 1)
    f, o = (forecast - cycle).numpy(), anomaly.numpy()
    expected = (w * f * o).sum(axis=(-2, -1)) / np.sqrt(
        (w * f * f).sum(axis=(-2, -1)) * (w * o * o).sum(axis=(-2, -1))
    )
    np.testing.assert_allclose(scores.acc()[0], expected.mean(axis=0), rtol=1e-10)
    np.testing.assert_allclose(perfect.acc(), 1.0, rtol=1e-12)
    assert plain.acc() is None  # no climatology given: no ACC
    one_field = ForecastScores(1, 2, LATITUDES)
    one_field.add(0, forecast, truth, cycle.mean(dim=0))  # one mean field: the cycle stays in the anomalies
    assert not np.allclose(one_field.acc()[0], expected.mean(axis=0), rtol=1e-3)
