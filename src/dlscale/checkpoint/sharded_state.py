"""Layout-independent state: gather sharded parameters (and their optimizer moments) to the serial model's
shapes for a checkpoint, and cut a serial checkpoint back into this rank's shards when loading.

A checkpoint written by any dp x tp x cp layout therefore holds exactly what the serial model's checkpoint holds,
and a run resumes from it with any other layout (which parameters are shards: :mod:`dlscale.parallel.shard_specs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from dlscale.checkpoint.files import canonical_names
from dlscale.parallel.shard_specs import ShardSpec, is_dtensor, shard_specs, unshard


def _shard_like(value: Any, local: Any) -> Any:
    """``value`` (this rank's tp-sized tensor) sharded over dp the way the FSDP2 tensor ``local`` is."""
    if not (is_dtensor(local) and torch.is_tensor(value) and tuple(value.shape) == tuple(local.shape)):
        return value
    from torch.distributed.tensor import distribute_tensor

    value = value.to(local.device)
    try:
        # Every rank holds the same full tensor, so each can cut its own shard (no scatter from rank 0).
        return distribute_tensor(value, local.device_mesh, local.placements, src_data_rank=None)
    except TypeError:  # torch < 2.6 has no src_data_rank: it scatters rank 0's copy, the same values
        return distribute_tensor(value, local.device_mesh, local.placements)


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` with every shard gathered to its serial shape (all ranks must call it)."""
    state = {name: unshard(value) for name, value in model.state_dict().items()}
    for name, spec in shard_specs(model).items():
        state[name] = spec.gather(state[name])
    return state


def local_model_state(model: nn.Module, full_state: Mapping[str, Any]) -> Any:
    """``full_state`` (a serial checkpoint's model state) with each sharded entry cut to this rank's chunk.

    Entries whose shape is not the serial shape are passed through unchanged, so that the strict loader reports
    them as a mismatch instead of a slice of the wrong tensor being loaded.
    """
    if not isinstance(full_state, Mapping):
        return full_state  # the strict loader reports what it is instead
    specs = shard_specs(model)
    local_state = model.state_dict()
    ours = canonical_names(list(local_state))
    theirs = canonical_names(list(full_state))
    result = dict(full_state)
    for canonical, key in theirs.items():
        spec = specs.get(ours.get(canonical, ""))
        value = full_state[key]
        if spec is not None and torch.is_tensor(value):
            local = local_state[ours[canonical]]
            if tuple(value.shape) == spec.full_shape(local):
                result[key] = value = spec.take(value)
        if canonical in ours:
            result[key] = _shard_like(value, local_state[ours[canonical]])
    return result


def _parameter_specs(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[int, ShardSpec]:
    """{optimizer state index: ShardSpec} for the sharded parameters (indices as in ``state_dict()``)."""
    specs = shard_specs(model)
    by_identity = {id(p): specs.get(name) for name, p in model.named_parameters()}
    found, index = {}, 0
    for group in optimizer.param_groups:
        for param in group["params"]:
            spec = by_identity.get(id(param))
            if spec is not None:
                found[index] = spec
            index += 1
    return found


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``optimizer.state_dict()`` with the moments of sharded parameters gathered (all ranks must call it).

    A moment is any per-parameter state tensor of the parameter's shape (Adam's exp_avg, SGD's momentum);
    scalars such as Adam's step count are the same on every rank and kept as they are.
    """
    state = optimizer.state_dict()
    specs = _parameter_specs(model, optimizer)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    gathered = {}
    for index, entries in state["state"].items():
        spec = specs.get(index)
        shape = tuple(params[index].shape)
        entries = {key: unshard(value) for key, value in entries.items()}
        gathered[index] = {
            key: spec.gather(value) if _is_moment(value, shape, spec) else value
            for key, value in entries.items()
        }
    return {**state, "state": gathered}


def local_optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, full_state: Mapping[str, Any]
) -> Any:
    """A serial optimizer state with each sharded parameter's moments cut to this rank's chunk."""
    if not isinstance(full_state, Mapping):
        return full_state  # the optimizer's own loader reports what it is instead
    specs = _parameter_specs(model, optimizer)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = full_state.get("state")
    if not isinstance(state, Mapping):
        return dict(full_state)  # the optimizer's own loader reports the damage
    local = {}
    for index, entries in state.items():
        if not isinstance(entries, Mapping) or not isinstance(index, int) or not 0 <= index < len(params):
            local[index] = entries
            continue
        param, spec = params[index], specs.get(index)
        full_shape = spec.full_shape(param) if spec is not None else None
        local[index] = {
            key: _shard_like(
                spec.take(value) if torch.is_tensor(value) and tuple(value.shape) == full_shape else value,
                param,
            )
            for key, value in entries.items()
        }
    return {**full_state, "state": local}


def _is_moment(value: Any, shape: tuple[int, ...], spec: ShardSpec | None) -> bool:
    return spec is not None and torch.is_tensor(value) and value.ndim > 0 and tuple(value.shape) == shape
