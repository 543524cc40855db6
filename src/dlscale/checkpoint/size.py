"""How large a run's checkpoint will be, before the first one is written (for the free-space check).

A checkpoint holds the serial model's state (shards gathered to full shapes) and the optimizer's state, which
is created lazily at the first step and so cannot be measured at start: it is estimated from the optimizer's
kind (Adam and AdamW keep two moments per parameter, SGD one momentum buffer, Adadelta two running averages).
"""

from __future__ import annotations

from typing import Any

from dlscale.parallel.shard_specs import shard_specs
from dlscale.training.optim_config import OptimConfig

# Per-parameter state tensors each optimizer keeps, the same size as the parameter.
_STATE_TENSORS = {"Adam": 2, "AdamW": 2, "Adadelta": 2}
_OVERHEAD_BYTES = 64 << 10  # progress, history, config, RNG states and the archive's own records


def serial_state_bytes(model: Any) -> tuple[int, int]:
    """(bytes of the full model state, bytes of its trainable parameters) at the serial model's shapes."""
    specs = shard_specs(model)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    state_bytes = parameter_bytes = 0
    for name, tensor in model.state_dict().items():
        spec = specs.get(name)
        numel = tensor.numel()  # a DTensor (FSDP2) reports its global size
        if spec is not None:
            full = spec.full_shape(tensor)
            numel = 1
            for side in full:
                numel *= side
        size = numel * tensor.element_size()
        state_bytes += size
        if name in trainable:
            parameter_bytes += size
    return state_bytes, parameter_bytes


def estimate_checkpoint_bytes(model: Any, optim: OptimConfig) -> int:
    """Bytes of the checkpoint file of a run training ``model`` with ``optim`` (within a few percent for the
    shipped models)."""
    state_bytes, parameter_bytes = serial_state_bytes(model)
    tensors = _STATE_TENSORS.get(optim.optimizer, 1 if optim.momentum else 0)
    # Moments are kept in fp32 for fp32 parameters, which is what dlscale trains (autocast casts per operation).
    return state_bytes + tensors * parameter_bytes + _OVERHEAD_BYTES
