"""Collectives that autograd can differentiate, for tensor and context parallelism.

Each pair below is forward/backward of one another (the transpose of a linear map is its adjoint):

=====================  ==========================================  =========================================
function               forward                                     backward
=====================  ==========================================  =========================================
copy_to_group          identity (every rank holds the same x)      all-reduce (sum) of the gradient
reduce_from_group      all-reduce (sum) of partial results         identity
scatter_to_group       keep this rank's chunk along ``dim``        all-gather the chunks' gradients
gather_from_group      all-gather the chunks along ``dim``         keep this rank's chunk of the gradient
all_gather_to_group    all-gather the chunks along ``dim``         reduce-scatter (sum) of the gradient
reduce_scatter_group   reduce-scatter (sum) along ``dim``          all-gather of the gradient
scale_gradient         identity                                    gradient times a constant
=====================  ==========================================  =========================================

``gather_from_group`` and ``all_gather_to_group`` differ in backward: the first is for a tensor that every rank
then uses identically (each rank keeps its slice of the identical gradient), the second for one that each rank
uses differently (context-parallel keys and values: every rank's queries contribute a gradient to every key, so
the contributions are summed).

Chunks may be uneven (4050 tokens over 4 ranks): :func:`split_sizes` decides them. Gloo's all-gather needs equal
chunks, so every gather pads to the largest chunk and trims after; reduce-scatter falls back to all-reduce plus a
slice on builds whose backend lacks it. A ``group`` of None means a group of one rank: every function is then the
identity, so serial and parallel runs share one code path.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

Group = Any  # a torch.distributed ProcessGroup, or None for a group of one rank


def split_sizes(length: int, parts: int) -> list[int]:
    """Chunk lengths for ``length`` items over ``parts`` ranks: as equal as possible, the larger ones first.

    The same rule as ``torch.tensor_split`` (4050 over 4 -> [1013, 1013, 1012, 1012]), so no rank holds more
    than one item more than another.
    """
    if parts < 1:
        raise ValueError(f"cannot split over {parts} ranks")
    if length < parts:
        raise ValueError(f"cannot split {length} items over {parts} ranks: some rank would hold none")
    base, extra = divmod(length, parts)
    return [base + 1 if i < extra else base for i in range(parts)]


def group_size(group: Group) -> int:
    return 1 if group is None else dist.get_world_size(group)


def group_rank(group: Group) -> int:
    return 0 if group is None else dist.get_rank(group)


def _own_chunk(x: torch.Tensor, dim: int, group: Group) -> torch.Tensor:
    sizes = split_sizes(x.shape[dim], group_size(group))
    rank = group_rank(group)
    return x.split(sizes, dim=dim)[rank].contiguous()


def all_reduce_sum(x: torch.Tensor, group: Group) -> torch.Tensor:
    if group_size(group) == 1:
        return x
    total = x.contiguous().clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
    return total


def all_gather_chunks(x: torch.Tensor, dim: int, sizes: list[int], group: Group) -> torch.Tensor:
    """Concatenate every rank's chunk along ``dim``; chunk i has ``sizes[i]`` entries along ``dim``."""
    if group_size(group) == 1:
        return x
    largest = max(sizes)
    padded = _pad_to(x.contiguous(), dim, largest)
    chunks = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(chunks, padded, group=group)
    return torch.cat([chunk.narrow(dim, 0, size) for chunk, size in zip(chunks, sizes, strict=True)], dim=dim)


# Backends without reduce_scatter (gloo before torch 2.6) are remembered here after the first refusal.
_REDUCE_SCATTER_UNSUPPORTED: set[str] = set()


def reduce_scatter_chunks(x: torch.Tensor, dim: int, group: Group) -> torch.Tensor:
    """Sum ``x`` over the group and keep this rank's chunk along ``dim`` (chunks from :func:`split_sizes`)."""
    if group_size(group) == 1:
        return x
    sizes = split_sizes(x.shape[dim], group_size(group))
    rank = group_rank(group)
    backend = str(dist.get_backend(group))
    if backend not in _REDUCE_SCATTER_UNSUPPORTED:
        largest = max(sizes)
        inputs = [_pad_to(chunk.contiguous(), dim, largest) for chunk in x.split(sizes, dim=dim)]
        output = torch.empty_like(inputs[0])
        try:
            dist.reduce_scatter(output, inputs, op=dist.ReduceOp.SUM, group=group)
            return output.narrow(dim, 0, sizes[rank]).contiguous()
        except (RuntimeError, NotImplementedError):
            _REDUCE_SCATTER_UNSUPPORTED.add(backend)
    return _own_chunk(all_reduce_sum(x, group), dim, group)


def _pad_to(x: torch.Tensor, dim: int, length: int) -> torch.Tensor:
    missing = length - x.shape[dim]
    if missing == 0:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat([x, x.new_zeros(shape)], dim=dim)


class _CopyToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce_sum(grad, ctx.group), None


class _ReduceFromGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return all_reduce_sum(x, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _ScatterToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        ctx.sizes = split_sizes(x.shape[dim], group_size(group))
        return _own_chunk(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_chunks(grad, ctx.dim, ctx.sizes, ctx.group), None, None


class _GatherFromGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, sizes, group):
        ctx.dim, ctx.group = dim, group
        return all_gather_chunks(x, dim, sizes, group)

    @staticmethod
    def backward(ctx, grad):
        return _own_chunk(grad, ctx.dim, ctx.group), None, None, None


class _AllGatherToGroup(_GatherFromGroup):
    """The same gather forward; in backward every rank's gradient contributes to every chunk."""

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_chunks(grad, ctx.dim, ctx.group), None, None, None


class _ReduceScatterGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        ctx.sizes = split_sizes(x.shape[dim], group_size(group))
        return reduce_scatter_chunks(x, dim, group)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_chunks(grad, ctx.dim, ctx.sizes, ctx.group), None, None


class _ScaleGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def copy_to_group(x: torch.Tensor, group: Group) -> torch.Tensor:
    """Enter a region where each rank computes a different part from the same ``x`` (sums gradients back)."""
    return x if group_size(group) == 1 else _CopyToGroup.apply(x, group)


def reduce_from_group(x: torch.Tensor, group: Group) -> torch.Tensor:
    """Leave such a region: sum the ranks' partial results."""
    return x if group_size(group) == 1 else _ReduceFromGroup.apply(x, group)


def scatter_to_group(x: torch.Tensor, dim: int, group: Group) -> torch.Tensor:
    """This rank's chunk of ``x`` along ``dim`` (the chunks of :func:`split_sizes`)."""
    return x if group_size(group) == 1 else _ScatterToGroup.apply(x, dim, group)


def gather_from_group(x: torch.Tensor, dim: int, sizes: list[int], group: Group) -> torch.Tensor:
    """The whole tensor from every rank's chunk, to be used identically on every rank."""
    return x if group_size(group) == 1 else _GatherFromGroup.apply(x, dim, list(sizes), group)


def all_gather_to_group(x: torch.Tensor, dim: int, sizes: list[int], group: Group) -> torch.Tensor:
    """The whole tensor from every rank's chunk, used differently on each rank (gradients are summed back)."""
    return x if group_size(group) == 1 else _AllGatherToGroup.apply(x, dim, list(sizes), group)


def reduce_scatter_group(x: torch.Tensor, dim: int, group: Group) -> torch.Tensor:
    """This rank's chunk along ``dim`` of the sum of ``x`` over the group."""
    return x if group_size(group) == 1 else _ReduceScatterGroup.apply(x, dim, group)


def scale_gradient(x: torch.Tensor, factor: float) -> torch.Tensor:
    """``x`` unchanged; its gradient multiplied by ``factor`` on the way back."""
    return x if factor == 1 else _ScaleGradient.apply(x, factor)
