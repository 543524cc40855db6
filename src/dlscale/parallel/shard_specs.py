"""Which parameters are shards of a serial parameter, and the serial model's gradient norm over those shards.

Modules that hold a shard of a serial parameter (tensor/context parallelism) say so with a ``shard_specs``
attribute: ``{parameter name: ShardSpec}``. Everything without one is replicated. Checkpoints gather and cut
state with these specs (:mod:`dlscale.checkpoint.sharded_state`); clipping and the divergence guard read the
serial model's gradient norm through them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dlscale.parallel.collectives import Group, all_gather_chunks, all_reduce_sum, group_size


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


def unshard(value: Any) -> Any:
    """A plain tensor from an FSDP2 parameter or moment (a DTensor sharded over dp; a collective)."""
    return value.full_tensor() if is_dtensor(value) else value


def is_dtensor(value: Any) -> bool:
    return type(value).__name__ == "DTensor"  # without importing torch.distributed.tensor in serial runs


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
    factor = float(scale) if any(is_dtensor(p.grad) for _, p in named) else scale  # DTensors take a number
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
        squared = unshard(param.grad.detach().float().pow(2).sum())
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
