"""The normalization statistics of an ERA5 data set, gathered block by block while the years stream past.

``global_means.npy`` and ``global_stds.npy`` (1, C, 1, 1) are each channel's mean and standard deviation over
every time step and grid point of the training years; ``time_means.npy`` (1, C, H, W) is the mean field of the
training years, the climatology that anomaly scores (ACC) subtract. A year of 0.25 degree data does not fit in
memory, so the statistics are merged from blocks: each block's mean and sum of squared deviations are taken in
float64 in two passes over the block, and blocks are merged with Chan et al.'s pairwise update. Unlike a
running sum of squares (``E[x^2] - E[x]^2``), this loses no digits when the mean is large next to the spread
(surface pressure: mean 1e5 Pa, spread 1e3 Pa). Values that are NaN (kept with ``--allow-nan``) are left out of
every statistic, so each channel and grid point counts its own finite values.
"""

from __future__ import annotations

import numpy as np

# float64 working memory per update step: blocks are converted a few time steps at a time
_FLOAT64_BYTES_PER_PASS = 64 * 2**20


class StreamingChannelStats:
    """Per-channel mean and variance and the per-point time mean of (time, channel, lat, lon) blocks."""

    def __init__(self, channels: int, height: int, width: int):
        self.count = np.zeros(channels, dtype=np.int64)
        self.mean = np.zeros(channels, dtype=np.float64)
        self.squared_deviations = np.zeros(channels, dtype=np.float64)
        self.time_sum = np.zeros((channels, height, width), dtype=np.float64)
        self.time_count = np.zeros((channels, height, width), dtype=np.int64)

    def update(self, block: np.ndarray, finite: bool = False) -> None:
        """Add a block of shape (T, C, H, W); ``finite``: the caller checked that it holds no NaN or inf."""
        per_step = max(block[0].size * 8, 1)
        steps_per_pass = max(1, _FLOAT64_BYTES_PER_PASS // per_step)
        for start in range(0, block.shape[0], steps_per_pass):
            self._update_part(block[start : start + steps_per_pass].astype(np.float64), finite)

    def _update_part(self, part: np.ndarray, known_finite: bool) -> None:
        finite = None if known_finite else np.isfinite(part)
        has_gaps = finite is not None and not finite.all()
        if has_gaps:
            part = np.where(finite, part, 0.0)
            count = finite.sum(axis=(0, 2, 3))
            self.time_count += finite.sum(axis=0)
        else:
            count = np.full(part.shape[1], part.shape[0] * part.shape[2] * part.shape[3], dtype=np.int64)
            self.time_count += part.shape[0]
        step_sum = part.sum(axis=0)
        self.time_sum += step_sum
        with np.errstate(invalid="ignore", divide="ignore"):
            part_mean = np.where(count > 0, step_sum.sum(axis=(1, 2)) / count, 0.0)
        # ``part`` is this update's own float64 copy: the deviations and their squares overwrite it
        deviations = np.subtract(part, part_mean[None, :, None, None], out=part)
        if has_gaps:
            deviations[~finite] = 0.0
        part_squared = np.square(deviations, out=deviations).sum(axis=(0, 2, 3))
        total = self.count + count
        with np.errstate(invalid="ignore", divide="ignore"):
            delta = part_mean - self.mean
            weight = np.where(total > 0, count / np.maximum(total, 1), 0.0)
            self.mean = self.mean + delta * weight
            self.squared_deviations = self.squared_deviations + part_squared + delta**2 * self.count * weight
        self.count = total

    def means(self) -> np.ndarray:
        """(1, C, 1, 1) float32."""
        return self.mean.reshape(1, -1, 1, 1).astype(np.float32)

    def stds(self) -> np.ndarray:
        """(1, C, 1, 1) float32: the population standard deviation (divided by the count, as numpy's std)."""
        variance = self.squared_deviations / np.maximum(self.count, 1)
        return np.sqrt(variance).reshape(1, -1, 1, 1).astype(np.float32)

    def time_means(self) -> np.ndarray:
        """(1, C, H, W) float32; NaN where a grid point had no finite value in any step."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return (self.time_sum / self.time_count)[None].astype(np.float32)
