"""A weights-only start of a noise model under FSDP2 from the sharded checkpoint of an FSDP2 run without noise, on
2 forked gloo ranks: every rank reads the checkpoint's narrower input weight whole, widens it by zeros and keeps
its own FSDP2 shard of it, the shard that FSDP2 cuts from the serial widened weight."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from forked_ranks import run_ranks

from dlscale.checkpoint.directory import CheckpointDir
from dlscale.checkpoint.distributed_state import load_model_shards, model_tensors
from dlscale.checkpoint.noise_inputs import widened_for_noise
from dlscale.checkpoint.sharded_state import full_model_state
from dlscale.checkpoint.sharded_writer import ShardedCheckpointWriter
from dlscale.models.vit import VisionTransformer
from dlscale.models.vit_config import ViTConfig
from dlscale.parallel.fully_sharded import shard_fully
from dlscale.runtime.device import Device
from dlscale.runtime.distributed import start_process_group, stop_process_group
from dlscale.runtime.launch import detect_process

IMG = (16, 32)
CPU = Device("cpu")
NOISE = "patch_embed.proj.weight"


def vit(noise_channels: int = 0) -> VisionTransformer:
    torch.manual_seed(noise_channels)
    cfg = ViTConfig(embed_dim=32, depth=2, num_heads=4, patch_size=4, noise_channels=noise_channels)
    return VisionTransformer(cfg, IMG, 3, 3)


def fsdp2(model: VisionTransformer) -> VisionTransformer:
    """``model`` sharded as ``parallel.data_parallel: fsdp`` shards the ERA5 ViT (its blocks, then the root)."""
    return shard_fully(model, list(model.blocks), None, CPU.torch.type)


def start_noise_model_from_shards(rank: int, directory: Path) -> dict:
    """Save the deterministic ViT's FSDP2 shards, start the FSDP2 noise ViT from them weights-only; return this
    rank's shard of the noise-input weight (with FSDP2's own placement of it before and after) and the whole
    started model."""
    start_process_group(detect_process(), CPU, timeout_s=120)
    try:
        checkpoints = CheckpointDir(directory)
        writer = ShardedCheckpointWriter(checkpoints, is_main=rank == 0, asynchronous=False, device=CPU)
        writer.save(model_tensors(fsdp2(vit())), {"sharded": {}}, 1, is_best=False)
        writer.close()  # every rank returns once rank 0 has published the checkpoint
        noisy = fsdp2(vit(noise_channels=4))
        own = noisy.state_dict()[NOISE]
        load_model_shards(noisy, checkpoints.latest_path, "ckpt", weights_only=True)
        started = noisy.state_dict()[NOISE]
        return {
            "shard": started.to_local().numpy().copy(),
            "placement": [
                (tuple(w.to_local().shape), str(w.placements), w.device_mesh.mesh.tolist())
                for w in (own, started)
            ],
            "model": {name: value.numpy() for name, value in full_model_state(noisy).items()},
        }
    finally:
        stop_process_group()


def test_each_fsdp2_rank_holds_its_shard_of_the_serial_widened_weight(tmp_path):
    serial = widened_for_noise(vit(noise_channels=4), vit().state_dict(), "ckpt")
    ranks = run_ranks(2, start_noise_model_from_shards, tmp_path / "deterministic", timeout_s=120)
    for rank, result in enumerate(ranks):
        own, started = result["placement"]
        assert own == started and own[0] == (16, 7, 4, 4)  # FSDP2's own Shard(0) of the widened weight
        assert np.array_equal(result["shard"], serial[NOISE].chunk(2)[rank].numpy())
        assert result["model"].keys() == serial.keys()
        for name, value in serial.items():
            assert np.array_equal(result["model"][name], value.numpy()), f"rank {rank}: {name}"
