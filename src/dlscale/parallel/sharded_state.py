"""Layout-independent state: gather sharded parameters (and their optimizer moments) to the serial model's
shapes for a checkpoint, and cut a serial checkpoint back into this rank's shards when loading.

A checkpoint written by any dp x tp x cp layout therefore holds exactly what the serial model's checkpoint holds,
and a run resumes from it with any other layout. Modules that hold a shard of a serial parameter say so with a
``shard_specs`` attribute: ``{parameter name: ShardSpec}``. Everything without one is replicated and saved as is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dlscale.parallel.collectives import Group, all_gather_chunks, all_reduce_sum, group_size
from dlscale.train.checkpoint import canonical_names


@dataclass(frozen=True)
class ShardSpec:
    """This rank holds chunk ``index`` (of the chunks ``sizes``) along ``dim`` of a serial parameter."""

    dim: int
    sizes: tuple[int, ...]
    index: int
    group: Group  # the ranks holding the other chunks, in chunk order

    @property
    def offset(self) -> int:
        return sum(self.sizes[: self.index])

    def full_length(self) -> int:
        return sum(self.sizes)

    def take(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's chunk of the serial tensor ``full``."""
        return full.narrow(self.dim, self.offset, self.sizes[self.index]).clone()

    def gather(self, local: torch.Tensor) -> torch.Tensor:
        """The serial tensor from every rank's chunk (a collective over ``group``)."""
        return all_gather_chunks(local.detach(), self.dim, list(self.sizes), self.group)

    def full_shape(self, local: torch.Tensor) -> tuple[int, ...]:
        shape = list(local.shape)
        shape[self.dim] = self.full_length()
        return tuple(shape)


def shard_specs(model: nn.Module) -> dict[str, ShardSpec]:
    """{parameter name in ``model.state_dict()``: its ShardSpec} for every sharded parameter of ``model``."""
    specs = {}
    for module_name, module in model.named_modules():
        for param_name, spec in getattr(module, "shard_specs", {}).items():
            specs[f"{module_name}.{param_name}" if module_name else param_name] = spec
    return specs


def _unshard(value: Any) -> Any:
    """A plain tensor from an FSDP2 parameter or moment (a DTensor sharded over dp; a collective)."""
    return value.full_tensor() if _is_dtensor(value) else value


def _is_dtensor(value: Any) -> bool:
    return type(value).__name__ == "DTensor"  # without importing torch.distributed.tensor in serial runs


def _shard_like(value: Any, local: Any) -> Any:
    """``value`` (this rank's tp-sized tensor) sharded over dp the way the FSDP2 tensor ``local`` is."""
    if not (_is_dtensor(local) and torch.is_tensor(value) and tuple(value.shape) == tuple(local.shape)):
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
    state = {name: _unshard(value) for name, value in model.state_dict().items()}
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
        entries = {key: _unshard(value) for key, value in entries.items()}
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


def gradient_norm_sharded(model: nn.Module) -> torch.Tensor:
    """The serial model's total gradient norm (L2, as a device tensor), without changing the gradients.

    Read by the divergence guard, which must see a NaN or infinite gradient before the update applies it.
    """
    named = [(name, p) for name, p in model.named_parameters() if p.grad is not None]
    if not named:
        return torch.zeros(())
    return _total_norm(named, shard_specs(model))


def clip_grad_norm_sharded(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Clip the gradients to a total norm of ``max_norm``, the norm being the serial model's; return the norm.

    A shard's squared norm is summed over the ranks holding the other shards; replicated parameters count once.
    With no sharded parameters this is ``torch.nn.utils.clip_grad_norm_``.
    """
    specs = shard_specs(model)
    if not specs:
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    named = [(name, p) for name, p in model.named_parameters() if p.grad is not None]
    if not named:
        return torch.zeros(())
    norm = _total_norm(named, specs)
    scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    factor = float(scale) if any(_is_dtensor(p.grad) for _, p in named) else scale  # DTensors take a number
    for _, param in named:
        param.grad.detach().mul_(factor if isinstance(factor, float) else factor.to(param.grad.dtype))
    return norm


def _total_norm(named: list[tuple[str, nn.Parameter]], specs: dict[str, ShardSpec]) -> torch.Tensor:
    """sqrt of the sum of every gradient's squares, each shard's summed over the ranks holding the others."""
    device = named[0][1].grad.device
    replicated = torch.zeros((), dtype=torch.float32, device=device)
    sharded: dict[Any, torch.Tensor] = {}
    for name, param in named:
        # An FSDP2 gradient is a DTensor sharded over dp: its full_tensor() sums the shards' squares.
        squared = _unshard(param.grad.detach().float().pow(2).sum())
        spec = specs.get(name)
        if spec is None:
            replicated += squared
        else:
            key = id(spec.group) if spec.group is not None else None
            sharded.setdefault(key, torch.zeros((), dtype=torch.float32, device=device))
            sharded[key] += squared
    groups = {id(s.group) if s.group is not None else None: s.group for s in specs.values()}
    total = replicated.clone()
    for key, partial in sharded.items():
        total += all_reduce_sum(partial, groups[key]) if group_size(groups[key]) > 1 else partial
    return total.sqrt()


__all__ = [
    "ShardSpec",
    "clip_grad_norm_sharded",
    "gradient_norm_sharded",
    "full_model_state",
    "full_optimizer_state",
    "local_model_state",
    "local_optimizer_state",
    "shard_specs",
]
