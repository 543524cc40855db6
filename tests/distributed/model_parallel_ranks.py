"""What each forked rank runs in the model-parallel tests: a serial ViT and its parallel form on the same data,
trained side by side; the results come back as numpy arrays for the parent to compare."""

from __future__ import annotations

import copy

import numpy as np
import torch

from dlscale.checkpoint.sharded_state import full_model_state
from dlscale.models.vit import VisionTransformer
from dlscale.models.vit_config import ViTConfig
from dlscale.parallel.collectives import split_sizes
from dlscale.parallel.data_parallel import wrap_data_parallel
from dlscale.parallel.mesh import MeshShape, ParallelMesh
from dlscale.parallel.parallel_config import ParallelConfig
from dlscale.parallel.shard_specs import clip_grad_norm_sharded
from dlscale.parallel.vit_parallel import parallelize_vit
from dlscale.runtime.device import Device
from dlscale.runtime.distributed import start_process_group, stop_process_group
from dlscale.runtime.launch import detect_process
from dlscale.scoring.metrics import relative_l2_loss

CHANNELS = 3


def tiny_vit(img_size: tuple[int, int], patch: int = 4, embed: int = 32, heads: int = 4) -> VisionTransformer:
    torch.manual_seed(0)
    cfg = ViTConfig(embed_dim=embed, depth=2, num_heads=heads, patch_size=patch, mlp_ratio=2.0)
    return VisionTransformer(cfg, img_size, CHANNELS, CHANNELS)


def batches(
    global_batch: int, img_size: tuple[int, int], steps: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    shape = (global_batch, CHANNELS, *img_size)
    return [
        (torch.randn(shape, generator=generator), torch.randn(shape, generator=generator))
        for _ in range(steps)
    ]


def start_mesh(tp: int, cp: int, order: str) -> tuple[ParallelMesh, Device]:
    process = detect_process()
    device = Device(torch.device("cpu"))
    start_process_group(process, device, timeout_s=120)
    shape = MeshShape.for_world(process.world_size, tp, cp, order)
    return ParallelMesh.create(shape, process.rank), device


def train_side_by_side(
    rank: int,
    tp: int,
    cp: int,
    order: str,
    img_size: tuple[int, int],
    local_batch: int,
    steps: int,
    patch: int = 4,
    max_grad_norm: float | None = None,
) -> dict:
    """Serial ViT on the global batch vs this rank's part of the parallel one on its dp shard.

    Returns the first step's output, loss and full gradients, then the full weights after ``steps`` Adam steps
    and this rank's local replicated weights (to check that replicas stay identical).
    """
    mesh, device = start_mesh(tp, cp, order)
    try:
        serial = tiny_vit(img_size, patch)
        model = parallelize_vit(copy.deepcopy(serial), mesh)
        trained = wrap_data_parallel(
            model,
            ParallelConfig(tensor_parallel=tp, context_parallel=cp, parallel_order=order),
            detect_process(),
            device,
            mesh,
        )
        serial_opt = torch.optim.Adam(serial.parameters(), lr=1e-3)
        parallel_opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        dp, dp_rank = mesh.dp_size, mesh.dp_rank
        result: dict = {}
        for step, (inputs, targets) in enumerate(batches(local_batch * dp, img_size, steps)):
            mine = slice(dp_rank * local_batch, (dp_rank + 1) * local_batch)
            serial_opt.zero_grad()
            serial_out = serial(inputs)
            serial_loss = relative_l2_loss(serial_out, targets)
            serial_loss.backward()
            parallel_opt.zero_grad()
            out = trained(inputs[mine])
            loss = relative_l2_loss(out, targets[mine])
            loss.backward()
            if max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(serial.parameters(), max_grad_norm)
                clip_grad_norm_sharded(model, max_grad_norm)
            if step == 0:
                grads = {n: p.grad for n, p in model.named_parameters()}
                full_grads = _full(model, grads)
                result["output"] = (out.detach().numpy(), serial_out[mine].detach().numpy())
                dp_loss = loss.detach().clone()
                if mesh.group("dp") is not None:
                    torch.distributed.all_reduce(dp_loss, group=mesh.group("dp"))
                result["loss"] = (float(dp_loss) / dp, float(serial_loss.detach()))
                result["grads"] = {
                    n: (full_grads[n], p.grad.numpy().copy()) for n, p in serial.named_parameters()
                }
            serial_opt.step()
            parallel_opt.step()
        full = {k: v.numpy() for k, v in full_model_state(model).items()}
        result["weights"] = {n: (full[n], p.detach().numpy().copy()) for n, p in serial.named_parameters()}
        result["local"] = {n: p.detach().numpy().copy() for n, p in model.named_parameters()}
        result["coordinates"] = mesh.coordinates
        result["token_sizes"] = split_sizes(serial.num_tokens, cp)
        return result
    finally:
        stop_process_group()


def _full(model: torch.nn.Module, grads: dict) -> dict[str, np.ndarray]:
    from dlscale.parallel.shard_specs import shard_specs

    specs = shard_specs(model)
    return {name: (specs[name].gather(g) if name in specs else g).numpy().copy() for name, g in grads.items()}


def saved_activation_bytes(
    rank: int, tp: int, cp: int, img_size: tuple[int, int], local_batch: int, amp: str
):
    """(measured, estimated) bytes this rank's part of the ViT saves for backward (dlscale plan's formula)."""
    from dlscale.perf.plan.layout_cost import ModelShape, estimate_activation_bytes
    from dlscale.perf.plan.saved_tensors import measure_saved_activation_bytes

    mesh, _ = start_mesh(tp, cp, "tp-cp-dp")
    try:
        torch.manual_seed(0)
        cfg = ViTConfig(embed_dim=64, depth=2, num_heads=4, patch_size=4)
        model = parallelize_vit(VisionTransformer(cfg, img_size, CHANNELS, CHANNELS), mesh)
        generator = torch.Generator().manual_seed(1)
        inputs = torch.randn(local_batch, CHANNELS, *img_size, generator=generator)
        targets = torch.randn(local_batch, CHANNELS, *img_size, generator=generator)
        dtype = {"none": None, "bf16": torch.bfloat16}[amp]
        measured = measure_saved_activation_bytes(
            model, inputs, lambda out: relative_l2_loss(out.float(), targets), dtype
        )
        shape = ModelShape.from_config(cfg, img_size, CHANNELS, CHANNELS)
        return measured, estimate_activation_bytes(shape, amp, local_batch, tp, cp).total
    finally:
        stop_process_group()
