"""Memory-mapped reads of ERA5 files: which datasets can be mapped, on which file systems ``auto`` maps them,
and that a mapped file that shrinks raises a DataError instead of killing the process."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import h5py
import numpy as np
import pytest
from test_era5_dataset import make_cfg, write_split, write_stats

from dlscale.data.era5 import mapped_fields
from dlscale.data.era5.dataset import ERA5Dataset
from dlscale.data.era5.mapped_fields import (
    MappedFields,
    choose_read_method,
    file_system_type,
    mapping_obstacle,
)
from dlscale.errors import DataError

FIELDS = np.arange(3 * 2 * 4 * 5, dtype=np.float32).reshape(3, 2, 4, 5) / 7


def write_fields(path: Path, data: np.ndarray | None = FIELDS, **options) -> Path:
    with h5py.File(path, "w") as out:
        if data is None:  # created, never written: no storage allocated
            out.create_dataset("fields", shape=FIELDS.shape, dtype="f4", **options)
        else:
            out.create_dataset("fields", data=data, **options)
    return path


@pytest.mark.parametrize(
    "data, options, obstacle",
    [
        (FIELDS, {}, None),
        (FIELDS, {"chunks": (1, 2, 4, 5)}, "not stored contiguously"),
        (FIELDS, {"compression": "gzip"}, "not stored contiguously"),
        (FIELDS.astype(np.float64), {}, "dtype is <f8"),
        (FIELDS.astype(">f4"), {}, "dtype is >f4"),
        (None, {}, "not allocated"),
    ],
    ids=["contiguous float32", "chunked", "compressed", "float64", "big-endian", "unwritten"],
)
def test_which_datasets_can_be_mapped(tmp_path, data, options, obstacle):
    path = write_fields(tmp_path / "f.h5", data, **options)
    with h5py.File(path, "r") as handle:
        found = mapping_obstacle(handle["fields"])
    if obstacle is None:
        assert found is None
    else:
        assert obstacle in found


def test_external_storage_is_not_mapped(tmp_path):
    raw = tmp_path / "fields.raw"
    FIELDS.tofile(raw)
    with h5py.File(tmp_path / "f.h5", "w") as out:
        out.create_dataset("fields", shape=FIELDS.shape, dtype="f4", external=[(str(raw), 0, FIELDS.nbytes)])
    with h5py.File(tmp_path / "f.h5", "r") as handle:
        assert "external files" in mapping_obstacle(handle["fields"])


def test_a_mapped_file_reads_what_hdf5_reads_and_refuses_to_read_once_it_shrank(tmp_path):
    path = write_fields(tmp_path / "f.h5")
    with h5py.File(path, "r") as handle:
        mapped = MappedFields(path, handle["fields"])
        np.testing.assert_array_equal(mapped.tensor.numpy(), FIELDS)
        mapped.check_size()
        os.truncate(path, path.stat().st_size - 4)
        with pytest.raises(DataError, match=r"f\.h5: file is \d+ bytes, but its data runs to byte \d+"):
            mapped.check_size()


def test_a_dataset_that_cannot_be_mapped_is_named(tmp_path):
    path = write_fields(tmp_path / "f.h5", chunks=(1, 2, 4, 5))
    with (
        h5py.File(path, "r") as handle,
        pytest.raises(DataError, match=r"f\.h5: dataset '/fields' cannot be"),
    ):
        MappedFields(path, handle["fields"])


@pytest.fixture
def mount_table(tmp_path, monkeypatch):
    table = tmp_path / "mounts"
    table.write_text(
        "/dev/vda / ext4 rw,relatime 0 0\n"
        "10.0.0.1@o2ib:/scratch /pscratch lustre rw,flock 0 0\n"
        "server:/export /home/with\\040space nfs4 rw 0 0\n"
        "tmpfs /dev/shm tmpfs rw 0 0\n"
    )
    monkeypatch.setattr(mapped_fields, "_MOUNTS", table)


@pytest.mark.parametrize(
    "path, expected",
    [
        ("/pscratch/sd/u/era5/train", "lustre"),
        ("/pscratch", "lustre"),
        ("/pscratchy/era5", "ext4"),  # a mount point is a whole path component
        ("/home/with space/era5", "nfs4"),
        ("/dev/shm/era5", "tmpfs"),
        ("/tmp/era5", "ext4"),
    ],
)
def test_file_system_type_from_the_mount_table(mount_table, path, expected):
    assert file_system_type(Path(path)) == expected


def test_no_mount_table_means_unknown(tmp_path, monkeypatch):
    monkeypatch.setattr(mapped_fields, "_MOUNTS", tmp_path / "absent")
    assert file_system_type(tmp_path) is None


def test_choice_of_read_method(tmp_path, monkeypatch):
    good = [write_fields(tmp_path / "1990.h5"), write_fields(tmp_path / "1991.h5")]
    chunked = [good[0], write_fields(tmp_path / "1992.h5", chunks=(1, 2, 4, 5))]
    monkeypatch.setattr(mapped_fields, "file_system_type", lambda path: "ext4")
    assert choose_read_method("auto", good) == ("mmap", "contiguous float32 files on ext4")
    assert choose_read_method("hdf5", good)[0] == "hdf5"
    method, why = choose_read_method("auto", chunked)
    assert method == "hdf5" and "1992.h5" in why and "not stored contiguously" in why
    with pytest.raises(DataError, match=r"data.read_method=mmap: .*1992\.h5"):
        choose_read_method("mmap", chunked)

    monkeypatch.setattr(mapped_fields, "file_system_type", lambda path: "lustre")
    method, why = choose_read_method("auto", good)
    assert method == "hdf5" and "lustre" in why and "data.read_method=mmap" in why
    assert choose_read_method("mmap", good)[0] == "mmap"  # asked for explicitly: mapped even there


def test_the_data_set_says_how_it_reads(tmp_path, caplog, monkeypatch):
    write_split(tmp_path, "train")
    write_stats(tmp_path, means=np.zeros(4), stds=np.ones(4))
    monkeypatch.setattr(mapped_fields, "file_system_type", lambda path: "ext4")
    with caplog.at_level(logging.INFO, logger="dlscale.data.era5.dataset"):
        mapped = ERA5Dataset(make_cfg(tmp_path), "train")
    assert mapped.read_method == "mmap"
    assert (
        "ERA5 train split: 3 files read through memory maps (contiguous float32 files on ext4)" in caplog.text
    )
    through_hdf5 = ERA5Dataset(make_cfg(tmp_path, read_method="hdf5"), "train")
    for index in (0, len(mapped) - 1):
        for a, b in zip(mapped[index], through_hdf5[index], strict=True):
            assert a.equal(b)
