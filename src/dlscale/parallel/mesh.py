"""The dp x tp x cp mesh: which ranks form which group, and the process groups themselves.

Ranks are laid out by ``parallel_order`` (e.g. ``tp-cp-dp``): the first name varies fastest, so its groups are
made of adjacent ranks, which a launcher places on the same node (NVLink). With tp=2, cp=2, dp=2 and order
``tp-cp-dp``, rank = tp_index + 2 * cp_index + 4 * dp_index: tp groups are {0,1} {2,3} ..., cp groups {0,2}
{1,3} {4,6} {5,7}, dp groups {0,4} {1,5} {2,6} {3,7}.

Besides one group per dimension there are the combined ones the parallel model needs: ``dp-cp`` (the ranks that
hold the same tensor-parallel shard: gradients are averaged over them) and ``tp-cp`` (one model replica: its
ranks see the same samples and must start from the same weights).

:class:`MeshShape` is pure rank arithmetic (testable without processes); :class:`ParallelMesh` adds the
torch.distributed groups of the running job.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from dlscale.errors import ConfigError

log = logging.getLogger("dlscale.parallel")

DIMENSIONS = ("tp", "cp", "dp")
# The groups a run creates: one per dimension, and the combinations the parallel model reduces over.
GROUP_NAMES = ("tp", "cp", "dp", "dp-cp", "tp-cp")


@dataclass(frozen=True)
class MeshShape:
    """Sizes of tp, cp and dp and the order in which they are laid over the ranks (first = adjacent ranks)."""

    tp: int = 1
    cp: int = 1
    dp: int = 1
    order: tuple[str, ...] = ("tp", "cp", "dp")

    @classmethod
    def for_world(
        cls, world_size: int, tensor_parallel: int, context_parallel: int, order: str = "tp-cp-dp"
    ) -> MeshShape:
        """The mesh of ``world_size`` ranks: dp is what tp x cp leaves; errors name the sizes that do not fit."""
        names = tuple(order.split("-"))
        if sorted(names) != sorted(DIMENSIONS):
            raise ConfigError(f"parallel.parallel_order: must name each of tp, cp, dp once, got {order!r}")
        for key, size in (("tensor_parallel", tensor_parallel), ("context_parallel", context_parallel)):
            if size < 1:
                raise ConfigError(f"parallel.{key}: must be >= 1, got {size}")
        model_parallel = tensor_parallel * context_parallel
        if world_size % model_parallel:
            raise ConfigError(
                f"{world_size} rank(s) cannot be split into model replicas of tensor_parallel x context_parallel = "
                f"{tensor_parallel} x {context_parallel} = {model_parallel} ranks; launch a multiple of "
                f"{model_parallel} ranks or change the sizes"
            )
        return cls(tensor_parallel, context_parallel, world_size // model_parallel, names)

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp

    def size(self, name: str) -> int:
        """Ranks in one group called ``name`` (a dimension or a combination such as ``dp-cp``)."""
        size = 1
        for dim in _dims_of(name):
            size *= getattr(self, dim)
        return size

    def _strides(self) -> dict[str, int]:
        strides, stride = {}, 1
        for dim in self.order:
            strides[dim] = stride
            stride *= getattr(self, dim)
        return strides

    def coordinates(self, rank: int) -> dict[str, int]:
        """{'tp': i, 'cp': j, 'dp': k}: where ``rank`` sits on each dimension."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a mesh of {self.world_size} ranks")
        strides = self._strides()
        return {dim: (rank // strides[dim]) % getattr(self, dim) for dim in DIMENSIONS}

    def rank_at(self, coordinates: dict[str, int]) -> int:
        strides = self._strides()
        return sum(coordinates[dim] * strides[dim] for dim in DIMENSIONS)

    def groups(self, name: str) -> list[list[int]]:
        """Every group called ``name``: the ranks that differ only in the dimensions ``name`` lists.

        Within a group, ranks are ordered by their index along those dimensions (the first dimension of the
        mesh order fastest), so group rank i holds chunk i of whatever the group splits.
        """
        varying = [dim for dim in self.order if dim in _dims_of(name)]
        fixed = [dim for dim in DIMENSIONS if dim not in varying]
        found = []
        for fixed_index in itertools.product(*(range(getattr(self, dim)) for dim in fixed)):
            base = dict(zip(fixed, fixed_index, strict=True))
            members = []
            # itertools.product varies its last factor fastest; reverse so the first mesh dimension does.
            for varying_index in itertools.product(*(range(getattr(self, d)) for d in reversed(varying))):
                coords = {**base, **dict(zip(reversed(varying), varying_index, strict=True))}
                members.append(self.rank_at(coords))
            found.append(members)
        return sorted(found)

    def group_of(self, name: str, rank: int) -> list[int]:
        """The members of the group called ``name`` that holds ``rank``."""
        return next(group for group in self.groups(name) if rank in group)

    def describe(self) -> str:
        return f"dp={self.dp} x tp={self.tp} x cp={self.cp} (order {'-'.join(self.order)})"


def _dims_of(name: str) -> tuple[str, ...]:
    dims = tuple(name.split("-"))
    unknown = [dim for dim in dims if dim not in DIMENSIONS]
    if unknown or len(set(dims)) != len(dims):
        raise ValueError(f"unknown group name {name!r}; expected dimensions from {DIMENSIONS} joined by '-'")
    return dims


class ParallelMesh:
    """The mesh of the running job: this rank's coordinates and the process groups it belongs to.

    Groups of size 1 are ``None``: the collectives in :mod:`dlscale.parallel.collectives` treat ``None`` as
    "nothing to communicate", so a serial run goes through the same code paths without any group.
    """

    def __init__(self, shape: MeshShape, rank: int, groups: dict[str, Any] | None = None):
        self.shape = shape
        self.rank = rank
        self.coordinates = shape.coordinates(rank)
        self._groups = groups or {}

    @classmethod
    def create(cls, shape: MeshShape, rank: int) -> ParallelMesh:
        """Create every group of the mesh (a collective: all ranks call it, in the same order)."""
        groups: dict[str, Any] = {}
        distributed = dist.is_available() and dist.is_initialized()
        if distributed and dist.get_world_size() != shape.world_size:
            raise ConfigError(
                f"the mesh {shape.describe()} needs {shape.world_size} ranks, but {dist.get_world_size()} joined"
            )
        for name in GROUP_NAMES:
            if shape.size(name) == 1 or not distributed:
                continue
            # new_group must be called by every rank for every group, even the groups it is not in.
            for members in shape.groups(name):
                group = dist.new_group(members)
                if rank in members:
                    groups[name] = group
        return cls(shape, rank, groups)

    @classmethod
    def serial(cls) -> ParallelMesh:
        return cls(MeshShape(), 0)

    def group(self, name: str) -> Any:
        """The process group called ``name`` that holds this rank, or None when that group has one rank."""
        return self._groups.get(name)

    def size(self, name: str) -> int:
        return self.shape.size(name)

    def index(self, name: str) -> int:
        """This rank's position inside its group ``name`` (0 .. size - 1)."""
        return self.shape.group_of(name, self.rank).index(self.rank)

    @property
    def dp_size(self) -> int:
        return self.shape.dp

    @property
    def dp_rank(self) -> int:
        return self.coordinates["dp"]

    @property
    def is_model_parallel(self) -> bool:
        return self.shape.tp * self.shape.cp > 1


def layout_table(shape: MeshShape, parameters_per_rank: list[int] | None = None) -> list[str]:
    """The start-of-run lines: one row per rank (its coordinates and parameter count) and every group."""
    lines = [f"Parallel layout: {shape.describe()}, {shape.world_size} rank(s)"]
    header = "  rank  dp  tp  cp"
    if parameters_per_rank is not None:
        header += f"  {'parameters':>14}"
    lines.append(header)
    for rank in range(shape.world_size):
        c = shape.coordinates(rank)
        row = f"  {rank:>4}  {c['dp']:>2}  {c['tp']:>2}  {c['cp']:>2}"
        if parameters_per_rank is not None:
            row += f"  {parameters_per_rank[rank]:>14,}"
        lines.append(row)
    for name in GROUP_NAMES:
        if shape.size(name) > 1:
            groups = " ".join("{" + ",".join(map(str, g)) + "}" for g in shape.groups(name))
            lines.append(f"  {name} groups: {groups}")
    return lines
