"""The scores of a forecast against the truth per lead time and channel, as the field reports them.

WeatherBench2's conventions, on fields in physical units:

* **RMSE**, latitude-weighted: for each initial time i the weighted mean squared error over the grid,
  ``MSE_i = mean_{lat, lon}(w_lat * (f - o)^2)`` with ``w_lat = cos(lat)`` scaled to average 1 over the rows;
  then ``RMSE = sqrt(mean_i MSE_i)``: the square root comes **after** the mean over initial times (a mean of
  per-time RMSEs, the tutorial's validation number, is smaller whenever the error varies between times).
* **Bias**, the mean error: for each initial time the weighted mean over the grid of ``f - o``, then the mean
  over initial times (WeatherBench2's ``Bias``): positive where the forecast runs high, and where a rollout
  drifts (a model that cools by a kelvin a day shows it at once, which the RMSE mixes with every other error).
* **ACC**, the anomaly correlation against a climatology ``c`` (given with each batch: the field of each
  initial time's valid time, WeatherBench2's climatology by day of year and hour of day, or one mean field for
  every time; see :mod:`dlscale.scoring.climatologies`): for each initial time the weighted, uncentred
  correlation of the anomalies ``f' = f - c`` and ``o' = o - c``,
  ``ACC_i = sum(w f' o') / sqrt(sum(w f'^2) * sum(w o'^2))``, then the mean over initial times. A forecast that
  is the climatology has no anomaly, so its ACC is undefined (NaN, ``null`` in JSON), not 0.

The sums are float64 and per initial time, so a forecast scored in batches of initial times gives the same
numbers as one scored at once (up to float64 rounding). Grid means run in the fields' precision (float32 for a
model's, float64 for a float64 forecast ``dlscale score`` reads). A NaN or infinite value in a forecast or its
truth makes all three scores of that lead and channel NaN: none is averaged over fewer initial times than the
others in silence. An ACC left undefined at an initial time (no anomaly) is left out of its mean (``acc_count``
counts the initial times it averages).
"""

from __future__ import annotations

import numpy as np
import torch

from dlscale.scoring.metrics import latitude_weights


class ForecastScores:
    """Running sums of the weighted MSE, mean error and ACC of one forecaster per (lead, channel), over initial
    times."""

    def __init__(self, n_leads: int, n_channels: int, latitudes: np.ndarray):
        # (H,), averaging 1, in float64: given in each add()'s precision, float32's rounded once
        self.weights = latitude_weights(latitudes, torch.float64)
        self.has_acc = False  # whether any add() came with a climatology
        self.mse_sum = np.zeros((n_leads, n_channels))
        self.error_sum = np.zeros((n_leads, n_channels))  # of each initial time's weighted mean error
        self.acc_sum = np.zeros((n_leads, n_channels))
        self.acc_count = np.zeros((n_leads, n_channels))  # initial times whose ACC is defined
        self.count = np.zeros(n_leads, dtype=np.int64)

    def add(
        self,
        lead: int,
        forecast: torch.Tensor,
        truth: torch.Tensor,
        climatology: torch.Tensor | None = None,
        truth_anomaly: torch.Tensor | None = None,
    ) -> None:
        """Add the (N, C, H, W) forecasts of N initial times at lead index ``lead`` against their truth.
        ``climatology``: the ACC's reference at each forecast's valid time, (N, C, H, W) or broadcastable to it
        ((C, H, W): one field for all); None scores no ACC. ``truth_anomaly``: ``truth`` minus it, when the
        caller has it (several forecasters scored against one truth share it). Grid sums run in the fields'
        precision (float32 for the model's), the sums over initial times in float64."""
        weights = self.weights.to(device=forecast.device, dtype=forecast.dtype)
        error = forecast - truth
        mse = weighted_grid_mean(error * error, weights)  # (N, C)
        self.mse_sum[lead] += mse.double().sum(dim=0).cpu().numpy()
        self.error_sum[lead] += weighted_grid_mean(error, weights).double().sum(dim=0).cpu().numpy()
        self.count[lead] += forecast.shape[0]
        if climatology is not None:
            self.has_acc = True
            climatology = climatology.to(device=forecast.device, dtype=forecast.dtype)
            if truth_anomaly is None:
                truth_anomaly = truth - climatology
            # (N, C); an undefined ACC (no anomaly) is left out of the mean, a NaN one (a NaN or infinite value
            # in the fields) is not: it makes the mean NaN, as it makes the RMSE and the bias
            acc, undefined = _anomaly_correlation(forecast - climatology, truth_anomaly, weights)
            self.acc_sum[lead] += torch.where(undefined, 0.0, acc).double().sum(dim=0).cpu().numpy()
            self.acc_count[lead] += (~undefined).sum(dim=0).cpu().numpy()

    def running_sums(self) -> list[np.ndarray]:
        """Every running sum and count, the arrays themselves: what ranks that scored different initial times add
        up (:mod:`dlscale.scoring.rollout_ranks`)."""
        return [self.mse_sum, self.error_sum, self.acc_sum, self.acc_count, self.count]

    def rmse(self) -> np.ndarray:
        """(leads, C): the square root of the mean over initial times of each time's weighted MSE."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.sqrt(self.mse_sum / self.count[:, None])

    def bias(self) -> np.ndarray:
        """(leads, C): the mean over initial times of each time's weighted mean error (forecast - truth)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.error_sum / self.count[:, None]

    def acc(self) -> np.ndarray | None:
        """(leads, C): the mean over initial times of each time's ACC (NaN where it is nowhere defined); None
        when no batch came with a climatology."""
        if not self.has_acc:
            return None
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.acc_count > 0, self.acc_sum / np.maximum(self.acc_count, 1), np.nan)


def anomaly_correlation(
    forecast_anomaly: torch.Tensor, truth_anomaly: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """(N, C): the weighted, uncentred correlation over the grid of two (N, C, H, W) anomaly fields (``weights``:
    one per row); NaN where either has no anomaly at all (or holds NaN or infinite values)."""
    return _anomaly_correlation(forecast_anomaly, truth_anomaly, weights)[0]


def _anomaly_correlation(
    forecast_anomaly: torch.Tensor, truth_anomaly: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`anomaly_correlation`, and where it is undefined (N, C): either anomaly is zero everywhere."""
    covariance = weighted_grid_mean(forecast_anomaly * truth_anomaly, weights)
    forecast_power = weighted_grid_mean(forecast_anomaly * forecast_anomaly, weights)
    truth_power = weighted_grid_mean(truth_anomaly * truth_anomaly, weights)
    denominator = torch.sqrt(forecast_power * truth_power)
    acc = torch.where(denominator > 0, covariance / denominator, torch.full_like(covariance, float("nan")))
    return acc, denominator == 0


def weighted_grid_mean(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(N, C): the mean over (H, W) of ``values`` with each row weighted (the mean over longitudes first: one
    multiplication per row, not per grid point)."""
    return (values.mean(dim=-1) * weights).mean(dim=-1)
