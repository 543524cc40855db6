"""A weights-only start of a noise model from the same model without noise: the input weight widened by zeros, so
the started model forecasts what the checkpoint's did, whatever its noise; nothing else is bent to fit. From a
single file and from a sharded checkpoint alike."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dlscale.checkpoint.directory import CheckpointDir
from dlscale.checkpoint.distributed_state import load_model_shards, model_tensors
from dlscale.checkpoint.files import load_model_state
from dlscale.checkpoint.noise_inputs import widened_for_noise
from dlscale.checkpoint.sharded_writer import ShardedCheckpointWriter
from dlscale.checkpoint.training_state import restore_training
from dlscale.errors import CheckpointError
from dlscale.models.vit import VisionTransformer
from dlscale.models.vit_config import ViTConfig
from dlscale.runtime.device import Device
from dlscale.training.training_setup import RunRecord

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


# What restore_training needs of a sharded checkpoint's header to resume a run (it reads none of it here).
HEADER = {
    "optimizer": {"state": {}, "param_groups": []},
    "progress": {"global_step": 1},
    "rng": {},
    "meta": {},
    "config": {},
    "sharded": {"writer": "torch.distributed.checkpoint", "tensors": 0},
}


def sharded_checkpoint(model: torch.nn.Module, directory: Path) -> Path:
    """``model``'s weights as a run's sharded checkpoint (``checkpoint.format: dcp``) in ``directory``."""
    checkpoints = CheckpointDir(directory)
    writer = ShardedCheckpointWriter(checkpoints, is_main=True, asynchronous=False, device=Device("cpu"))
    writer.save(model_tensors(model), HEADER, 1, is_best=False)
    writer.close()
    return checkpoints.latest_path


def started_from(path: Path, model: torch.nn.Module, run: Path, weights_only: bool) -> None:
    """``dlscale train --resume path [--resume_weights_only]`` of ``model``, as far as its weights go."""
    record = RunRecord("tiny", "vit_era5.yaml", "era5_vit", (), {}, frozenset())
    setup = SimpleNamespace(model=model, record=record, process=SimpleNamespace(is_main=True))
    restore_training(setup, path, CheckpointDir(run), weights_only=weights_only)


def test_a_sharded_checkpoint_starts_the_noise_model_as_a_file_does(tmp_path, caplog):
    deterministic = vit().eval()
    path = sharded_checkpoint(deterministic, tmp_path / "deterministic")
    noisy = vit(noise_channels=4).eval()
    with caplog.at_level(logging.INFO, logger="dlscale.train"):
        started_from(path, noisy, tmp_path / "run", weights_only=True)
    assert "patch_embed.proj.weight widened from 3 to 7 input channels" in caplog.text
    saved, loaded = deterministic.state_dict(), noisy.state_dict()
    widened = loaded["patch_embed.proj.weight"]
    assert torch.equal(widened[:, :3], saved["patch_embed.proj.weight"])
    assert torch.equal(widened[:, 3:], torch.zeros_like(widened[:, 3:]))
    assert all(torch.equal(loaded[name], saved[name]) for name in saved if name != "patch_embed.proj.weight")
    inputs = torch.randn(2, 3, *IMG)
    with torch.no_grad():
        started = noisy(torch.cat([inputs, torch.zeros(2, 4, *IMG)], dim=1))
        torch.testing.assert_close(started, deterministic(inputs), rtol=0, atol=0)

    # A plain resume takes the checkpoint as the run's own: the narrower weight is a different model.
    narrow = r"model.patch_embed.proj.weight is \(32, 3, 4, 4\) in the checkpoint and \(32, 7, 4, 4\)"
    with pytest.raises(CheckpointError, match=narrow):
        started_from(path, vit(noise_channels=4), tmp_path / "run", weights_only=False)
    # Any other difference is refused by a weights-only start too: another width, or a model with other noise.
    wider = r"model.pos_embed is \(1, 32, 32\) in the checkpoint and \(1, 32, 64\)"
    with pytest.raises(CheckpointError, match=wider):
        load_model_shards(vit(noise_channels=2, embed_dim=64), path, "ckpt", weights_only=True)
    one_noise_channel = sharded_checkpoint(vit(noise_channels=1), tmp_path / "noise1")
    with pytest.raises(CheckpointError, match=r"\(32, 4, 4, 4\) in the checkpoint and \(32, 7, 4, 4\)"):
        load_model_shards(vit(noise_channels=4), one_noise_channel, "ckpt", weights_only=True)
