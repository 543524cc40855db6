"""The 24 orientations of a cube (its proper rotation group), applied to (channel, x, y, z) volumes.

An orientation is an axis permutation combined with axis reversals: output axis ``k`` is input axis
``permutation[k]``, reversed when ``flips[k]``. In centred coordinates a point ``p`` of the input moves to
``q = R p`` with ``R[k, permutation[k]] = -1 if flips[k] else +1``. Of the 48 such matrices (6 permutations x
8 flip patterns) the 24 with determinant +1 are the rotations; the other 24 are reflections. The 24 rotations
form a group: they are distinct, composing two gives a third (:func:`compose`), each has an inverse.

Index 0 is the identity; the others follow in a fixed order (permutations in lexicographic order, then flip
patterns), so an index means the same orientation in every run.

The tutorial's own 24 views (numpy transposes with ``[::-1]`` reversals) were 16 rotations and 8 reflections,
which is not a group and mirrors the physics in a third of the samples; dlscale does not reproduce that set.

Vector channels: a velocity field rotates with the volume, ``v'(q) = R v(R^-1 q)``, i.e. velocity component
``k`` of the output is ``±`` component ``permutation[k]`` of the input. Passing the channel indices of the
(x, y, z) components as ``vector_channels`` applies that; without them the channels move with the voxels but
keep their meaning, which is what the tutorial did.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Orientation:
    """Output axis ``k`` is input axis ``permutation[k]``, reversed when ``flips[k]``."""

    permutation: tuple[int, int, int]
    flips: tuple[bool, bool, bool]

    @property
    def matrix(self) -> np.ndarray:
        """The 3x3 integer matrix R that maps centred input coordinates to output coordinates."""
        result = np.zeros((3, 3), dtype=np.int64)
        for k, axis in enumerate(self.permutation):
            result[k, axis] = -1 if self.flips[k] else 1
        return result

    @property
    def is_identity(self) -> bool:
        return self.permutation == (0, 1, 2) and not any(self.flips)


def _permutation_sign(permutation: tuple[int, ...]) -> int:
    inversions = sum(
        1 for i, j in itertools.combinations(range(len(permutation)), 2) if permutation[i] > permutation[j]
    )
    return -1 if inversions % 2 else 1


def _rotations() -> tuple[Orientation, ...]:
    found = []
    for permutation in itertools.permutations(range(3)):
        for flips in itertools.product((False, True), repeat=3):
            flip_sign = -1 if sum(flips) % 2 else 1
            if _permutation_sign(permutation) * flip_sign == 1:  # det(R) = +1: a rotation, not a reflection
                found.append(Orientation(tuple(permutation), tuple(flips)))  # type: ignore[arg-type]
    return tuple(found)


ORIENTATIONS: tuple[Orientation, ...] = _rotations()
NUM_ORIENTATIONS = len(ORIENTATIONS)  # 24
assert ORIENTATIONS[0].is_identity and NUM_ORIENTATIONS == 24

_INDEX_OF_MATRIX = {orientation.matrix.tobytes(): i for i, orientation in enumerate(ORIENTATIONS)}


def orientation_index(matrix: np.ndarray) -> int:
    """The index of the rotation with this 3x3 matrix; ValueError if it is none of the 24."""
    key = np.asarray(matrix, dtype=np.int64).tobytes()
    if key not in _INDEX_OF_MATRIX:
        raise ValueError(f"not one of the 24 cube rotations:\n{np.asarray(matrix)}")
    return _INDEX_OF_MATRIX[key]


def compose(first: int, second: int) -> int:
    """The index of applying orientation ``first``, then ``second``."""
    return orientation_index(ORIENTATIONS[second].matrix @ ORIENTATIONS[first].matrix)


def inverse(index: int) -> int:
    """The index of the orientation that undoes ``index``."""
    return orientation_index(ORIENTATIONS[index].matrix.T)


def _check_vector_channels(vector_channels: Sequence[int], channels: int) -> None:
    if vector_channels and (len(vector_channels) != 3 or not all(0 <= c < channels for c in vector_channels)):
        raise ValueError(
            f"vector_channels must be 3 channel indices below {channels} (x, y, z), got {list(vector_channels)}"
        )


def orient_array(volume: np.ndarray, index: int, vector_channels: Sequence[int] = ()) -> np.ndarray:
    """A new C-contiguous (C, X, Y, Z) array: ``volume`` in orientation ``index``.

    ``vector_channels`` (x, y, z component channels) are also rotated: permuted and sign-flipped.
    """
    orientation = ORIENTATIONS[index]
    _check_vector_channels(vector_channels, volume.shape[0])
    moved = np.transpose(volume, (0, *(1 + axis for axis in orientation.permutation)))
    reversed_axes = tuple(1 + k for k in range(3) if orientation.flips[k])
    if reversed_axes:
        moved = np.flip(moved, axis=reversed_axes)
    out = np.array(moved, order="C")  # always a copy: the caller's volume is never written
    if vector_channels:
        components = out[list(vector_channels)]  # a copy of the moved components
        for k, channel in enumerate(vector_channels):
            source = components[orientation.permutation[k]]
            if orientation.flips[k]:
                np.negative(source, out=out[channel])
            else:
                out[channel] = source
    return out


def orient_tensor(
    volume: torch.Tensor, index: int, vector_channels: Sequence[int] = (), out: torch.Tensor | None = None
) -> torch.Tensor:
    """The torch twin of :func:`orient_array` for one (C, X, Y, Z) tensor, written into ``out`` if given.

    Only moves and negations, so it is bitwise equal to :func:`orient_array` on any device.
    """
    orientation = ORIENTATIONS[index]
    _check_vector_channels(vector_channels, volume.shape[0])
    moved = volume.permute(0, *(1 + axis for axis in orientation.permutation))
    reversed_dims = [1 + k for k in range(3) if orientation.flips[k]]
    if reversed_dims:
        moved = moved.flip(reversed_dims)
    if out is None:
        out = torch.empty(moved.shape, dtype=volume.dtype, device=volume.device)
    out.copy_(moved)
    if vector_channels:
        components = out[list(vector_channels)]  # advanced indexing copies
        for k, channel in enumerate(vector_channels):
            source = components[orientation.permutation[k]]
            if orientation.flips[k]:
                torch.neg(source, out=out[channel])
            else:
                out[channel].copy_(source)
    return out


def orient_batch(
    batch: torch.Tensor, indices: Sequence[int], vector_channels: Sequence[int] = ()
) -> torch.Tensor:
    """A new (B, C, X, Y, Z) tensor with sample ``b`` of ``batch`` in orientation ``indices[b]``."""
    if len(indices) != batch.shape[0]:
        raise ValueError(f"{len(indices)} orientations for a batch of {batch.shape[0]}")
    out = torch.empty_like(batch, memory_format=torch.contiguous_format)
    for position, index in enumerate(indices):
        orient_tensor(batch[position], int(index), vector_channels, out=out[position])
    return out
