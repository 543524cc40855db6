"""Megatron-style tensor-parallel linears, cut from a serial ``nn.Linear``.

A column-parallel linear keeps a block of the output features (rows of the weight): each tp rank computes a
different slice of the output from the same input. A row-parallel linear keeps the matching block of input
features (columns): each rank multiplies its slice and the partial products are summed over tp. A column-parallel
layer followed by a row-parallel one (q/k/v -> proj, fc1 -> fc2) thus needs one all-reduce forward (after the row
layer) and one backward (the gradient of the shared input, see :func:`enter_tensor_parallel_region`).

Both keep the parameter names ``weight`` and ``bias``, so the parallel model's state-dict keys are the serial
model's; ``shard_specs`` says which of them are shards (see :mod:`dlscale.parallel.shard_specs`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dlscale.parallel.collectives import (
    Group,
    all_gather_to_group,
    copy_to_group,
    reduce_from_group,
    split_sizes,
)
from dlscale.parallel.shard_specs import ShardSpec


def _spec(full_length: int, dim: int, group: Group, size: int, index: int) -> ShardSpec:
    if full_length % size:
        raise ValueError(f"{full_length} features do not split evenly over {size} tensor-parallel ranks")
    return ShardSpec(dim, tuple(split_sizes(full_length, size)), index, group)


class ColumnParallelLinear(nn.Module):
    """This rank's block of output features of a serial linear (its weight rows and bias entries).

    ``sequence_group`` / ``sequence_sizes``: for context parallelism, the output (B, tokens, features) is then
    all-gathered along the tokens over that group, so every rank gets the full sequence (keys and values of
    attention); the gradients of the gathered sequence are reduce-scattered back.
    """

    def __init__(
        self,
        linear: nn.Linear,
        group: Group,
        size: int,
        index: int,
        sequence_group: Group = None,
        sequence_sizes: list[int] | None = None,
    ):
        super().__init__()
        rows = _spec(linear.out_features, 0, group, size, index)
        self.in_features, self.out_features = linear.in_features, rows.sizes[index]
        self.weight = nn.Parameter(rows.take(linear.weight.detach()))
        self.bias = None if linear.bias is None else nn.Parameter(rows.take(linear.bias.detach()))
        self.shard_specs = {"weight": rows} if size > 1 else {}
        if size > 1 and self.bias is not None:
            self.shard_specs["bias"] = rows
        self.sequence_group = sequence_group
        self.sequence_sizes = sequence_sizes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        if self.sequence_sizes is not None:
            y = all_gather_to_group(y, 1, self.sequence_sizes, self.sequence_group)
        return y

    def extra_repr(self) -> str:
        gathered = ", sequence gathered" if self.sequence_sizes is not None else ""
        return f"in_features={self.in_features}, out_features={self.out_features} (local){gathered}"


class RowParallelLinear(nn.Module):
    """This rank's block of input features of a serial linear; partial outputs are summed over the group.

    The bias is replicated and added once, after the sum.
    """

    def __init__(self, linear: nn.Linear, group: Group, size: int, index: int):
        super().__init__()
        columns = _spec(linear.in_features, 1, group, size, index)
        self.group = group
        self.in_features, self.out_features = columns.sizes[index], linear.out_features
        self.weight = nn.Parameter(columns.take(linear.weight.detach()))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())
        self.shard_specs = {"weight": columns} if size > 1 else {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_from_group(F.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features} (local), out_features={self.out_features}"


def enter_tensor_parallel_region(module: nn.Module, group: Group) -> None:
    """Mark ``module``'s input as shared by the tp ranks: its gradient is summed over them in backward.

    One pre-hook per attention or MLP, not one per column-parallel linear, so q, k and v share one all-reduce.
    """

    def copy_input(_module: nn.Module, args: tuple) -> tuple:
        return (copy_to_group(args[0], group), *args[1:])

    module.register_forward_pre_hook(copy_input)
