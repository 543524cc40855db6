"""The spherical Fourier neural operator (SFNO): a spectral convolution on the sphere, its block, and a token mixer.

SFNO (Bonev et al., "Spherical Fourier Neural Operators: Learning Stable Dynamics on the Sphere", ICML 2023,
arXiv 2306.03838) replaces the FFT of FNO/AFNO by the spherical harmonic transform
(:mod:`dlscale.models.spherical_harmonics`): a field is mixed as ISHT(K . SHT(x)), so the operator has no seam
at the dateline or the poles. Its convolution is the Driscoll-Healy one: a convolution on the sphere with a
zonal (rotation-symmetric) kernel multiplies a_l^m by one number per degree l, the same for every order m; with
channels, K is one complex channel-mixing matrix per degree (:class:`SpectralConvS2`). Because K does not depend
on m, the mixing commutes with rotations about the pole: a field shifted in longitude gives the same output
shifted (exactly, on the grid, for whole columns).

Three modules:

- :class:`SpectralConvS2` (B, C, nlat, nlon) -> same: SHT, per-degree weights, inverse SHT, in float32;
- :class:`SFNOBlock` (B, C, nlat, nlon) -> same: the SFNO network's block, in the order of the reference
  implementations (NVIDIA/makani's ``NeuralOperatorBlock`` as its SFNO uses it: inner skip none, outer skip
  linear; the same in torch-harmonics' example SFNO with an identity outer skip):
  x -> filter -> norm -> GELU -> MLP (1x1, GELU, 1x1) -> norm -> drop path -> + linear(x);
- :class:`SFNOMixer` (B, h, w, D) -> same: the spectral convolution as a ViT's token mixer on the grid of
  patch tokens, built from the patch centres' latitudes, plus its own input (as AFNO's filter adds its input,
  :class:`dlscale.models.afno.AFNO2D`), so it drops into the AFNO block of :mod:`dlscale.models.vit`.

Weights are real tensors with a last axis [real, imaginary] (complex parameters are awkward for DDP/FSDP2
and optimizers), drawn as the references do: each complex weight N(0, gain / fan_in) (half of it in each
part), with gain 2 before a GELU and halved for each identity skip around it.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from dlscale.errors import InvalidValue
from dlscale.models.drop_path import DropPath
from dlscale.models.spherical_harmonics import (
    InverseSphericalHarmonicTransform,
    SphericalHarmonicTransform,
    default_truncation,
    sht_flops,
)


class SpectralConvS2(nn.Module):
    """ISHT(K . SHT(x)) on (B, C, nlat, nlon) fields: y_o(l, m) = sum_i K_oi(l) x_i(l, m), one complex matrix
    per degree l shared over the orders m (Driscoll-Healy), block-diagonal over ``num_blocks`` channel
    groups. ``weight``: (num_blocks, C / num_blocks in, C / num_blocks out, lmax, 2 [real, imaginary]).

    The transforms, and the channel mixing between them, run in float32 under autocast too (the mixing sums
    over channels coefficients that span orders of magnitude); the output has the input's dtype.
    """

    def __init__(
        self,
        sht: SphericalHarmonicTransform,
        isht: InverseSphericalHarmonicTransform,
        channels: int,
        num_blocks: int = 1,
        gain: float = 2.0,
        key: str = "num_blocks",
    ):
        super().__init__()
        if (sht.lmax, sht.mmax, sht.nlat) != (isht.lmax, isht.mmax, isht.nlat):
            raise ValueError("the forward and inverse transforms must share the grid and the truncation")
        if num_blocks < 1 or channels % num_blocks:
            raise InvalidValue(key, f"{num_blocks} blocks do not divide the {channels} channels")
        self.sht, self.isht = sht, isht
        self.channels, self.num_blocks = channels, num_blocks
        self.block_size = channels // num_blocks
        self.gain = gain
        self.weight = nn.Parameter(torch.empty(num_blocks, self.block_size, self.block_size, sht.lmax, 2))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Each complex weight N(0, gain / fan_in): its real and imaginary parts N(0, gain / (2 fan_in))."""
        nn.init.normal_(self.weight, std=math.sqrt(self.gain / (2 * self.block_size)))

    def extra_repr(self) -> str:
        return f"channels={self.channels}, num_blocks={self.num_blocks}, lmax={self.sht.lmax}, mmax={self.sht.mmax}"

    def mix(self, coefficients: torch.Tensor) -> torch.Tensor:
        """(B, C, lmax, mmax) complex coefficients -> the same after the per-degree channel mixing."""
        batch, _, lmax, mmax = coefficients.shape
        parts = torch.view_as_real(coefficients).reshape(
            batch, self.num_blocks, self.block_size, lmax, mmax, 2
        )
        # (a + ib)(c + id) = (ac - bd) + i(ad + bc) as one real matmul per block and degree:
        # [a | b] times [[c, d], [-d, c]] is [real | imaginary].
        stacked_input = torch.cat((parts[..., 0], parts[..., 1]), dim=2)  # (B, g, 2 block, lmax, mmax)
        real, imag = self.weight[..., 0], self.weight[..., 1]  # (g, in, out, lmax)
        matrix = torch.cat((torch.cat((real, imag), dim=2), torch.cat((-imag, real), dim=2)), dim=1)
        out = torch.einsum("bgilm,giol->bgolm", stacked_input, matrix)
        out_real, out_imag = out.split(self.block_size, dim=2)
        mixed = torch.complex(out_real, out_imag)
        return mixed.reshape(batch, self.channels, lmax, mmax)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        with torch.autocast(device_type=x.device.type, enabled=False):
            mixed = self.isht(self.mix(self.sht(x.float())))
        return mixed.to(dtype)


class PointwiseMlp(nn.Module):
    """fc1 (1x1), GELU, dropout, fc2 (1x1, no bias), on (B, C, nlat, nlon): the same at every grid point."""

    def __init__(self, channels: int, hidden: int, dropout: float, output_gain: float):
        super().__init__()
        self.fc1 = nn.Conv2d(channels, hidden, 1)
        self.act = nn.GELU()
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Conv2d(hidden, channels, 1, bias=False)
        nn.init.normal_(self.fc1.weight, std=math.sqrt(2.0 / channels))
        nn.init.zeros_(self.fc1.bias)
        nn.init.normal_(self.fc2.weight, std=math.sqrt(output_gain / hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class SFNOBlock(nn.Module):
    """The SFNO block on (B, C, nlat, nlon) fields (module docstring):

        h = norm1(mlp(GELU(norm0(filter(x)))));  out = drop_path(h) + skip(x)

    with ``filter`` a :class:`SpectralConvS2`, ``norm0``/``norm1`` instance norms (affine; per channel over
    the grid, the reference's default; ``normalization="none"`` leaves them out) and ``skip`` a 1x1 linear
    layer. Every part but the filter acts on each grid point alike (the instance norm's statistics are means
    over the whole grid), so the block commutes with a shift in longitude.
    """

    def __init__(
        self,
        sht: SphericalHarmonicTransform,
        isht: InverseSphericalHarmonicTransform,
        channels: int,
        mlp_ratio: float = 2.0,
        num_blocks: int = 1,
        drop_path_rate: float = 0.0,
        dropout: float = 0.0,
        normalization: str = "instance_norm",
    ):
        super().__init__()

        if normalization not in ("instance_norm", "none"):
            raise InvalidValue("normalization", f"{normalization!r} is not one of instance_norm, none")
        self.filter = SpectralConvS2(sht, isht, channels, num_blocks, gain=2.0)  # a GELU follows
        self.norm0 = self._norm(channels, normalization)
        self.act = nn.GELU()
        # The linear outer skip halves the MLP output's gain; the skip gets the other half.
        self.mlp = PointwiseMlp(channels, int(channels * mlp_ratio), dropout, output_gain=0.5)
        self.norm1 = self._norm(channels, normalization)
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate > 0 else nn.Identity()
        self.skip = nn.Conv2d(channels, channels, 1, bias=False)
        nn.init.normal_(self.skip.weight, std=math.sqrt(0.5 / channels))

    @staticmethod
    def _norm(channels: int, normalization: str) -> nn.Module:
        if normalization == "none":
            return nn.Identity()
        return nn.InstanceNorm2d(channels, eps=1e-6, affine=True, track_running_stats=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mixed = self.norm1(self.mlp(self.act(self.norm0(self.filter(x)))))
        return self.drop_path(mixed) + self.skip(x)


class SFNOMixer(nn.Module):
    """The SFNO spectral convolution as a token mixer: (B, h, w, D) tokens of a grid whose rows lie at
    ``lats_deg`` (the patch centres' latitudes, degrees) and whose ``nlon`` = w columns go once round the
    globe -> the same shape and dtype: SpectralConvS2(x) + x, the filter plus its own input like AFNO's.

    ``lmax``/``mmax`` default to what the token grid integrates exactly (h rows: (h - 1) // 2 + 1 degrees);
    a grid the transform cannot integrate is refused with an :class:`InvalidValue` naming ``key`` and the
    latitudes. The filter's init gain is 1 / 2 (no activation follows, the identity skip halves it).
    """

    def __init__(
        self,
        lats_deg,
        nlon: int,
        dim: int,
        num_blocks: int = 1,
        lmax: int | None = None,
        mmax: int | None = None,
        key: str = "latitudes",
        blocks_key: str = "num_blocks",
    ):
        super().__init__()
        sht = SphericalHarmonicTransform(lats_deg, nlon, lmax, mmax, key=key)
        isht = InverseSphericalHarmonicTransform(lats_deg, nlon, sht.lmax, sht.mmax, key=key)
        self.filter = SpectralConvS2(sht, isht, dim, num_blocks, gain=0.5, key=blocks_key)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mixed = self.filter(x.permute(0, 3, 1, 2))
        return mixed.permute(0, 2, 3, 1) + x


def spectral_conv_flops(channels: int, num_blocks: int, nlat: int, nlon: int, lmax: int, mmax: int) -> int:
    """Forward FLOPs of one :class:`SpectralConvS2` on one sample: an SHT and an inverse SHT per channel
    (:func:`dlscale.models.spherical_harmonics.sht_flops`) and the per-degree complex matmul over all
    lmax x mmax coefficients, 8 real FLOPs per complex multiply-add (as it runs: one real matmul of
    2 C/g x 2 C/g per block, degree and order)."""
    block = channels // num_blocks
    transforms = 2 * channels * sht_flops(nlat, nlon, lmax, mmax)
    return transforms + 2 * num_blocks * (2 * block) ** 2 * lmax * mmax


def sfno_mixer_flops(dim: int, num_blocks: int, grid: tuple[int, int]) -> int:
    """Forward FLOPs of one :class:`SFNOMixer` with its default truncation on one sample's rows x columns token
    grid (:func:`spectral_conv_flops`; the residual addition left out)."""
    rows, columns = grid
    return spectral_conv_flops(dim, num_blocks, rows, columns, *default_truncation(rows, columns))
