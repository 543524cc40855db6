"""A ViT with noise inputs (``model.noise_channels``, for CRPS training): the noise is read as channels after the
state's; given, it is used; for a bare state it is drawn in training mode and zero in inference mode; the
config's checks and the FLOP count."""

from __future__ import annotations

import pytest
import torch

from dlscale.errors import InvalidValue
from dlscale.models.vit import VisionTransformer, vit_flops_per_sample
from dlscale.models.vit_config import ViTConfig
from dlscale.training.train_config import TrainConfig

IMG = (16, 32)


def noise_model(mixer: str = "attention", noise_channels: int = 2) -> VisionTransformer:
    torch.manual_seed(0)
    cfg = ViTConfig(
        embed_dim=32, depth=2, num_heads=4, patch_size=4, mixer=mixer, noise_channels=noise_channels
    )
    latitudes = torch.linspace(84.375, -84.375, IMG[0]).tolist()
    return VisionTransformer(cfg, IMG, in_channels=3, out_channels=3, latitudes=latitudes)


@pytest.mark.parametrize("mixer", ["attention", "afno", "sfno"])
def test_given_noise_is_read_and_a_bare_state_gets_zero_noise_in_inference(mixer):
    model = noise_model(mixer).eval()
    assert model.patch_embed.proj.in_channels == 5
    state = torch.randn(2, 3, *IMG)
    with torch.no_grad():
        bare = model(state)
        zero = model(torch.cat([state, torch.zeros(2, 2, *IMG)], dim=1))
        noisy = model(torch.cat([state, torch.randn(2, 2, *IMG)], dim=1))
    torch.testing.assert_close(bare, zero, rtol=0, atol=0)
    assert not torch.allclose(bare, noisy)  # the noise changes the forecast


def test_a_bare_state_draws_noise_in_training_mode_from_torchs_generator():
    model = noise_model().train()
    state = torch.randn(2, 3, *IMG)
    torch.manual_seed(5)
    first = model(state)
    second = model(state)
    torch.manual_seed(5)
    again = model(state)
    assert not torch.allclose(first, second) and torch.equal(first, again)


def test_wrong_channel_counts_are_refused_naming_both_shapes():
    model = noise_model()
    with pytest.raises(ValueError, match=r"\(B, 3, 16, 32\) or, with its noise, \(B, 5, 16, 32\)"):
        model(torch.randn(1, 4, *IMG))
    with pytest.raises(ValueError, match=r"expected input of shape \(B, 3, 16, 32\), got"):
        noise_model(noise_channels=0)(torch.randn(1, 5, *IMG))


def test_the_flops_count_the_noise_channels_in_the_patch_embedding():
    plain = vit_flops_per_sample(ViTConfig(embed_dim=32, depth=2, num_heads=4, patch_size=4), IMG, 3, 3)
    noisy = vit_flops_per_sample(
        ViTConfig(embed_dim=32, depth=2, num_heads=4, patch_size=4, noise_channels=2), IMG, 3, 3
    )
    tokens = (16 // 4) * (32 // 4)
    assert noisy - plain == 2 * tokens * (2 * 4 * 4) * 32


@pytest.mark.parametrize(
    ("model", "train", "key", "fragment"),
    [
        ({}, {"loss": "crps", "ensemble_members": 4}, "train.loss", "model.noise_channels is 0"),
        ({"noise_channels": 4}, {}, "model.noise_channels", "set train.loss=crps"),
    ],
)
def test_noise_inputs_and_the_crps_loss_go_together(model, train, key, fragment):
    with pytest.raises(InvalidValue) as info:
        ViTConfig(**model).check_training(TrainConfig(**train))
    assert info.value.key == key and fragment in info.value.message
    ViTConfig(noise_channels=4).check_training(TrainConfig(loss="crps", ensemble_members=4))  # together: fine


def test_noise_channels_out_of_range_and_model_parallelism_are_refused():
    for value in (-1, 65):
        with pytest.raises(InvalidValue, match="^noise_channels: must be 0"):
            ViTConfig(noise_channels=value)
    with pytest.raises(InvalidValue, match="^parallel.tensor_parallel: 2 with model.noise_channels 4"):
        ViTConfig(noise_channels=4).check_parallel(2, 1)
    with pytest.raises(InvalidValue, match="^parallel.context_parallel: 2 with model.noise_channels 4"):
        ViTConfig(noise_channels=4).check_parallel(1, 2)
    ViTConfig(noise_channels=4).check_parallel(1, 1)
    ViTConfig().check_parallel(2, 2)  # attention without noise keeps its layouts
