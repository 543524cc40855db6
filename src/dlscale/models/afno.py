"""The adaptive Fourier neural operator (AFNO) token mixer of FourCastNet v1, on a ViT's grid of patch tokens.

AFNO (Guibas et al., "Adaptive Fourier Neural Operators: Efficient Token Mixers for Transformers", arXiv
2111.13587) mixes tokens in the Fourier domain instead of by attention: O(N log N) in the number of tokens N,
where attention is O(N^2). FourCastNet (Pathak et al., arXiv 2202.11214) forecasts the ERA5 atmosphere at 0.25
degrees with it. On a (B, h, w, D) grid of tokens, :class:`AFNO2D` computes

1. X = rfft2(x) over (h, w), orthonormal: (B, h, w//2+1, D) complex modes;
2. on the kept modes only (:func:`kept_modes`), per block of D / num_blocks channels, a complex two-layer MLP
   with a ReLU applied to the real and imaginary parts separately:
   Z = ReLU(X W1 + b1), Y = Z W2 + b2, with W1, W2 complex block-diagonal (D / num_blocks)^2 matrices;
   every other mode is zero;
3. soft shrinkage of Y's real and imaginary parts by ``sparsity_threshold`` (small modes become 0);
4. irfft2 back to (h, w), plus the mixer's own input (the reference's ``x + bias``).

The weight layout, the 0.02-scaled Gaussian init (of the biases too) and the choice of the kept modes follow
NVlabs/FourCastNet's ``networks/afnonet.py``, so its ``filter`` weights mean the same here. The block around the
mixer (LayerNorm, this filter, a double skip, LayerNorm, MLP) is :class:`dlscale.models.vit.AFNOBlock`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from dlscale.errors import InvalidValue

# The reference draws every AFNO weight and bias from N(0, 1) times this scale (no truncation).
AFNO_INIT_SCALE = 0.02


def kept_modes(rows: int, columns: int, fraction: float) -> tuple[slice, slice]:
    """The (row, column) slices of an ``rfft2`` spectrum of a rows x columns grid that the filter acts on.

    As FourCastNet selects them: with m = rows // 2 + 1 and k = int(m * fraction), the rows m - k .. m + k - 1
    of the unshifted spectrum (all rows when the fraction is 1; below 1 these rows are centred on the
    *highest* meridional wavenumbers, the reference's choice) and the columns 0 .. k - 1 of the
    columns // 2 + 1 zonal wavenumbers. The column count comes from the rows, so a grid wider than tall keeps
    only the zonal wavenumbers below m even at fraction 1 (FourCastNet's 90 x 180 token grid: 46 of 91).
    """
    return _mode_slices(rows, columns // 2 + 1, fraction)


def _mode_slices(rows: int, half_columns: int, fraction: float) -> tuple[slice, slice]:
    total = rows // 2 + 1
    kept = int(total * fraction)
    return slice(max(total - kept, 0), min(total + kept, rows)), slice(0, min(kept, half_columns))


def kept_mode_count(rows: int, columns: int, fraction: float) -> int:
    """How many complex modes of a rows x columns grid the filter acts on."""
    row_slice, column_slice = kept_modes(rows, columns, fraction)
    return len(range(rows)[row_slice]) * len(range(columns // 2 + 1)[column_slice])


def check_kept_modes(grid: tuple[int, int], fraction: float) -> None:
    """Refuse a fraction that keeps no mode of the token grid (the filter would do nothing)."""
    rows, columns = grid
    if kept_mode_count(rows, columns, fraction) == 0:
        total = rows // 2 + 1
        raise InvalidValue(
            "model.afno_hard_thresholding_fraction",
            f"{fraction:g} keeps no Fourier mode of the {rows}x{columns} token grid (data.img_size / "
            f"model.patch_size): it keeps int({total} * fraction) rows of modes; use at least "
            f"{math.ceil(1000 / total) / 1000:g}",
        )


class AFNO2D(nn.Module):
    """The AFNO filter on (B, h, w, D) tokens (see the module docstring); returns the same shape and dtype.

    Parameters, as the reference names and shapes them (index 0 real, 1 imaginary part):
    ``w1``, ``w2``: (2, num_blocks, D / num_blocks, D / num_blocks); ``b1``, ``b2``: (2, num_blocks,
    D / num_blocks).
    """

    def __init__(
        self, dim: int, num_blocks: int, sparsity_threshold: float, hard_thresholding_fraction: float
    ):
        super().__init__()
        if dim % num_blocks:
            raise InvalidValue("afno_num_blocks", f"{num_blocks} blocks do not divide the width {dim}")
        self.dim = dim
        self.num_blocks = num_blocks
        self.block_size = dim // num_blocks
        self.sparsity_threshold = sparsity_threshold
        self.hard_thresholding_fraction = hard_thresholding_fraction
        shape = (2, num_blocks, self.block_size)
        self.w1 = nn.Parameter(torch.empty(*shape, self.block_size))
        self.b1 = nn.Parameter(torch.empty(*shape))
        self.w2 = nn.Parameter(torch.empty(*shape, self.block_size))
        self.b2 = nn.Parameter(torch.empty(*shape))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The reference's init: every weight and bias N(0, 0.02^2)."""
        for parameter in (self.w1, self.b1, self.w2, self.b2):
            nn.init.normal_(parameter, std=AFNO_INIT_SCALE)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_blocks={self.num_blocks}, sparsity_threshold={self.sparsity_threshold:g}, "
            f"hard_thresholding_fraction={self.hard_thresholding_fraction:g}"
        )

    @staticmethod
    def _complex_layer(parts: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """One complex block-diagonal linear layer on (..., blocks, 2 * block) [real | imaginary] features.

        (a + ib)(c + id) = (ac - bd) + i(ad + bc): the real matrix [[c, d], [-d, c]] applied to [a | b] gives
        [real | imaginary] in one matmul per block, the same FLOPs as the four real products.
        """
        real, imag = weight[0], weight[1]  # (blocks, in, out)
        stacked = torch.cat((torch.cat((real, imag), dim=-1), torch.cat((-imag, real), dim=-1)), dim=-2)
        return torch.einsum("...ni,nio->...no", parts, stacked) + torch.cat((bias[0], bias[1]), dim=-1)

    def filter_spectrum(self, spectrum: torch.Tensor) -> torch.Tensor:
        """The filtered spectrum: (B, h, w//2+1, D) complex modes in, the same out, zero outside the kept modes."""
        _, rows, half_columns, _ = spectrum.shape
        row_slice, column_slice = _mode_slices(rows, half_columns, self.hard_thresholding_fraction)
        kept = spectrum[:, row_slice, column_slice]
        blocks = (*kept.shape[:3], self.num_blocks, self.block_size)
        parts = torch.cat((kept.real.reshape(blocks), kept.imag.reshape(blocks)), dim=-1)
        hidden = F.relu(self._complex_layer(parts, self.w1, self.b1))  # ReLU on real and imaginary parts
        # Under autocast the matmuls ran in half precision; the shrinkage and the inverse FFT take float32.
        out = F.softshrink(self._complex_layer(hidden, self.w2, self.b2).float(), self.sparsity_threshold)
        real, imag = out.split(self.block_size, dim=-1)
        filtered = torch.complex(real.reshape(kept.shape), imag.reshape(kept.shape))
        # The other modes are zero: the kept block padded out to the whole spectrum.
        row_start, row_stop, _ = row_slice.indices(rows)
        column_stop = column_slice.indices(half_columns)[1]
        return _pad_modes(filtered, rows, half_columns, row_start, row_stop, column_stop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        _, rows, columns, _ = x.shape
        # The FFTs run in float32, under autocast too: cuFFT has no bf16 transforms and takes fp16 ones only
        # for power-of-2 sizes (the 0.25-degree token grid is 90 x 180), and half precision would lose the
        # small modes the filter shrinks. FFTs are on no autocast list, so float32 inputs keep them in float32.
        # They transform contiguous (B, D, h, w) planes: over the middle axes of the (B, h, w, D) tokens, the
        # CPU's FFT rounds a batch of one sample differently from a larger batch, so a forecast's bits would
        # depend on its batch size (an ensemble's control would not be the deterministic forecast).
        planes = x.float().permute(0, 3, 1, 2).contiguous()
        spectrum = torch.fft.rfft2(planes, norm="ortho").permute(0, 2, 3, 1)
        filtered = self.filter_spectrum(spectrum).permute(0, 3, 1, 2).contiguous()
        mixed = torch.fft.irfft2(filtered, s=(rows, columns), norm="ortho").permute(0, 2, 3, 1)
        return mixed.to(dtype) + x


def _pad_modes(
    kept: torch.Tensor, rows: int, half_columns: int, row_start: int, row_stop: int, column_stop: int
) -> torch.Tensor:
    """The kept (B, rows kept, columns kept, D) complex block placed in a zero (B, rows, half_columns, D)
    spectrum (padded on its real view: complex padding is not supported everywhere)."""
    padded = F.pad(
        torch.view_as_real(kept), (0, 0, 0, 0, 0, half_columns - column_stop, row_start, rows - row_stop)
    )
    return torch.view_as_complex(padded.contiguous())


def afno_flops_per_token_grid(dim: int, num_blocks: int, grid: tuple[int, int], fraction: float) -> int:
    """Forward FLOPs of one AFNO filter on one sample's rows x columns token grid: its two block-diagonal
    complex matmuls over the kept modes (four real matmuls each: 2 * 4 * modes * dim * (dim / num_blocks) per
    layer) and its two FFTs, each counted as 5 * n * log2(n) per channel with n = rows * columns (the usual
    count of a complex FFT; a real FFT does about half of it). Biases, ReLU, shrinkage and the residual are
    left out, as elsewhere."""
    rows, columns = grid
    modes = kept_mode_count(rows, columns, fraction)
    matmuls = 2 * (2 * 4 * modes * dim * (dim // num_blocks))
    points = rows * columns
    ffts = 2 * round(5 * points * math.log2(points)) * dim if points > 1 else 0
    return matmuls + ffts
