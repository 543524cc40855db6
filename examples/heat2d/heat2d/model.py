"""The surrogate: a small residual CNN that steps the temperature one frame ahead, ``u + f([u, kappa])``.

Why this shape:

* Residual: over one frame the field changes by a few percent, so the network predicts the increment. Its last
  convolution starts at zero, which makes the untrained model exactly the "persistence" baseline
  (``u_{k+1} = u_k``) that training then improves on.
* Circular padding: the domain is periodic, so every cell sees the same stencil and the model commutes with
  periodic shifts, like the equation itself. It is fully convolutional, so it runs on any grid size.
* Local: diffusion over one frame moves heat a cell or two; ``depth`` convolutions of size ``k`` see
  ``depth * (k - 1) + 1`` cells across, ample for that.
* No normalization or dropout layers: batch statistics differ between data-parallel ranks, and dlscale checks
  that two ranks train exactly like one. Plain convolutions and GELU also compile, autocast and shard as they are.
"""

from __future__ import annotations

import torch
from torch import nn

from heat2d.config import Heat2DModelConfig

IN_CHANNELS = 2  # u_k and kappa


def periodic_conv(in_channels: int, out_channels: int, kernel_size: int) -> nn.Conv2d:
    return nn.Conv2d(
        in_channels, out_channels, kernel_size, padding=kernel_size // 2, padding_mode="circular"
    )


class HeatSurrogate(nn.Module):
    """``(B, 2, N, N)`` [u_k, kappa] -> ``(B, 1, N, N)`` u_{k+1}, all normalized."""

    def __init__(self, cfg: Heat2DModelConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = IN_CHANNELS
        for _ in range(cfg.depth - 1):
            layers += [periodic_conv(channels, cfg.width, cfg.kernel_size), nn.GELU()]
            channels = cfg.width
        self.body = nn.Sequential(*layers)
        self.increment = periodic_conv(channels, 1, cfg.kernel_size)
        nn.init.zeros_(self.increment.weight)
        nn.init.zeros_(self.increment.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :1] + self.increment(self.body(x))
