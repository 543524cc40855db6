"""Reading HDF5 hyperslabs straight into part of a larger array, with h5py's low-level API.

h5py's ``dataset[selection]`` returns a new array per read. A loader that stacks samples into a batch then
writes every value twice (once into that array, once into the batch) and allocates per sample. Here the file
selection is mapped onto a selection of the batch itself, so HDF5 writes each value once, where it belongs,
and one call can fill several places of the batch (an input and its target at once).
"""

from __future__ import annotations

from collections.abc import Sequence

import h5py
import numpy as np
from h5py import h5s, h5t


class SlabReader:
    """Copies hyperslabs of ``dataset`` into hyperslabs of ``destination`` (a C-contiguous, writable array).

    Keeps its two dataspaces and the memory type between reads (h5py would otherwise create them per read, at
    a cost that is not small next to a read), so one reader serves one thread: build one per batch, not one
    shared by threads. HDF5 converts the values to the destination's dtype when the file's differs.
    """

    def __init__(self, dataset: h5py.Dataset, destination: np.ndarray):
        if not destination.flags.c_contiguous or not destination.flags.writeable:
            raise ValueError("SlabReader needs a C-contiguous, writable destination array")
        self._dataset = dataset
        self._destination = destination
        self._file_space = dataset.id.get_space()
        self._memory_space = h5s.create_simple(destination.shape)
        self._memory_type = h5t.py_create(destination.dtype)

    def read(
        self,
        start: Sequence[int],
        count: Sequence[int],
        stride: Sequence[int],
        into_start: Sequence[int],
        into_count: Sequence[int],
    ) -> None:
        """Copy the ``count`` elements per axis from ``start`` (every ``stride``-th) into the block at
        ``into_start`` of shape ``into_count``; both blocks hold the same number of elements, taken in C order.
        """
        self._file_space.select_hyperslab(tuple(start), tuple(count), tuple(stride))
        self._memory_space.select_hyperslab(tuple(into_start), tuple(into_count))
        self._dataset.id.read(self._memory_space, self._file_space, self._destination, self._memory_type)
