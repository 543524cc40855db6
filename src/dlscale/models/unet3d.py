"""The 3D U-Net of the sc21/sc22 "Deep Learning at Scale" tutorial: dark-matter volumes in, gas volumes out.

Down path: ``levels`` convolutions Conv3d(kernel 4, stride 2, padding 1) + LeakyReLU(0.01), each halving the
volume, with widths c, 2c, 4c, 8c, 8c (and 8c at the sixth level, ``full_scale``), c = ``base_channels`` (64 in
the tutorial: 4 -> 64 -> 128 -> 256 -> 512 -> 512 -> 512). Up path: ConvTranspose3d(kernel 4, stride 2,
padding 1) + ReLU, each doubling the volume, whose output is concatenated with the down path's feature map of
the same size; a last ConvTranspose3d to the output channels, then tanh. No normalization layers, no buffers.
Weights are drawn from N(0, ``conv_scale``), biases set to ``conv_bias`` (0.02 and 0 in the tutorial).
With ``channels_last`` weights and activations are stored channels-last (NDHWC): the same math in another
layout. The default is the tutorial's NCDHW, which trained faster on a CPU at the tutorial's size
(``benchmarks/unet_memory_layout.py``: channels-last at 0.58x); a GPU is not yet measured.

Parameters: 116,977,029 with full_scale, 66,644,357 without (c = 64, 4 in, 5 out channels).
The crop edge must be divisible by 2^levels (64 with full_scale, 32 without), so every level halves exactly.
"""

from __future__ import annotations

import torch
from torch import nn

from dlscale.models.unet3d_config import UNetConfig

_KERNEL, _STRIDE, _PADDING = 4, 2, 1


def size_problem(cfg: UNetConfig, data_size: int) -> str | None:
    """Why a ``data_size``^3 crop does not fit this U-Net, or None when it does."""
    multiple = 2**cfg.levels
    if data_size % multiple == 0:
        return None
    smaller, larger = data_size // multiple * multiple, (data_size // multiple + 1) * multiple
    choices = f"{larger}" if smaller == 0 else f"{smaller} or {larger}"
    return (
        f"data_size {data_size} is not divisible by 2^{cfg.levels} = {multiple}: the U-Net has {cfg.levels} "
        f"levels (full_scale {cfg.full_scale}), each halving the crop, and the up path must retrace them "
        f"exactly; use data_size {choices}"
        + ("" if not cfg.full_scale else ", or full_scale: false (5 levels, multiples of 32)")
    )


def _down(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv3d(in_channels, out_channels, _KERNEL, _STRIDE, _PADDING), nn.LeakyReLU(0.01, inplace=True)
    )


def _up(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(
        nn.ConvTranspose3d(in_channels, out_channels, _KERNEL, _STRIDE, _PADDING), nn.ReLU(inplace=True)
    )


class UNet3D(nn.Module):
    """(B, in_channels, D, D, D) -> (B, out_channels, D, D, D) in [-1, 1]; see the module docstring."""

    def __init__(self, cfg: UNetConfig, in_channels: int = 4, out_channels: int = 5):
        super().__init__()
        self.cfg = cfg
        widths = cfg.widths()
        self.down = nn.ModuleList()
        previous = in_channels
        for width in widths:
            self.down.append(_down(previous, width))
            previous = width
        # The up convolution at `level` brings the volume back to the size of level - 1. Its input has
        # widths[level] channels from below, plus the down path's map of `level` concatenated (except at the
        # bottom, which has no partner).
        self.up = nn.ModuleList()
        bottom = len(widths) - 1
        for level in range(bottom, 0, -1):
            skip = 0 if level == bottom else widths[level]
            self.up.append(_up(widths[level] + skip, widths[level - 1]))
        self.conv_last = nn.ConvTranspose3d(2 * widths[0], out_channels, _KERNEL, _STRIDE, _PADDING)
        self.reset_parameters()
        if cfg.channels_last:
            self.to(memory_format=torch.channels_last_3d)

    def reset_parameters(self) -> None:
        """The tutorial's initialization: conv weights ~ N(0, conv_scale), biases = conv_bias."""
        init = self.cfg.weight_init
        for module in self.modules():
            if isinstance(module, (nn.Conv3d, nn.ConvTranspose3d)):
                nn.init.normal_(module.weight, 0.0, float(init["conv_scale"]))
                nn.init.constant_(module.bias, float(init["conv_bias"]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cfg.channels_last:
            x = x.contiguous(memory_format=torch.channels_last_3d)  # the layout the weights are in
        skips = []
        for level in self.down:
            x = level(x)
            skips.append(x)
        x = skips.pop()  # the bottom: no partner to concatenate
        for number, level in enumerate(self.up):
            if number > 0:
                x = torch.cat([x, skips.pop()], dim=1)
            x = level(x)
        x = torch.cat([x, skips.pop()], dim=1)
        return torch.tanh(self.conv_last(x))


def unet_flops_per_sample(
    cfg: UNetConfig, data_size: int, in_channels: int = 4, out_channels: int = 5
) -> int:
    """Forward FLOPs of one sample: 2 x multiply-adds of every (transposed) convolution, k^3 = 64 taps each.

    A convolution's multiply-adds are (output voxels) x C_out x C_in x 64; a transposed one's are
    (input voxels) x C_in x C_out x 64. Biases and activations are left out (under 0.1 %).
    """
    taps = _KERNEL**3
    widths = cfg.widths()
    total, previous, side = 0, in_channels, data_size
    sides = []
    for width in widths:
        side //= 2
        sides.append(side)
        total += side**3 * width * previous * taps
        previous = width
    arriving = widths[-1]
    for level in range(len(widths) - 1, 0, -1):
        skip = 0 if level == len(widths) - 1 else widths[level]
        total += sides[level] ** 3 * (arriving + skip) * widths[level - 1] * taps
        arriving = widths[level - 1]
    total += sides[0] ** 3 * 2 * widths[0] * out_channels * taps
    return 2 * total
