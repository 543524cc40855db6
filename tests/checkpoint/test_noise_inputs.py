"""A weights-only start of a noise model from the same model without noise: the input weight widened by zeros, so
the started model forecasts what the checkpoint's did, whatever its noise; nothing else is bent to fit."""

from __future__ import annotations

import pytest
import torch

from dlscale.checkpoint.files import load_model_state
from dlscale.checkpoint.noise_inputs import widened_for_noise
from dlscale.errors import CheckpointError
from dlscale.models.vit import VisionTransformer
from dlscale.models.vit_config import ViTConfig

IMG = (16, 32)


def vit(noise_channels: int = 0, embed_dim: int = 32) -> VisionTransformer:
    torch.manual_seed(noise_channels)
    cfg = ViTConfig(embed_dim=embed_dim, depth=2, num_heads=4, patch_size=4, noise_channels=noise_channels)
    return VisionTransformer(cfg, IMG, 3, 3)


def test_the_started_noise_model_forecasts_what_the_deterministic_one_did_whatever_its_noise():
    deterministic, noisy = vit().eval(), vit(noise_channels=2).eval()
    state = {f"module.{k}": v for k, v in deterministic.state_dict().items()}  # a DDP-prefixed checkpoint
    load_model_state(noisy, widened_for_noise(noisy, state, "ckpt.pt"), "ckpt.pt")
    weight = noisy.patch_embed.proj.weight
    assert weight.shape[1] == 5 and torch.equal(weight[:, 3:], torch.zeros_like(weight[:, 3:]))
    inputs = torch.randn(2, 3, *IMG)
    with torch.no_grad():
        expected = deterministic(inputs)
        for noise in (torch.zeros(2, 2, *IMG), torch.randn(2, 2, *IMG)):
            torch.testing.assert_close(noisy(torch.cat([inputs, noise], dim=1)), expected, rtol=0, atol=0)


def test_other_mismatches_are_left_to_the_strict_loader():
    noisy = vit(noise_channels=2)
    wider = vit(embed_dim=64).state_dict()
    assert widened_for_noise(noisy, wider, "ckpt.pt") is wider  # not a noise-input difference: untouched
    with pytest.raises(CheckpointError, match="shape mismatches"):
        load_model_state(noisy, widened_for_noise(noisy, wider, "ckpt.pt"), "ckpt.pt")
    deterministic = vit()
    state = deterministic.state_dict()
    assert widened_for_noise(deterministic, state, "ckpt.pt") is state  # a model without noise: untouched
    own = noisy.state_dict()
    assert widened_for_noise(noisy, own, "ckpt.pt") is own  # already its shape
