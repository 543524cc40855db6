"""The scores of an ensemble forecast against the truth per lead time and channel, as WeatherBench2 scores
ensembles.

An ensemble of M members ``x_1 .. x_M`` at each grid point of each initial time i, the truth ``y``; every grid
mean is latitude-weighted (``w_lat = cos(lat)``, averaging 1 over the rows: :func:`latitude_weights`), fields
in physical units:

* **Ensemble-mean RMSE** (WeatherBench2's ``EnsembleMeanMSE``, square root after the time mean):
  ``sqrt(mean_i mean_grid(w (xbar - y)^2))`` with ``xbar`` the members' mean.
* **CRPS**, the fair (unbiased) estimator (WeatherBench2's ``CRPS`` = ``CRPSSkill - 0.5 * CRPSSpread``):
  ``mean_i mean_grid(w (E|X - y| - 0.5 E|X - X'|))`` with ``E|X - y| = 1/M sum_m |x_m - y|`` and
  ``E|X - X'| = 1/(M(M-1)) sum_{m != n} |x_m - x_n|``: the fair denominator M(M-1), so that the estimate is
  unbiased for the CRPS of the distribution the members are drawn from, whatever M. The double sum is computed
  from the sorted members, ``sum_{m,n} |x_m - x_n| = 2 sum_k (2k - M - 1) x_(k)`` (Zamo & Naveau 2018, as
  WeatherBench2 does): O(M log M) time and O(M) memory per point instead of M^2 pairs. With one member the
  spread term is 0 and the CRPS is the mean absolute error.
* **Spread** (WeatherBench2's ``EnsembleVariance``, square root after the time mean, as WeatherBench2 advises
  over its ``EnsembleStddevSqrtBeforeTimeAvg``): ``sqrt(mean_i mean_grid(w var(x)))`` with the unbiased member
  variance (``ddof=1``). Undefined for one member (NaN; WeatherBench2 reports 0 there).
* **Spread/skill ratio**: ``sqrt((M + 1) / M) * spread / ensemble-mean RMSE``. For a perfectly calibrated
  ensemble (truth and members drawn from one distribution of variance s^2) the expected squared error of the
  mean of M members is ``s^2 (1 + 1/M)`` while the expected member variance is ``s^2``, so the plain ratio tends to
  ``sqrt(M / (M + 1))``, not 1 (Fortin et al. 2014, "Why should ensemble spread match the RMSE of the ensemble
  mean?"). WeatherBench2's code (``visualization.compute_spread_skill_ratio``) divides ``ensemble_stddev`` by
  ``ensemble_mean_rmse`` without the factor; ``spread() / ensemble_mean_rmse()`` gives that plain ratio.
* **Rank histogram** (WeatherBench2's ``RankHistogram``, one bin per rank): per (lead, channel), how often the
  truth's rank among the members, the number of members below it (0 .. M, M + 1 bins), took each value, over all
  grid points and initial times. Plain counts, not latitude-weighted: a histogram's counts are what a flatness
  test (chi-square) is about, and WeatherBench2's histogram weighs each grid point alike too. Ties (members equal
  to the truth, e.g. quantized precipitation at 0) are broken at random as WeatherBench2 does: the truth takes a
  uniformly drawn place among the members it ties with, from a generator seeded once per ``EnsembleScores``
  (``seed``), so that exchangeable members give a flat histogram even with ties. Where no value ties (continuous
  fields), no random number is drawn and the counts do not depend on the seed or the batching.

The sums are float64 and per initial time, so an ensemble scored in batches of initial times gives the same
numbers as one scored at once (up to float64 rounding). Grid means run in the fields' precision.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from dlscale.scoring.forecast_scores import weighted_grid_mean
from dlscale.scoring.metrics import latitude_weights


class EnsembleScores:
    """Running sums of the ensemble-mean MSE, the CRPS, the member variance and the rank counts of one ensemble of
    ``n_members`` per (lead, channel), over initial times."""

    def __init__(self, n_leads: int, n_channels: int, n_members: int, latitudes: np.ndarray, seed: int = 0):
        if n_members < 1:
            raise ValueError(f"an ensemble needs at least 1 member, got n_members={n_members}")
        self.n_members = n_members
        # (H,), averaging 1, in float64: given in each add()'s precision, float32's rounded once
        self.weights = latitude_weights(latitudes, torch.float64)
        self.mean_mse_sum = np.zeros((n_leads, n_channels))
        self.crps_sum = np.zeros((n_leads, n_channels))
        self.variance_sum = np.zeros((n_leads, n_channels))
        self.rank_counts = np.zeros((n_leads, n_channels, n_members + 1), dtype=np.int64)
        # (leads, M): the initial times at which each member held a NaN or infinite value anywhere
        self.nonfinite_counts = np.zeros((n_leads, n_members), dtype=np.int64)
        self.count = np.zeros(n_leads, dtype=np.int64)
        self.tie_generator = torch.Generator().manual_seed(seed)  # on the CPU: the same draws on any device

    def add(self, lead: int, members: torch.Tensor, truth: torch.Tensor) -> None:
        """Add the (N, M, C, H, W) members of N initial times at lead index ``lead`` against their (N, C, H, W)
        truth."""
        expected_truth = members.shape[:1] + members.shape[2:]
        if members.dim() != 5 or truth.shape != expected_truth:
            raise ValueError(
                f"members {tuple(members.shape)} and truth {tuple(truth.shape)} disagree: expected members "
                f"(N, M, C, H, W) and truth (N, C, H, W) with the same N, C, H, W"
            )
        if members.shape[1] != self.n_members:
            raise ValueError(
                f"members {tuple(members.shape)} have {members.shape[1]} members, this ensemble was set up for "
                f"{self.n_members}"
            )
        weights = self.weights.to(device=members.device, dtype=members.dtype)
        ensemble_mean = members.mean(dim=1)
        error = ensemble_mean - truth
        self.mean_mse_sum[lead] += _per_time_sum(weighted_grid_mean(error * error, weights))
        # The members sorted once serve the CRPS's spread term, the variance and the ranks (the scores cost about
        # as much as the model's step on a CPU). Subtracting the mean keeps their order (rounding is monotonic).
        ordered = torch.sort(members, dim=1).values
        centred = ordered - ensemble_mean.unsqueeze(1)
        crps = fair_crps(members, truth, centred)
        self.crps_sum[lead] += _per_time_sum(weighted_grid_mean(crps, weights))
        if self.n_members > 1:
            variance = (centred * centred).sum(dim=1) / (self.n_members - 1)
            self.variance_sum[lead] += _per_time_sum(weighted_grid_mean(variance, weights))
        self.rank_counts[lead] += self._rank_counts(ordered, truth)
        nonfinite = ~torch.isfinite(members).flatten(2).all(dim=2)  # (N, M)
        self.nonfinite_counts[lead] += nonfinite.sum(dim=0).cpu().numpy()
        self.count[lead] += members.shape[0]

    def _rank_counts(self, ordered: torch.Tensor, truth: torch.Tensor) -> np.ndarray:
        """(C, M + 1): how often the truth had each rank among the members (``ordered``: sorted along the members'
        dimension), ties broken at random."""
        sequences = ordered.movedim(1, -1).contiguous()  # searchsorted looks along the last dimension
        value = truth.unsqueeze(-1).contiguous()
        below = torch.searchsorted(sequences, value).squeeze(-1)  # (N, C, H, W): members strictly below
        tied = torch.searchsorted(sequences, value, right=True).squeeze(-1) - below
        rank = below
        if bool(tied.any()):
            uniform = torch.rand(tied.shape, generator=self.tie_generator, dtype=torch.float64)
            # a uniform place among the tied + 1 positions the truth can take (0 .. tied)
            place = (uniform.to(tied.device) * (tied + 1)).floor().long().clamp(max=tied)
            rank = below + place
        n_bins = self.n_members + 1
        n_channels = ordered.shape[2]
        channel = torch.arange(n_channels, device=rank.device).view(1, -1, 1, 1)
        flat = (channel * n_bins + rank).flatten()
        counts = torch.bincount(flat, minlength=n_channels * n_bins)
        return counts.view(n_channels, n_bins).cpu().numpy()

    def running_sums(self) -> list[np.ndarray]:
        """Every running sum and count, the arrays themselves (ranks add them up)."""
        return [
            self.mean_mse_sum,
            self.crps_sum,
            self.variance_sum,
            self.rank_counts,
            self.nonfinite_counts,
            self.count,
        ]

    def nonfinite_members(self) -> tuple[list[int], int | None]:
        """The members (indices, 0 the first) that held a NaN or infinite value at any lead, and the first lead
        index where any did (None: every member stayed finite)."""
        leads = np.flatnonzero(self.nonfinite_counts.any(axis=1))
        members = np.flatnonzero(self.nonfinite_counts.any(axis=0))
        return members.tolist(), int(leads[0]) if len(leads) else None

    def ensemble_mean_rmse(self) -> np.ndarray:
        """(leads, C): the square root of the mean over initial times of the ensemble mean's weighted MSE."""
        return self._time_mean(self.mean_mse_sum, sqrt=True)

    def crps(self) -> np.ndarray:
        """(leads, C): the mean over initial times of the weighted grid mean of the fair CRPS."""
        return self._time_mean(self.crps_sum, sqrt=False)

    def spread(self) -> np.ndarray:
        """(leads, C): the square root of the mean over initial times of the weighted mean member variance
        (unbiased); NaN for one member."""
        if self.n_members < 2:
            return np.full(self.variance_sum.shape, np.nan)
        return self._time_mean(self.variance_sum, sqrt=True)

    def spread_skill_ratio(self) -> np.ndarray:
        """(leads, C): ``sqrt((M + 1) / M) * spread / ensemble-mean RMSE``, 1 for a perfectly calibrated ensemble
        of any size; NaN for one member or where the ensemble mean has no error."""
        skill = self.ensemble_mean_rmse()
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = math.sqrt((self.n_members + 1) / self.n_members) * self.spread() / skill
        return np.where(skill > 0, ratio, np.nan)

    def rank_histogram(self) -> np.ndarray:
        """(leads, C, M + 1): counts of the truth's rank (members below it) over grid points and initial times."""
        return self.rank_counts.copy()

    def _time_mean(self, sums: np.ndarray, sqrt: bool) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = sums / self.count[:, None]
            return np.sqrt(mean) if sqrt else mean


def fair_crps(
    members: torch.Tensor, truth: torch.Tensor, centred_ordered: torch.Tensor | None = None
) -> torch.Tensor:
    """(N, C, H, W): the fair CRPS at each point of (N, M, C, H, W) members against their (N, C, H, W) truth,
    ``1/M sum_m |x_m - y| - 1/(2 M (M-1)) sum_{m,n} |x_m - x_n|`` (the second term 0 for one member).
    ``centred_ordered``: the members minus their mean, sorted along the members, when the caller has them."""
    n_members = members.shape[1]
    skill = (members - truth.unsqueeze(1)).abs().mean(dim=1)
    if n_members < 2:
        return skill
    # Centred on the ensemble mean first: the coefficients sum to 0, so this changes nothing but the float32
    # rounding, whose terms (up to (M - 1) x ~5e4 m^2/s^2 for z500) would otherwise dwarf a spread of a few units.
    if centred_ordered is None:
        centred_ordered = torch.sort(members - members.mean(dim=1, keepdim=True), dim=1).values
    position = torch.arange(1, n_members + 1, device=members.device, dtype=members.dtype)
    coefficient = (2 * position - n_members - 1).view(1, -1, 1, 1, 1)
    pair_sum = 2 * (coefficient * centred_ordered).sum(
        dim=1
    )  # sum over all ordered pairs (m, n) of |x_m - x_n|
    mean_pair_distance = pair_sum / (n_members * (n_members - 1))
    return skill - 0.5 * mean_pair_distance


def _per_time_sum(per_time: torch.Tensor) -> np.ndarray:
    """(C,): the float64 sum over initial times of an (N, C) score."""
    return per_time.double().sum(dim=0).cpu().numpy()
