"""Loss and metric math for gridded fields (relative L2 loss, latitude-weighted RMSE), and their running sums.

Metrics are accumulated as *per-sample* sums and counts, never as means of batch means, so they do not depend
on the batch size, on a short last batch, or on how samples are split over ranks (sums add up exactly).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch


def relative_l2_per_sample(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """||prediction - target|| / ||target|| over all of a sample's values; shape (B,)."""
    difference = (prediction - target).flatten(1).float()
    return difference.norm(dim=1) / target.flatten(1).float().norm(dim=1)


def relative_l2_loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The tutorials' training loss: the batch mean of the per-sample relative L2 error."""
    return relative_l2_per_sample(prediction, target).mean()


def latitude_weights(
    latitudes_deg: np.ndarray | torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Area weights cos(latitude) for each grid row, scaled to average 1 (rows at the poles weigh 0), computed
    in float64 and given in ``dtype``."""
    weights = torch.cos(torch.deg2rad(torch.as_tensor(latitudes_deg, dtype=torch.float64)))
    return (weights / weights.mean()).to(dtype)


def weighted_rmse_per_sample(
    prediction: torch.Tensor, target: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """Latitude-weighted RMSE of each sample and channel over the grid; shape (B, C).

    ``weights`` has one entry per row (H,) and averages 1, so a uniform error e gives RMSE e.
    """
    squared = (prediction.float() - target.float()) ** 2
    return torch.sqrt((squared * weights.to(squared.device).view(1, 1, -1, 1)).mean(dim=(-2, -1)))


class MetricSums:
    """Running per-sample sums of named metrics (each a scalar or a vector per sample)."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.count = 0

    def add(self, batch_size: int, **per_sample: torch.Tensor) -> None:
        """Add a batch: each value has the batch as its first dimension."""
        for name, values in per_sample.items():
            total = values.detach().double().sum(dim=0)
            current = self.sums.get(name)
            self.sums[name] = total if current is None else current.to(total.device) + total
        self.count += batch_size

    def sum_across_ranks(self, sum_: Callable[[torch.Tensor], None], device: torch.device) -> None:
        """Turn this rank's sums into the sums over all ranks, with ``sum_`` an in-place all-reduce.

        Every rank must hold the same names with the same shapes, also a rank that evaluated no sample: an
        evaluator declares its metrics up front with :meth:`declare`. The sums move to ``device`` first
        (NCCL reduces GPU tensors only).
        """
        for name in sorted(self.sums):
            total = self.sums[name].to(device)
            sum_(total)
            self.sums[name] = total
        count = torch.tensor([float(self.count)], dtype=torch.float64, device=device)
        sum_(count)
        self.count = int(count.item())

    def declare(self, device: torch.device | str = "cpu", **shapes: tuple[int, ...]) -> MetricSums:
        """Start each named sum at zero with its per-sample shape (so that empty ranks can join a reduction)."""
        for name, shape in shapes.items():
            self.sums[name] = torch.zeros(shape, dtype=torch.float64, device=device)
        return self

    def mean(self, name: str) -> torch.Tensor:
        """The mean over all samples added so far."""
        if self.count == 0:
            raise ValueError("no samples were evaluated")
        return (self.sums[name] / self.count).cpu()
