"""How sure a throughput comparison is: confidence intervals of repeated trials, not one mean against another.

Trials of the same config scatter by a few percent on a quiet GPU node and by tens of percent on a shared CPU,
so "B's mean is higher than A's" says little. Two statistics answer better:

* the interval of one config's mean samples/s: mean +- t * s / sqrt(n), with s the trials' sample standard
  deviation and t Student's 97.5 % quantile for n - 1 degrees of freedom (a 95 % interval);
* the interval of the ratio of two throughputs (the bench's loader at 30,000 samples/s against a model step at
  160, or a candidate's speed-up over an incumbent): Welch's interval of the difference of the mean
  *logarithms* (the two may scatter differently), exponentiated (:func:`ratio_interval`). Throughput noise is
  multiplicative (a disturbed trial runs at a fraction of the speed), and an interval on the linear scale of
  two trials 20 % apart reaches below zero, where no rate lies ("0.17x (95% CI -0.15x-0.48x)"); on the
  logarithms it is never negative. :func:`compare_throughputs` judges a speed-up on that same interval.

A change counts as **faster** only when the whole interval of its speed-up lies above 1 and its estimate gains
at least ``min_gain`` (a 1 % gain is real sometimes but not worth a knob); **slower** when the whole interval
lies below 1; otherwise the trials cannot tell (**within noise**), and more trials might.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

# Student's t, 97.5 % quantile (two-sided 95 %), for 1..30 degrees of freedom.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
_Z975 = 1.959964

Outcome = Literal["faster", "slower", "within noise"]


def t_quantile_975(degrees_of_freedom: float) -> float:
    """Student's t 97.5 % quantile; a fractional df (Welch's) is rounded down, which widens the interval."""
    if not degrees_of_freedom >= 1:
        return math.inf  # one trial says nothing about the scatter
    df = math.floor(degrees_of_freedom)
    if df <= len(_T975):
        return _T975[df - 1]
    # Beyond the table: the normal quantile plus the first two terms of the Cornish-Fisher expansion in 1/df
    # (error < 0.001 from df 31 on; the first term alone is 0.003 short at df 31).
    z = _Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def _mean_and_variance(values: Sequence[float]) -> tuple[float, float]:
    """Mean and unbiased sample variance (nan for one value)."""
    n = len(values)
    if n == 0:
        raise ValueError("no trials")
    mean = statistics.fmean(values)
    # Not statistics.variance: it raises AttributeError on a NaN or inf (Python 3.10, 3.11), where this is NaN.
    variance = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else math.nan
    return mean, variance


@dataclass(frozen=True)
class MeanInterval:
    """A 95 % confidence interval of the mean of repeated trials."""

    mean: float
    low: float
    high: float
    trials: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def describe(self, unit: str = "samples/s") -> str:
        """'123.4 +- 2.1 samples/s (95% CI, 3 trials)'; without a unit (a table's column names it),
        '123.4 +- 2.1 (95% CI, 3 trials)'."""
        unit = f" {unit}" if unit else ""
        if not math.isfinite(self.half_width):
            return f"{self.mean:.1f}{unit} (1 trial: no interval)"
        return f"{self.mean:.1f} +- {self.half_width:.1f}{unit} (95% CI, {self.trials} trials)"


def mean_interval(values: Sequence[float]) -> MeanInterval:
    """The mean of ``values`` and its 95 % interval (infinite with one value)."""
    mean, variance = _mean_and_variance(values)
    if len(values) < 2:
        return MeanInterval(mean, -math.inf, math.inf, len(values))
    half = t_quantile_975(len(values) - 1) * math.sqrt(variance / len(values))
    return MeanInterval(mean, mean - half, mean + half, len(values))


@dataclass(frozen=True)
class SpeedComparison:
    """A candidate's speed-up over an incumbent: the ratio of their typical throughputs (geometric means of their
    trials) and its 95 % interval, both :func:`ratio_interval`'s."""

    ratio: float
    low: float
    high: float
    outcome: Outcome
    min_gain: float

    @property
    def could_gain(self) -> bool:
        """Within noise, but the estimate alone would be a worthwhile gain: more trials could confirm it."""
        return (
            self.outcome == "within noise" and self.ratio >= 1 + self.min_gain and self.low <= 1 < self.high
        )

    def describe(self) -> str:
        """'1.32x (95% CI 1.25x-1.40x): faster'; '0.17x (95% CI 0.061x-0.48x): slower'."""
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            interval = "no interval: too few trials"
        else:
            interval = f"95% CI {_times(self.low)}-{_times(self.high)}"
        text = f"{_times(self.ratio)} ({interval}): {self.outcome}"
        if self.outcome == "within noise" and self.low > 1:
            text += f" (a gain below the {self.min_gain:.0%} worth keeping)"
        return text

    def to_json(self) -> dict[str, object]:
        return {"ratio": self.ratio, "low": self.low, "high": self.high, "outcome": self.outcome}


def _times(ratio: float) -> str:
    """'1.32x'; below 0.1 two significant digits ('0.061x'), so a small bound does not print as 0.00x."""
    return f"{ratio:.2f}x" if ratio >= 0.1 else f"{ratio:.2g}x"


@dataclass(frozen=True)
class RatioInterval:
    """A 95 % interval of the ratio of two tests' typical throughputs (geometric means of their trials)."""

    ratio: float
    low: float
    high: float

    def describe(self) -> str:
        """'0.0053 (95% CI 0.0019 to 0.0097)', or '1.05 (no interval: one trial)'."""
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            return f"{self.ratio:.3g} (no interval: one trial)"
        return f"{self.ratio:.3g} (95% CI {self.low:.3g} to {self.high:.3g})"


def _welch_half_width(var_a: float, n_a: int, var_b: float, n_b: int) -> float:
    """The 95 % half-width of the difference of two means with unequal variances (Welch-Satterthwaite)."""
    se_a, se_b = var_a / n_a, var_b / n_b
    if se_a + se_b == 0:
        return 0.0  # identical trials (a fake clock): the means are exact
    df = (se_a + se_b) ** 2 / (se_a**2 / (n_a - 1) + se_b**2 / (n_b - 1))
    return t_quantile_975(df) * math.sqrt(se_a + se_b)


def ratio_interval(numerator: Sequence[float], denominator: Sequence[float]) -> RatioInterval:
    """How many times ``numerator``'s throughput is ``denominator``'s, with its 95 % interval (both > 0): on
    the logarithms of the trials, so the interval is never negative and fits multiplicative noise."""
    if min(numerator, default=1.0) <= 0 or min(denominator, default=1.0) <= 0:
        raise ValueError("throughputs must be > 0 to compare their ratio")
    logs_n, logs_d = [math.log(v) for v in numerator], [math.log(v) for v in denominator]
    mean_n, var_n = _mean_and_variance(logs_n)
    mean_d, var_d = _mean_and_variance(logs_d)
    ratio = math.exp(mean_n - mean_d)
    if len(logs_n) < 2 or len(logs_d) < 2:
        return RatioInterval(ratio, 0.0, math.inf)
    half = _welch_half_width(var_n, len(logs_n), var_d, len(logs_d))
    return RatioInterval(ratio, math.exp(mean_n - mean_d - half), math.exp(mean_n - mean_d + half))


def compare_throughputs(
    candidate: Sequence[float], incumbent: Sequence[float], min_gain: float = 0.02
) -> SpeedComparison:
    """Whether ``candidate``'s trials (samples/s) are faster than ``incumbent``'s beyond their noise, judged on
    :func:`ratio_interval` of the two: the verdict and the interval it prints are one computation."""
    interval = ratio_interval(candidate, incumbent)
    if interval.low > 1 and interval.ratio >= 1 + min_gain:
        outcome: Outcome = "faster"
    elif interval.high < 1:
        outcome = "slower"
    else:
        outcome = "within noise"
    return SpeedComparison(interval.ratio, interval.low, interval.high, outcome, min_gain)
