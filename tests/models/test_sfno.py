"""SFNO's spectral convolution, block and token mixer: per-degree weights against a complex einsum, the identity
filter as the SHT's projection, equivariance to a longitude shift, gradients, bf16 autocast and the FLOP count."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from dlscale.errors import InvalidValue
from dlscale.models.sfno import SFNOBlock, SFNOMixer, SpectralConvS2, sfno_mixer_flops, spectral_conv_flops
from dlscale.models.spherical_harmonics import InverseSphericalHarmonicTransform, SphericalHarmonicTransform

LATS = np.linspace(90.0, -90.0, 9)  # 9 rows with poles: lmax = mmax = 5
NLON = 16
PATCH_CENTRES = 90.0 - 15.0 * (2 * np.arange(6) + 0.5)  # 2-row patches of the top 12 of 13 rows (15 apart)


def transforms(lats=LATS, nlon=NLON):
    return SphericalHarmonicTransform(lats, nlon), InverseSphericalHarmonicTransform(lats, nlon)


def band_limited(channels: int, lats=LATS, nlon=NLON, seed: int = 0) -> torch.Tensor:
    """A (2, channels, nlat, nlon) field with l < lmax only: the inverse SHT of random coefficients."""
    sht, isht = transforms(lats, nlon)
    generator = torch.Generator().manual_seed(seed)
    parts = torch.randn(2, channels, sht.lmax, sht.mmax, 2, generator=generator)
    parts[..., 0, 1] = 0.0
    coefficients = torch.view_as_complex(parts).where(torch.ones(sht.lmax, sht.mmax).tril().bool(), 0)
    return isht(coefficients)


def complex_weight(conv: SpectralConvS2) -> torch.Tensor:
    return torch.view_as_complex(conv.weight.detach().contiguous())  # (g, in, out, lmax)


def test_the_filter_mixes_channels_with_one_complex_matrix_per_degree():
    torch.manual_seed(0)
    sht, isht = transforms()
    conv = SpectralConvS2(sht, isht, channels=6, num_blocks=2)
    x = band_limited(6)
    # Independent: the coefficients' complex product with the block-diagonal per-degree weights.
    a = sht(x).reshape(2, 2, 3, sht.lmax, sht.mmax)
    expected = torch.einsum("bgilm,giol->bgolm", a, complex_weight(conv)).reshape(2, 6, sht.lmax, sht.mmax)
    # A real field's a_l^0 is real: the inverse keeps the real part of the mixed m = 0 coefficients.
    expected[..., 0] = expected[..., 0].real
    torch.testing.assert_close(sht(conv(x)), expected, rtol=0, atol=1e-5 * expected.abs().max())


def test_identity_weights_give_the_transforms_projection():
    sht, isht = transforms()
    conv = SpectralConvS2(sht, isht, channels=4)
    with torch.no_grad():
        conv.weight.zero_()
        conv.weight[0, :, :, :, 0] = torch.eye(4)[..., None]  # weight 1 at every degree
    rough = torch.randn(2, 4, len(LATS), NLON, generator=torch.Generator().manual_seed(1))  # not band-limited
    projected = conv(rough)
    torch.testing.assert_close(projected, isht(sht(rough)), rtol=0, atol=1e-5)
    assert (projected - rough).abs().max() > 0.1  # the grid holds more than l < lmax
    torch.testing.assert_close(conv(projected), projected, rtol=0, atol=1e-5)  # a projection
    smooth = band_limited(4)
    torch.testing.assert_close(conv(smooth), smooth, rtol=0, atol=1e-5 * smooth.abs().max())


def test_block_forward_and_backward_on_a_tiny_grid():
    torch.manual_seed(0)
    sht, isht = transforms()
    block = SFNOBlock(sht, isht, channels=8, mlp_ratio=2.0, num_blocks=2, drop_path_rate=0.1)
    x = torch.randn(2, 8, len(LATS), NLON, requires_grad=True)
    out = block(x)
    assert out.shape == x.shape and out.dtype == torch.float32
    out.square().mean().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().max() > 0
    for name, parameter in block.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().max() > 0, name
    shapes = {name: tuple(parameter.shape) for name, parameter in block.named_parameters()}
    assert shapes == {
        "filter.weight": (2, 4, 4, 5, 2),  # (blocks, in, out, lmax, [real, imaginary])
        "norm0.weight": (8,),
        "norm0.bias": (8,),
        "mlp.fc1.weight": (16, 8, 1, 1),
        "mlp.fc1.bias": (16,),
        "mlp.fc2.weight": (8, 16, 1, 1),
        "norm1.weight": (8,),
        "norm1.bias": (8,),
        "skip.weight": (8, 8, 1, 1),
    }
    # The transform's tables are buffers, saved with the weights: a model rebuilt without the data's latitudes at
    # hand (a checkpoint or an export loaded elsewhere) gets the tables it was trained with.
    tables = {"filter.sht.analysis", "filter.isht.synthesis"}
    assert {name for name, _ in block.named_buffers()} == tables
    assert set(block.state_dict()) == set(shapes) | tables


@pytest.mark.parametrize("shift", [1, 3])
def test_the_mixer_commutes_with_a_shift_in_longitude(shift):
    torch.manual_seed(0)
    mixer = SFNOMixer(PATCH_CENTRES, nlon=12, dim=8, num_blocks=2)
    tokens = torch.randn(2, len(PATCH_CENTRES), 12, 8)  # (B, h, w, D)
    out = mixer(tokens)
    assert out.shape == tokens.shape
    shifted = mixer(tokens.roll(shift, dims=2))
    torch.testing.assert_close(shifted, out.roll(shift, dims=2), rtol=0, atol=1e-5)


def test_the_block_commutes_with_a_shift_in_longitude():
    torch.manual_seed(0)
    sht, isht = transforms()
    block = SFNOBlock(sht, isht, channels=4).eval()
    x = torch.randn(2, 4, len(LATS), NLON)
    torch.testing.assert_close(block(x.roll(5, dims=-1)), block(x).roll(5, dims=-1), rtol=0, atol=1e-5)


def test_bf16_autocast_keeps_the_transform_in_float32():
    torch.manual_seed(0)
    sht, isht = transforms()
    conv = SpectralConvS2(sht, isht, channels=4)
    x = torch.randn(2, 4, len(LATS), NLON)
    reference = conv(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under_autocast = conv(x)
        block_out = SFNOBlock(sht, isht, channels=4)(x)
    assert under_autocast.dtype == torch.float32
    torch.testing.assert_close(under_autocast, reference, rtol=0, atol=1e-6)  # bf16 would be off by ~1e-2
    assert torch.isfinite(block_out).all()
    # bf16 tokens in, bf16 tokens out, the transform between in float32.
    mixer = SFNOMixer(LATS, NLON, dim=4)
    tokens = torch.randn(2, len(LATS), NLON, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = mixer(tokens.bfloat16())
    assert mixed.dtype == torch.bfloat16
    torch.testing.assert_close(mixed.float(), mixer(tokens.bfloat16().float()), rtol=0, atol=0.05)


def test_blocks_that_do_not_divide_the_width_are_refused():
    with pytest.raises(InvalidValue, match="sfno_num_blocks: 3 blocks do not divide the 8 channels"):
        SFNOMixer(LATS, NLON, dim=8, num_blocks=3, blocks_key="sfno_num_blocks")


def test_the_flop_count_is_what_runs():
    sht, isht = transforms()
    conv = SpectralConvS2(sht, isht, channels=6, num_blocks=3)
    with FlopCounterMode(display=False) as counter:
        conv(torch.randn(1, 6, len(LATS), NLON))
    # torch counts the matmuls, not the FFTs: 2 per channel, 5 n log2 n per row in our count.
    ffts = 2 * 6 * len(LATS) * round(5 * NLON * math.log2(NLON))
    assert spectral_conv_flops(6, 3, len(LATS), NLON, sht.lmax, sht.mmax) - ffts == counter.get_total_flops()
    # The mixer's count, from the token grid's shape alone, is that of the truncation the mixer builds.
    mixer = SFNOMixer(PATCH_CENTRES, nlon=12, dim=6, num_blocks=3)
    lmax, mmax = mixer.filter.sht.lmax, mixer.filter.sht.mmax
    assert sfno_mixer_flops(6, 3, (6, 12)) == spectral_conv_flops(6, 3, 6, 12, lmax, mmax)
