"""FourCastNet's AFNO mixer (dlscale.models.afno) and the ViT built with it: the filter against an independent
numpy computation, its FFT identity, the modes it keeps, float32 FFTs under autocast, torch.compile, the
parameter names and the FLOP count."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from dlscale.errors import ConfigError, InvalidValue
from dlscale.models.afno import AFNO2D, afno_flops_per_token_grid
from dlscale.models.vit import AFNOBlock, Block, VisionTransformer, vit_flops_per_sample
from dlscale.models.vit_config import ViTConfig
from dlscale.parallel.vit_parallel import check_vit_layout

TINY_IMG = (16, 32)


def afno_cfg(**overrides) -> ViTConfig:
    fields = {"embed_dim": 32, "depth": 2, "num_heads": 4, "patch_size": 4, "mixer": "afno"}
    return ViTConfig(**{**fields, **overrides})


def filter_with_weights(dim: int, blocks: int, threshold: float, fraction: float, seed: int = 0) -> AFNO2D:
    """A filter whose weights are large enough (N(0, 0.5^2)) that the ReLU and the shrinkage both act."""
    torch.manual_seed(seed)
    mixer = AFNO2D(dim, blocks, threshold, fraction)
    with torch.no_grad():
        for parameter in mixer.parameters():
            parameter.normal_(std=0.5)
    return mixer


def softshrink(values: np.ndarray, threshold: float) -> np.ndarray:
    return np.sign(values) * np.maximum(np.abs(values) - threshold, 0.0)


def numpy_afno(x: np.ndarray, mixer: AFNO2D, rows_kept: list[int], columns_kept: list[int]) -> np.ndarray:
    """The AFNO filter of the papers, written out: rfft2, per block Z = ReLU(X W1 + b1) on real and imaginary
    parts, Y = Z W2 + b2 with complex W = w[0] + i w[1], soft shrinkage, zero outside the kept modes, irfft2,
    plus the input; in float64."""
    w1, b1, w2, b2 = (p.detach().double().numpy() for p in (mixer.w1, mixer.b1, mixer.w2, mixer.b2))
    batch, rows, columns, dim = x.shape
    size = dim // mixer.num_blocks
    spectrum = np.fft.rfft2(x.astype(np.float64), axes=(1, 2), norm="ortho")
    filtered = np.zeros_like(spectrum)
    for b in range(mixer.num_blocks):
        channels = slice(b * size, (b + 1) * size)
        for row in rows_kept:
            for column in columns_kept:
                modes = spectrum[:, row, column, channels]  # (batch, size) complex
                hidden = modes @ (w1[0, b] + 1j * w1[1, b]) + (b1[0, b] + 1j * b1[1, b])
                hidden = np.maximum(hidden.real, 0) + 1j * np.maximum(hidden.imag, 0)
                out = hidden @ (w2[0, b] + 1j * w2[1, b]) + (b2[0, b] + 1j * b2[1, b])
                threshold = mixer.sparsity_threshold
                filtered[:, row, column, channels] = softshrink(out.real, threshold) + 1j * softshrink(
                    out.imag, threshold
                )
    return np.fft.irfft2(filtered, s=(rows, columns), axes=(1, 2), norm="ortho") + x


# The kept modes of a 4 x 6 grid (4 rows, 6 // 2 + 1 = 4 columns of the rfft2 spectrum), from FourCastNet's
# rule m = 4 // 2 + 1 = 3, k = int(m * fraction): rows m - k .. m + k - 1 (within 0..3), columns 0 .. k - 1.
# fraction 1: k = 3, rows 0..3, columns 0..2 (column 3, the Nyquist column, is never filtered on this grid);
# fraction 0.5: k = 1, rows 2..3, column 0.
@pytest.mark.parametrize(
    ("fraction", "rows_kept", "columns_kept"), [(1.0, [0, 1, 2, 3], [0, 1, 2]), (0.5, [2, 3], [0])]
)
def test_the_filter_is_the_papers_afno_computed_independently(fraction, rows_kept, columns_kept):
    mixer = filter_with_weights(dim=8, blocks=2, threshold=0.3, fraction=fraction)
    x = torch.randn(2, 4, 6, 8, generator=torch.Generator().manual_seed(1))
    expected = numpy_afno(x.numpy(), mixer, rows_kept, columns_kept)
    with torch.no_grad():
        actual = mixer(x)
    assert actual.dtype == torch.float32 and actual.shape == x.shape
    np.testing.assert_allclose(actual.numpy(), expected, rtol=1e-5, atol=1e-5)
    # The filter did something beyond the residual, and the shrinkage zeroed some kept modes but not all.
    assert not np.allclose(expected, x.numpy(), atol=1e-3)


def identity_filter(dim: int, blocks: int) -> AFNO2D:
    """Weights that make the filter the identity on its kept modes: W1 = W2 = I, and a bias that lifts every
    real and imaginary part above 0 before the ReLU (b1 = c + ic) and takes it off again (b2 = -b1)."""
    mixer = AFNO2D(dim, blocks, sparsity_threshold=0.0, hard_thresholding_fraction=1.0)
    size = dim // blocks
    lift = 50.0
    with torch.no_grad():
        for weight in (mixer.w1, mixer.w2):
            weight.zero_()
            weight[0] = torch.eye(size).expand(blocks, size, size)
        mixer.b1.fill_(lift)
        mixer.b2.fill_(-lift)
    return mixer


def test_an_identity_filter_returns_twice_the_input_where_every_mode_is_kept():
    # A 6 x 6 grid: m = 4 rows' worth of modes covers the 6 // 2 + 1 = 4 columns, so every mode is filtered, and
    # irfft2(rfft2(x)) + x = 2x.
    x = torch.randn(2, 6, 6, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = identity_filter(8, 2)(x)
    torch.testing.assert_close(out, 2 * x, rtol=1e-4, atol=1e-4)


def test_an_identity_filter_on_a_wide_grid_passes_the_zonal_wavenumbers_below_the_rows_mode_count():
    # 4 x 12: m = 3, so the filter keeps zonal wavenumbers 0..2 of 0..6 (FourCastNet's rule); the output is the
    # input plus its zonal low-pass.
    x = torch.randn(2, 4, 12, 8, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = identity_filter(8, 4)(x)
    spectrum = np.fft.rfft2(x.double().numpy(), axes=(1, 2), norm="ortho")
    spectrum[:, :, 3:] = 0
    low_pass = np.fft.irfft2(spectrum, s=(4, 12), axes=(1, 2), norm="ortho")
    np.testing.assert_allclose(out.numpy(), x.numpy() + low_pass, rtol=1e-4, atol=1e-4)


def test_a_fraction_below_one_zeroes_exactly_the_modes_outside_the_kept_set():
    # 8 x 12 at fraction 0.5: m = 5, k = 2: rows 3..6, columns 0..1 of the 8 x 7 spectrum.
    mixer = filter_with_weights(dim=8, blocks=2, threshold=0.0, fraction=0.5)
    x = torch.randn(2, 8, 12, 8, generator=torch.Generator().manual_seed(4))
    kept = np.zeros((8, 7), dtype=bool)
    kept[3:7, 0:2] = True
    with torch.no_grad():
        filtered = mixer.filter_spectrum(torch.fft.rfft2(x, dim=(1, 2), norm="ortho"))
        added = mixer(x) - x
    magnitude = filtered.abs().amax(dim=(0, 3)).numpy()
    assert np.all(magnitude[~kept] == 0) and np.all(magnitude[kept] > 1e-3)
    # What the mixer adds to its input has that spectrum: in the columns whose modes the real transform keeps
    # as they are (not column 0 or the Nyquist column 6, which irfft2 makes Hermitian), nothing outside it.
    added_magnitude = torch.fft.rfft2(added, dim=(1, 2), norm="ortho").abs().amax(dim=(0, 3)).numpy()
    inner = np.s_[:, 1:6]
    assert np.all(added_magnitude[inner][~kept[inner]] < 1e-5)
    np.testing.assert_allclose(added_magnitude[inner][kept[inner]], magnitude[inner][kept[inner]], rtol=1e-4)


def test_a_fraction_that_keeps_no_mode_of_the_grid_is_refused_when_the_model_is_built():
    # A 4 x 8 token grid has m = 3 row modes: a fraction below 1/3 keeps int(3 * f) = 0 of them.
    with pytest.raises(InvalidValue, match=r"^model.afno_hard_thresholding_fraction: 0.3 keeps no .* 0.334$"):
        VisionTransformer(afno_cfg(afno_hard_thresholding_fraction=0.3), TINY_IMG, 20, 20)


def test_the_ffts_run_in_float32_under_bf16_autocast_and_the_output_keeps_the_inputs_dtype(monkeypatch):
    mixer = filter_with_weights(dim=8, blocks=2, threshold=0.01, fraction=1.0)
    x = torch.randn(2, 4, 6, 8, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        reference = mixer(x)
    seen = []
    for name in ("rfft2", "irfft2"):
        original = getattr(torch.fft, name)

        def recording(tensor, *args, _original=original, **kwargs):
            seen.append(tensor.dtype)
            return _original(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.fft, name, recording)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        half = mixer(x.bfloat16())
        full = mixer(x)
    assert seen == [torch.float32, torch.complex64] * 2
    assert half.dtype == torch.bfloat16 and full.dtype == torch.float32
    torch.testing.assert_close(half.float(), reference, rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(full, reference, rtol=3e-2, atol=3e-2)  # the matmuls ran in bf16


def test_a_sample_alone_gives_the_bits_it_gives_in_a_batch():
    # A forecast's batch size (an ensemble's is the run's batch divided by its members) must not change its
    # numbers: the ensemble's control is the deterministic forecast to the bit. Grids and widths where the
    # CPU's FFT over the middle axes of (B, h, w, D) tokens rounded one sample differently from several.
    generator = torch.Generator().manual_seed(8)
    for grid, dim in (((4, 8), 32), ((8, 16), 128), ((45, 90), 32)):
        mixer = filter_with_weights(dim, blocks=4, threshold=0.01, fraction=1.0)
        x = torch.randn(3, *grid, dim, generator=generator)
        with torch.no_grad():
            batched = mixer(x)
            for k in range(3):
                assert torch.equal(mixer(x[k : k + 1]), batched[k : k + 1]), (grid, dim, k)


def test_the_afno_vit_trains_under_bf16_autocast_close_to_float32():
    torch.manual_seed(0)
    model = VisionTransformer(afno_cfg(), TINY_IMG, 20, 20)
    x = torch.randn(2, 20, *TINY_IMG, generator=torch.Generator().manual_seed(6))
    reference = model(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    out.float().square().mean().backward()
    assert out.dtype == torch.bfloat16  # the head's Linear ran in bf16, as in the attention ViT
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert (out.float() - reference).abs().max() < 0.05 * reference.abs().max()


def test_the_afno_vit_has_fourcastnets_block_structure_and_names():
    model = VisionTransformer(afno_cfg(afno_num_blocks=4), TINY_IMG, 20, 20)
    assert all(isinstance(block, AFNOBlock) for block in model.blocks)
    names = {name: tuple(p.shape) for name, p in model.named_parameters() if name.startswith("blocks.0.")}
    assert names == {
        "blocks.0.norm1.weight": (32,), "blocks.0.norm1.bias": (32,),
        "blocks.0.filter.w1": (2, 4, 8, 8), "blocks.0.filter.b1": (2, 4, 8),
        "blocks.0.filter.w2": (2, 4, 8, 8), "blocks.0.filter.b2": (2, 4, 8),
        "blocks.0.norm2.weight": (32,), "blocks.0.norm2.bias": (32,),
        "blocks.0.mlp.fc1.weight": (128, 32), "blocks.0.mlp.fc1.bias": (128,),
        "blocks.0.mlp.fc2.weight": (32, 128), "blocks.0.mlp.fc2.bias": (32,),
    }  # fmt: skip
    # The filter keeps its own init (N(0, 0.02^2), biases too); the ViT's reset zeroes only Linear biases.
    w1 = model.blocks[0].filter.w1
    assert 0.01 < w1.std().item() < 0.03 and model.blocks[0].filter.b1.abs().max() > 0
    # And the attention ViT is unchanged.
    assert isinstance(VisionTransformer(afno_cfg(mixer="attention"), TINY_IMG, 20, 20).blocks[0], Block)


def test_the_block_is_the_double_skip_of_fourcastnet():
    torch.manual_seed(0)
    block = AFNOBlock(afno_cfg(), 0.0, (4, 8))
    x = torch.randn(2, 32, 32)
    with torch.no_grad():
        filtered = block.filter(block.norm1(x).reshape(2, 4, 8, 32)).reshape(2, 32, 32) + x
        expected = filtered + block.mlp(block.norm2(filtered))
        torch.testing.assert_close(block(x), expected)


def test_num_heads_need_not_divide_an_afno_models_width_and_afno_keys_are_checked():
    assert afno_cfg(embed_dim=24, num_heads=5, afno_num_blocks=3).embed_dim == 24
    with pytest.raises(InvalidValue, match="^embed_dim:"):
        afno_cfg(embed_dim=24, num_heads=5, afno_num_blocks=3, mixer="attention")
    # The blocks must divide the width only where the filter is built.
    assert ViTConfig(embed_dim=24, num_heads=4, afno_num_blocks=5).mixer == "attention"
    with pytest.raises(InvalidValue, match="^mixer: 'fno' is not one of attention, afno"):
        afno_cfg(mixer="fno")


def test_tensor_and_context_parallelism_refuse_an_afno_model():
    model = VisionTransformer(afno_cfg(), TINY_IMG, 20, 20)
    with pytest.raises(ConfigError, match="model.mixer 'afno'"):
        check_vit_layout(model, 2, 1)
    with pytest.raises(InvalidValue, match="^parallel.context_parallel: 2 with model.mixer 'afno'"):
        afno_cfg().check_parallel(1, 2)
    afno_cfg().check_parallel(1, 1)
    afno_cfg(mixer="attention").check_parallel(2, 2)


@pytest.mark.slow
def test_torch_compile_trains_the_afno_vit_as_eager_does():
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    torch.manual_seed(0)
    eager = VisionTransformer(afno_cfg(depth=1), TINY_IMG, 20, 20)
    compiled_model = VisionTransformer(afno_cfg(depth=1), TINY_IMG, 20, 20)
    compiled_model.load_state_dict(eager.state_dict())
    # aot_eager: dynamo's graphs and AOTAutograd's backward on ATen's kernels, as the ViT's compile test does
    # (tests/training/test_precision.py says why not inductor's cold C++ build).
    compiled = torch.compile(compiled_model, backend="aot_eager")
    x = torch.randn(2, 20, *TINY_IMG, generator=torch.Generator().manual_seed(7))
    for forward in (eager, compiled):
        forward(x).square().mean().backward()
    assert counters["stats"]["unique_graphs"] >= 1
    for a, b in zip(eager.parameters(), compiled_model.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6)


def test_the_flop_count_is_the_counted_matmuls_plus_the_ffts():
    cfg, channels = afno_cfg(afno_num_blocks=4), 20
    model = VisionTransformer(cfg, TINY_IMG, channels, channels)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.randn(1, channels, *TINY_IMG))
    analytic = vit_flops_per_sample(cfg, TINY_IMG, channels, channels)
    # torch's counter sees the matmuls (the filter's einsums too) but not the FFTs: 5 N log2 N per channel and
    # transform, two transforms per block, N = 4 * 8 tokens.
    ffts = cfg.depth * 2 * 5 * 32 * 5 * cfg.embed_dim
    assert analytic - ffts == counter.get_total_flops()
    # The filter's matmuls: 2 layers x 4 real (block x block) products on each of the 4 x 3 kept modes.
    assert afno_flops_per_token_grid(32, 4, (4, 8), 1.0) == 2 * 4 * 2 * (4 * 3) * 32 * 8 + 2 * 5 * 32 * 5 * 32
    # More than the ViT without any token mixer (patch embedding, MLPs and head only), less than with attention.
    attention_cfg = afno_cfg(mixer="attention")
    attention = vit_flops_per_sample(attention_cfg, TINY_IMG, channels, channels)
    mixers = cfg.depth * (4 * 2 * 32 * 32 * 32 + 2 * 2 * 32 * 32 * 32)
    assert attention - mixers < analytic < attention
