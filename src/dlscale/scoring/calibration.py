"""Whether an ensemble is calibrated: its spread/skill ratio against a band, and how flat its rank histograms are.

* **Spread/skill in the band** :data:`CALIBRATED_BAND` = [0.8, 1.25]: the corrected ratio
  (:meth:`dlscale.scoring.ensemble_scores.EnsembleScores.spread_skill_ratio`, 1 for a calibrated ensemble of any
  size) within a quarter of 1 either way (0.8 = 1 / 1.25: as far below as above, on a log scale).
* **Rank histogram reliability** (counts of the truth's rank 0 .. M among M members, M + 1 bins, shares
  ``p_i = count_i / total``, flat share ``u = 1 / (M + 1)``):

  - ``reliability_index``: ``sum_i |p_i - u|`` (Delle Monache et al. 2006): 0 for a flat histogram, at most
    ``2 (1 - u)`` (every count in one bin);
  - ``chi_square``: Pearson's ``sum_i (count_i - total u)^2 / (total u)``, with ``M`` degrees of freedom. Its
    p-value is not given: the counts are grid points and initial times, far from independent, so any histogram
    of a real forecast would be "significant"; compare the statistic per count between forecasts instead
    (``chi_square / total``);
  - ``slope``: the least-squares slope of ``p_i / u`` against the rank's place ``i / M`` in [0, 1]: 0 flat,
    above 0 when the truth ranks high (the members too low: a cold or low bias), below 0 the other way;
  - ``shape``: ``flat`` when the reliability index is below :data:`FLAT_RELIABILITY_INDEX`; otherwise the
    larger of two departures in units of ``u``, the ends against the middle (``(p_0 + p_M) / 2 - mean(p_1 ..
    p_{M-1})``: above 0 ``U`` (too little spread), below 0 ``dome`` (too much spread)) and half the slope
    (``sloped``: a bias).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

CALIBRATED_BAND = (0.8, 1.25)  # spread/skill ratios counted as calibrated (issue 50's band)
FLAT_RELIABILITY_INDEX = 0.1  # a histogram whose shares stray this little in all from 1/(M+1) is flat


def in_band(ratios: Sequence[float | None]) -> list[bool | None]:
    """Per lead: whether the spread/skill ratio lies in :data:`CALIBRATED_BAND` (None where it is undefined)."""
    low, high = CALIBRATED_BAND
    out: list[bool | None] = []
    for ratio in ratios:
        finite = ratio is not None and np.isfinite(ratio)
        out.append(bool(low <= ratio <= high) if finite else None)  # type: ignore[operator]
    return out


def rank_histogram_reliability(counts: Sequence[int]) -> dict[str, float | int | str | None]:
    """The reliability numbers of one rank histogram's M + 1 counts (see the module docstring); every number
    None for an empty histogram."""
    values = np.asarray(counts, dtype=np.float64)
    bins = values.size
    total = float(values.sum())
    if bins < 2 or total <= 0:
        return {"reliability_index": None, "chi_square": None, "degrees_of_freedom": bins - 1, "slope": None,
                "shape": None}  # fmt: skip
    flat = 1.0 / bins
    shares = values / total
    reliability_index = float(np.abs(shares - flat).sum())
    expected = total * flat
    chi_square = float(((values - expected) ** 2 / expected).sum())
    place = np.arange(bins) / (bins - 1)
    relative = shares / flat
    slope = float(np.polyfit(place, relative, 1)[0])
    if reliability_index < FLAT_RELIABILITY_INDEX:
        shape = "flat"
    else:
        middle = shares[1:-1].mean() if bins > 2 else flat
        ends = (shares[0] + shares[-1]) / 2 - middle
        shape = "sloped" if abs(slope) / 2 > abs(ends) / flat else ("U" if ends > 0 else "dome")
    return {"reliability_index": reliability_index, "chi_square": chi_square, "degrees_of_freedom": bins - 1,
            "slope": slope, "shape": shape}  # fmt: skip
