"""WeatherBench2's smoothing of a climatology over days of the year (``compute_rolling_stat`` in
``weatherbench2/utils.py``): a centred window of ``size`` days (61 by default) with triangular weights, around
the year's 366 days as a circle, the weighted mean taken over the window's days and the years at once. This is
WeatherBench2's number on whole years with a leap year among them; on partial years WeatherBench2's code differs
and dlscale keeps its own circle (below, and docs/after-training.md, "The climatology").

For one hour of day, with ``x[y, d]`` the state of year ``y`` on day of year ``d`` (missing: NaN), WeatherBench2
stacks the years on a 366-day axis, fills a year's missing day 366 with its day 365, pads the axis by half the
window on each side with wrap-around (so day 1's window reaches back to days 337..366), and takes

    clim[d] = sum_{k, y} w_k x[y, d + k] / sum_{k, y: x[y, d + k] present} w_k,   k = -half .. half

(xarray's weighted mean, which skips missing values), then cuts the padding off. A day whose window holds no
value at all stays NaN. That is what WeatherBench2 does when every year has every day (up to day 365). Its code
stacks only the days of year the data holds and fills every missing day of a year from that year's day 365: on
partial years its window wraps between the first and last days present, and years that all end before day 365
stop it with a KeyError. dlscale keeps all 366 days as the circle and fills only day 366, so a partial year's
missing days stay missing (NaN where the window holds no state).

The same number comes from two sums over years, ``S[d] = sum_y x[y, d]`` and ``N[d]`` = the count of years with
a value: ``clim[d] = sum_k w_k S[d + k] / sum_k w_k N[d + k]``, which is how dlscale streams it (years are
added one at a time; :mod:`dlscale.data.era5.climatology.computing`).

The triangular weights are two box windows of ``half`` days convolved, so each windowed sum is two running sums
(cumulative sums, float64), a few passes over the array however wide the window, instead of one per day of it.
"""

from __future__ import annotations

import numpy as np

DEFAULT_WINDOW_DAYS = 61  # WeatherBench2's window_size


def window_weights(size: int) -> np.ndarray:
    """WeatherBench2's ``create_window_weights``: ``size`` (odd, >= 3) weights rising linearly from 0 at the
    window's first day to the centre and back to 0 at its last, scaled to average 1."""
    if size < 3 or size % 2 == 0:
        raise ValueError(f"a climatology's window must be an odd number of days >= 3, got {size}")
    half = size // 2
    weights = np.concatenate([np.linspace(0.0, 1.0, half + 1), np.linspace(1.0, 0.0, half + 1)[1:]])
    return weights / weights.mean()


def circular_window_sum(values: np.ndarray, size: int, axis: int = 0) -> np.ndarray:
    """``sum_k w_k values[(d + k) mod n]`` along ``axis`` (length n) for every d, with ``w`` the
    :func:`window_weights` of ``size`` and k from -size//2 to size//2: the window's weighted sum around a circle.
    float64; ``values`` must be finite."""
    weights = window_weights(size)
    half = size // 2
    values = np.asarray(values, dtype=np.float64)
    n = values.shape[axis]
    # Unscaled, the weights are (half - |k|) / half: the convolution of two boxes of `half` ones, over `half`.
    # padded[i] = values[(i - half) mod n]
    padded = np.take(values, np.arange(-half, n + half) % n, axis=axis)
    box = _running_sums(padded, half, axis)  # box[i] = sum_{j < half} padded[i + j]
    del padded
    triangle = _running_sums(box, half, axis)  # triangle[d + 1] = sum_k (half - |k|) values[d + k]
    del box
    # weights[half], the centre's weight, is the scale from (half - |k|) / half to the weights (mean 1).
    centre = _along(axis, slice(1, n + 1), values.ndim)
    return triangle[centre] * (weights[half] / half)


def windowed_mean(sums: np.ndarray, counts: np.ndarray, size: int, axis: int = 0) -> np.ndarray:
    """The climatology from the sums over years: ``sum_k w_k sums[d + k] / sum_k w_k counts[d + k]`` around the
    circle of ``axis`` (the days), NaN where the window holds no value (the counts' windowed sum is 0)."""
    numerator = circular_window_sum(sums, size, axis)
    denominator = circular_window_sum(counts, size, axis)
    # The counts are whole numbers and their windowed sums exact multiples of the smallest weight: 0 only when
    # the window holds nothing.
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, numerator / np.where(denominator > 0, denominator, 1.0), np.nan)


def _running_sums(values: np.ndarray, width: int, axis: int) -> np.ndarray:
    """``out[i] = sum_{j < width} values[i + j]`` along ``axis`` (of length ``values``' minus ``width`` plus 1)."""
    cumulative = _cumulative_sum(values, axis)
    ndim = values.ndim
    out = cumulative[_along(axis, slice(width - 1, None), ndim)].copy()
    out[_along(axis, slice(1, None), ndim)] -= cumulative[_along(axis, slice(None, -width), ndim)]
    return out


def _cumulative_sum(values: np.ndarray, axis: int) -> np.ndarray:
    """``np.cumsum`` along ``axis``, one whole slice added at a time (numpy's own runs along each column
    separately, several times slower on the (days, hours, rows, columns) arrays here)."""
    moved = np.moveaxis(values, axis, 0)
    rows = moved.reshape(moved.shape[0], -1)  # (n, everything else): each row one slice
    out = np.empty(rows.shape, dtype=np.float64)
    out[0] = rows[0]
    for index in range(1, rows.shape[0]):
        np.add(out[index - 1], rows[index], out=out[index])
    return np.moveaxis(out.reshape(moved.shape), 0, axis)


def _along(axis: int, index: slice, ndim: int) -> tuple[slice, ...]:
    """The index tuple that applies ``index`` along ``axis`` and takes everything of the other axes."""
    return tuple(index if dim == axis % ndim else slice(None) for dim in range(ndim))
