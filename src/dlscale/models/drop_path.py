"""Stochastic depth (drop path) and its schedule over a model's blocks: one piece for the ViT's blocks and the
SFNO's, which both drop a residual branch per sample."""

from __future__ import annotations

import torch
from torch import nn


def drop_path_rates(max_rate: float, depth: int) -> list[float]:
    """Stochastic-depth schedule: the rate grows linearly from 0 (first block) to `max_rate` (last)."""
    if depth == 1:
        return [0.0]
    return [max_rate * i / (depth - 1) for i in range(depth)]


class DropPath(nn.Module):
    """Stochastic depth: in training, zero a residual branch for a random subset of samples.

    Surviving samples are scaled by 1 / (1 - rate) so the expected output is unchanged; in eval this is
    the identity.
    """

    def __init__(self, rate: float):
        super().__init__()
        self.rate = rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rate == 0.0 or not self.training:
            return x
        keep = 1.0 - self.rate
        # One draw per sample, broadcast over every other dimension.
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask / keep

    def extra_repr(self) -> str:
        return f"rate={self.rate:g}"
