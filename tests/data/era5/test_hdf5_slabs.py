"""SlabReader: HDF5 hyperslabs read straight into part of a larger array."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from dlscale.data.era5.hdf5_slabs import SlabReader


@pytest.fixture
def fields(tmp_path: Path):
    data = np.arange(6 * 3 * 4, dtype=np.float64).reshape(6, 3, 4)
    with h5py.File(tmp_path / "f.h5", "w") as out:
        out.create_dataset("fields", data=data)
    with h5py.File(tmp_path / "f.h5", "r") as handle:
        yield handle["fields"], data


def test_a_strided_selection_lands_in_its_block_and_nothing_else_is_written(fields):
    dataset, data = fields
    destination = np.full((2, 5, 2, 4), -1.0, dtype=np.float32)  # file values are float64: HDF5 converts
    reader = SlabReader(dataset, destination)
    # Times 1 and 4 (stride 3), channels 0-1, into row 3 of both halves.
    reader.read((1, 0, 0), (2, 2, 4), (3, 1, 1), (0, 3, 0, 0), (2, 1, 2, 4))
    np.testing.assert_array_equal(destination[0, 3], data[1, :2].astype(np.float32))
    np.testing.assert_array_equal(destination[1, 3], data[4, :2].astype(np.float32))
    untouched = np.delete(destination, 3, axis=1)
    assert (untouched == -1).all()
    # The reader is reusable: a second read goes to its own block.
    reader.read((0, 1, 0), (2, 2, 4), (1, 1, 1), (0, 0, 0, 0), (2, 1, 2, 4))
    np.testing.assert_array_equal(destination[:, 0], data[0:2, 1:3].astype(np.float32))
    np.testing.assert_array_equal(destination[0, 3], data[1, :2].astype(np.float32))


def test_a_selection_of_another_size_than_its_block_is_an_error(fields):
    dataset, _ = fields
    reader = SlabReader(dataset, np.zeros((4, 3, 4)))
    with pytest.raises(OSError, match="different number of elements"):  # 24 file elements, 12 places
        reader.read((0, 0, 0), (2, 3, 4), (1, 1, 1), (0, 0, 0), (1, 3, 4))


@pytest.mark.parametrize("make", [lambda: np.zeros((3, 4, 6))[:, :, ::2], lambda: np.zeros((2, 3, 4)).T])
def test_only_c_contiguous_writable_destinations(fields, make):
    with pytest.raises(ValueError, match="C-contiguous, writable"):
        SlabReader(fields[0], make())
    frozen = np.zeros((2, 3, 4))
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="C-contiguous, writable"):
        SlabReader(fields[0], frozen)
