"""Reading contiguous, uncompressed float32 HDF5 datasets through a memory map instead of HDF5 calls.

An HDF5 read copies the file's bytes into the caller's memory (``pread``), after which the loader copies or
normalizes them again. A dataset stored contiguously and without filters is a plain array at a fixed offset
of its file, so the loader can map it and copy each sample straight out of the page cache into its batch
row: one pass less, no HDF5 call per sample. On the demo data the loader then runs about twice as fast as
through HDF5 (benchmarks/io_overhead.py), with bitwise the same values.

Memory maps fault pages in 4 KiB at a time, which parallel file systems (Lustre, GPFS, ...) serve far worse
than HDF5's large reads, so ``read_method: auto`` maps files only on local file systems.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import h5py
import numpy as np
import torch
from h5py import h5d

from dlscale.data.era5.layout import FIELDS_KEY
from dlscale.errors import DataError

# The file systems ``auto`` maps files on: local disks and memory. Anything else (Lustre, GPFS, NFS, BeeGFS,
# CephFS, FUSE mounts, ...) or unknown is read through HDF5.
LOCAL_FILE_SYSTEMS = frozenset(
    {
        "ext2",
        "ext3",
        "ext4",
        "xfs",
        "btrfs",
        "zfs",
        "f2fs",
        "jfs",
        "reiserfs",
        "tmpfs",
        "ramfs",
        "overlay",
        "apfs",
    }
)
_MOUNTS = Path("/proc/self/mounts")


def mapping_obstacle(dataset: h5py.Dataset) -> str | None:
    """Why ``dataset`` cannot be read through a memory map, or None if it can."""
    plist = dataset.id.get_create_plist()
    if plist.get_layout() != h5d.CONTIGUOUS:
        return "it is not stored contiguously (chunked, so perhaps compressed, or compact)"
    if plist.get_external_count() > 0:
        return "its data lives in external files"
    if dataset.dtype != np.dtype("=f4"):
        return f"its dtype is {dataset.dtype.str}, not this machine's float32"
    if dataset.id.get_offset() is None:
        return "its data is not allocated in the file"
    return None


def file_system_type(path: Path) -> str | None:
    """The type of the file system holding ``path`` (``ext4``, ``lustre``, ...), or None if unknown."""
    try:
        lines = _MOUNTS.read_text().splitlines()
    except OSError:
        return None  # no Linux mount table (macOS, ...)
    target = str(Path(path).resolve())
    best, best_type = "", None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        # The mount table escapes spaces and other characters in paths as octal codes (\040).
        mount_point = re.sub(r"\\([0-7]{3})", lambda code: chr(int(code.group(1), 8)), fields[1])
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best):
            best, best_type = mount_point, fields[2]
    return best_type


class MappedFields:
    """The (T, C, H, W) float32 dataset of one HDF5 file, as a read-only tensor over a memory map of the file.

    Reading pages beyond the end of a file that shrank after mapping kills the process (SIGBUS), and the rest
    of a partly cut page reads as zeros, instead of raising: :meth:`check_size` compares the file with the
    mapped range (at creation here); a reader holding the map checks before each batch that the file has not
    shrunk (``ERA5Dataset`` does, for both of its read methods).
    """

    def __init__(self, path: Path, dataset: h5py.Dataset):
        obstacle = mapping_obstacle(dataset)
        if obstacle is not None:
            raise DataError(f"{path}: dataset '{dataset.name}' cannot be memory-mapped: {obstacle}")
        self.path = path
        offset = dataset.id.get_offset()
        self._end = offset + dataset.id.get_storage_size()
        self.check_size()
        array = np.memmap(path, dtype=np.float32, mode="r", offset=offset, shape=dataset.shape)
        with warnings.catch_warnings():
            # torch warns that the array is read-only: the tensor is only ever a copy source.
            warnings.simplefilter("ignore", UserWarning)
            self.tensor = torch.from_numpy(array)
        # The mapping and HDF5 must agree; a wrong offset would otherwise read plausible garbage.
        first_row = dataset[0, 0, 0]
        if not np.array_equal(self.tensor[0, 0, 0].numpy(), first_row, equal_nan=True):
            raise DataError(f"{path}: the memory map of '{dataset.name}' does not match what HDF5 reads")

    def check_size(self) -> None:
        """Raise DataError if the file no longer holds the mapped bytes (truncated since it was opened)."""
        size = os.stat(self.path).st_size
        if size < self._end:
            raise DataError(
                f"{self.path}: file is {size} bytes, but its data runs to byte {self._end} (truncated?)"
            )


def choose_read_method(requested: str, files: list[Path]) -> tuple[str, str]:
    """``("mmap" | "hdf5", why)`` for a split's files under ``data.read_method`` = ``requested``.

    ``hdf5`` always reads through HDF5. ``mmap`` maps every file, and fails naming a file that cannot be
    mapped. ``auto`` maps the files when they are on a local file system and all can be mapped, else reads
    through HDF5.
    """
    if requested == "hdf5":
        return "hdf5", "data.read_method=hdf5"
    file_system = file_system_type(files[0].parent)
    if requested == "auto" and file_system is not None and file_system not in LOCAL_FILE_SYSTEMS:
        return "hdf5", (
            f"the files are on {file_system}, where memory maps read slowly; data.read_method=mmap forces them"
        )
    for path in files:
        with h5py.File(path, "r") as handle:
            dataset = handle[FIELDS_KEY]
            try:
                MappedFields(path, dataset)
            except DataError as exc:
                if requested == "mmap":
                    raise DataError(f"data.read_method=mmap: {exc}") from exc
                return "hdf5", f"{exc}; data.read_method=hdf5 makes this choice explicit"
    return "mmap", f"contiguous float32 files on {file_system or 'a local file system'}"
