"""The ViT: reference parameter counts and names, shapes, output layout, determinism, config checks, FLOPs."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from dlscale.errors import InvalidValue
from dlscale.models.parameters import count_parameters
from dlscale.models.vit import DropPath, VisionTransformer, vit_flops_per_sample
from dlscale.models.vit_config import ViTConfig

ERA5_IMG = (360, 720)
ERA5_CHANNELS = 20
TINY_IMG = (16, 32)


def tiny_cfg(**overrides) -> ViTConfig:
    fields = dict(embed_dim=32, depth=2, num_heads=4, patch_size=4)
    fields.update(overrides)
    return ViTConfig(**fields)


def tiny_model(seed: int = 0, **overrides) -> VisionTransformer:
    torch.manual_seed(seed)
    return VisionTransformer(tiny_cfg(**overrides), TINY_IMG, in_channels=3, out_channels=2)


def meta_model(cfg: ViTConfig) -> VisionTransformer:
    with torch.device("meta"):
        return VisionTransformer(cfg, ERA5_IMG, ERA5_CHANNELS, ERA5_CHANNELS)


# --- parameter counts, from the reference fact sheet (verified there by instantiating the original) ---


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({}, 23_832_960),  # base
        ({"embed_dim": 1024}, 157_926_400),  # mp
        ({"embed_dim": 1024, "patch_size": 4}, 168_401_920),  # mp_patch4
    ],
    ids=["base", "mp", "mp_patch4"],
)
def test_parameter_count_matches_reference(overrides, expected):
    model = meta_model(ViTConfig(**overrides))
    assert model.pos_embed.is_meta
    assert count_parameters(model) == expected


def test_base_parameter_breakdown_matches_reference():
    model = meta_model(ViTConfig())
    assert model.num_tokens == 4050
    assert model.grid_size == (45, 90)
    assert count_parameters(model.patch_embed) == 491_904
    assert model.pos_embed.numel() == 1_555_200
    assert len(model.blocks) == 12
    assert all(count_parameters(block) == 1_774_464 for block in model.blocks)
    assert count_parameters(model.norm) == 768
    assert count_parameters(model.head) == 491_520


def test_parameter_names_match_reference():
    model = tiny_model()
    per_block = [
        "norm1.weight",
        "norm1.bias",
        *(f"attn.{layer}.{kind}" for layer in ("q", "k", "v", "proj") for kind in ("weight", "bias")),
        "norm2.weight",
        "norm2.bias",
        *(f"mlp.{layer}.{kind}" for layer in ("fc1", "fc2") for kind in ("weight", "bias")),
    ]
    expected = {"patch_embed.proj.weight", "patch_embed.proj.bias", "pos_embed", "norm.weight", "norm.bias"}
    expected |= {"head.weight"}
    expected |= {f"blocks.{i}.{name}" for i in range(2) for name in per_block}
    assert set(model.state_dict()) == expected
    assert {name for name, _ in model.named_parameters()} == expected
    assert model.head.bias is None


def test_qkv_bias_off_removes_only_qkv_biases():
    model = tiny_model(qkv_bias=False)
    names = set(model.state_dict())
    assert not any(name.endswith(("attn.q.bias", "attn.k.bias", "attn.v.bias")) for name in names)
    assert "blocks.0.attn.proj.bias" in names


# --- forward and backward ---


def test_forward_shape_finite_and_backward_reaches_every_parameter():
    model = tiny_model()
    x = torch.randn(2, 3, *TINY_IMG)
    out = model(x)
    assert out.shape == (2, 2, *TINY_IMG)
    assert torch.isfinite(out).all()
    out.square().mean().backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert param.grad.abs().sum() > 0, name


def test_forward_composes_the_public_stages():
    model = tiny_model().eval()
    x = torch.randn(2, 3, *TINY_IMG)
    staged = model.unpatchify(model.head(model.norm(model.blocks(model.tokens(x)))))
    torch.testing.assert_close(model(x), staged, rtol=0, atol=0)


def test_wrong_input_shape_is_rejected():
    model = tiny_model()
    with pytest.raises(ValueError, match=r"\(B, 3, 16, 32\)"):
        model(torch.randn(1, 3, 16, 16))


def test_tokens_are_patches_in_row_major_order():
    model = tiny_model().eval()
    with torch.no_grad():
        model.pos_embed.zero_()
    x = torch.randn(1, 3, *TINY_IMG)
    tokens = model.tokens(x)
    p = model.patch_size
    rows, cols = model.grid_size
    assert tokens.shape == (1, rows * cols, 32)
    for i in range(rows):
        for j in range(cols):
            patch = x[:, :, i * p : (i + 1) * p, j * p : (j + 1) * p]
            expected = model.patch_embed.proj(patch).flatten()
            torch.testing.assert_close(tokens[0, i * cols + j], expected)


def test_unpatchify_puts_head_feature_at_reference_pixel():
    model = tiny_model()
    p, channels = model.patch_size, model.out_channels
    rows, cols = model.grid_size
    # Every (batch, token, feature) gets a distinct value so any misplacement shows.
    head_out = torch.arange(2 * rows * cols * p * p * channels, dtype=torch.float64)
    head_out = head_out.reshape(2, rows * cols, p * p * channels)
    image = model.unpatchify(head_out)
    assert image.shape == (2, channels, *TINY_IMG)
    for b in range(2):
        for i in range(rows):
            for j in range(cols):
                for r in range(p):
                    for c in range(p):
                        for ch in range(channels):
                            feature = (r * p + c) * channels + ch
                            assert image[b, ch, i * p + r, j * p + c] == head_out[b, i * cols + j, feature]


def test_forward_pixels_come_from_the_matching_head_rows():
    model = tiny_model().eval()
    x = torch.randn(1, 3, *TINY_IMG)
    out = model(x)
    normed = model.norm(model.blocks(model.tokens(x)))[0]
    p, channels, cols = model.patch_size, model.out_channels, model.grid_size[1]
    for i, j, r, c, ch in [
        (0, 0, 0, 0, 0),
        (0, 0, 0, 1, 1),
        (1, 2, 3, 0, 0),
        (3, 7, 2, 3, 1),
        (2, 5, 1, 2, 1),
    ]:
        row = model.head.weight[(r * p + c) * channels + ch]
        expected = normed[i * cols + j] @ row
        torch.testing.assert_close(out[0, ch, i * p + r, j * p + c], expected)


# --- init and determinism ---


def test_same_seed_same_init_and_different_seed_different_init():
    first, second, other = tiny_model(seed=3), tiny_model(seed=3), tiny_model(seed=4)
    for name, tensor in first.state_dict().items():
        assert torch.equal(tensor, second.state_dict()[name]), name
    assert not torch.equal(first.pos_embed, other.pos_embed)


def test_init_follows_reference():
    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(embed_dim=64, depth=2, num_heads=4, patch_size=4), (32, 32), 3, 2)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 2 * 6 + 1
    for linear in linears:
        assert linear.weight.std().item() == pytest.approx(0.02, rel=0.15)
        assert linear.weight.abs().max() <= 2.0
        if linear.bias is not None:
            assert torch.count_nonzero(linear.bias) == 0
    assert model.pos_embed.std().item() == pytest.approx(0.02, rel=0.15)
    for norm in (m for m in model.modules() if isinstance(m, nn.LayerNorm)):
        assert torch.all(norm.weight == 1) and torch.count_nonzero(norm.bias) == 0
        assert norm.eps == 1e-6
    # The conv keeps PyTorch's default (kaiming-uniform, bound 1/sqrt(fan_in)), much wider than 0.02 here.
    bound = 1 / (3 * 4 * 4) ** 0.5
    assert model.patch_embed.proj.weight.abs().max() <= bound
    assert model.patch_embed.proj.weight.std() > 0.05


def test_no_dropout_train_and_eval_forwards_agree():
    model = tiny_model()
    x = torch.randn(2, 3, *TINY_IMG)
    train_out = model.train()(x)
    eval_out = model.eval()(x)
    torch.testing.assert_close(train_out, eval_out, rtol=0, atol=0)
    assert not any(isinstance(m, DropPath) for m in model.modules())


def test_dropout_makes_train_random_and_eval_deterministic():
    model = tiny_model(dropout=0.2)
    x = torch.randn(2, 3, *TINY_IMG)
    model.train()
    assert not torch.allclose(model(x), model(x))
    model.eval()
    torch.testing.assert_close(model(x), model(x), rtol=0, atol=0)


def test_drop_path_rate_grows_linearly_to_dropout():
    model = VisionTransformer(tiny_cfg(depth=5, dropout=0.2), TINY_IMG, 3, 2)
    assert isinstance(model.blocks[0].drop_path, nn.Identity)
    rates = [block.drop_path.rate for block in list(model.blocks)[1:]]
    assert rates == pytest.approx([0.05, 0.1, 0.15, 0.2])


def test_drop_path_drops_whole_samples_and_keeps_the_mean():
    torch.manual_seed(0)
    drop = DropPath(0.25).train()
    out = drop(torch.ones(4000, 3, 5))
    per_sample = out.flatten(1)
    # Each sample is either all dropped or all scaled by 1 / keep.
    assert torch.all((per_sample == 0).all(1) | (per_sample == 1 / 0.75).all(1))
    assert out.mean().item() == pytest.approx(1.0, abs=0.05)
    assert torch.equal(drop.eval()(torch.ones(3, 2)), torch.ones(3, 2))


# --- config validation ---


@pytest.mark.parametrize(
    ("fields", "key", "fragment"),
    [
        ({"embed_dim": 0}, "embed_dim", "at least 1"),
        ({"depth": 0}, "depth", "at least 1"),
        ({"num_heads": -1}, "num_heads", "at least 1"),
        ({"patch_size": 0}, "patch_size", "at least 1"),
        ({"embed_dim": 100, "num_heads": 8}, "embed_dim", "head dim of 12.5"),
        ({"dropout": 1.0}, "dropout", "[0, 1)"),
        ({"dropout": -0.1}, "dropout", "[0, 1)"),
        ({"dropout": float("nan")}, "dropout", "[0, 1)"),
        ({"mlp_ratio": 0.0}, "mlp_ratio", "> 0"),
        ({"mlp_ratio": -2.0}, "mlp_ratio", "> 0"),
        ({"mlp_ratio": 2.6, "embed_dim": 12, "num_heads": 4}, "mlp_ratio", "whole number"),
        ({"mlp_ratio": 0.01, "embed_dim": 8, "num_heads": 8}, "mlp_ratio", "at least 1"),
        ({"norm_eps": 0.0}, "norm_eps", "> 0"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(fields, key, fragment):
    with pytest.raises(InvalidValue) as info:
        ViTConfig(**fields)
    assert info.value.key == key
    assert str(info.value).startswith(f"{key}:")
    assert fragment in info.value.message


def test_default_config_is_the_reference_base():
    cfg = ViTConfig()
    assert (cfg.embed_dim, cfg.depth, cfg.num_heads, cfg.patch_size) == (384, 12, 8, 8)
    assert (cfg.mlp_ratio, cfg.dropout, cfg.qkv_bias, cfg.norm_eps) == (4.0, 0.0, True, 1e-6)
    assert cfg.head_dim == 48 and cfg.mlp_hidden_dim == 1536


def test_image_not_divisible_by_patch_is_rejected_naming_both_numbers():
    with pytest.raises(InvalidValue) as info:
        VisionTransformer(tiny_cfg(patch_size=5), TINY_IMG, 3, 2)
    assert info.value.key == "patch_size"
    assert "5" in info.value.message and "16x32" in info.value.message
    with pytest.raises(InvalidValue, match="^img_size:"):
        VisionTransformer(tiny_cfg(), (0, 32), 3, 2)
    with pytest.raises(InvalidValue, match="^in_channels:"):
        VisionTransformer(tiny_cfg(), TINY_IMG, 0, 2)
    with pytest.raises(InvalidValue, match="^patch_size:"):
        vit_flops_per_sample(tiny_cfg(patch_size=3), TINY_IMG, 3, 2)


# --- FLOPs ---


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [({}, 0.48e12), ({"embed_dim": 1024}, 2.05e12), ({"embed_dim": 1024, "patch_size": 4}, 17.8e12)],
    ids=["base", "mp", "mp_patch4"],
)
def test_flops_match_reference_estimates(overrides, expected):
    flops = vit_flops_per_sample(ViTConfig(**overrides), ERA5_IMG, ERA5_CHANNELS, ERA5_CHANNELS)
    assert isinstance(flops, int)
    assert flops == pytest.approx(expected, rel=0.05)


def test_flops_agree_with_torch_flop_counter():
    cfg = tiny_cfg(embed_dim=64, depth=3, num_heads=4, patch_size=4)
    img = (32, 64)
    model = VisionTransformer(cfg, img, 3, 2).eval()
    batch = 2
    # On CPU the fused SDPA kernel has no FLOP formula registered, so the counter would miss attention;
    # the math backend runs SDPA as two bmm calls that it does count.
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(torch.randn(batch, 3, *img))
    counted = counter.get_total_flops() / batch
    analytic = vit_flops_per_sample(cfg, img, 3, 2)
    assert counted == pytest.approx(analytic, rel=0.05)
    # The attention term matters at this size: leaving it out would miss the 5% window.
    n, d = 128, 64
    assert cfg.depth * 4 * n * n * d > 0.05 * analytic
