"""The chunk files of an array in a zarr store on a local disk, and what is wrong with one.

zarr reads a chunk it does not find as the array's fill value: the zarr spec's meaning of a chunk never
written (zarr 3 leaves out every chunk that holds only the fill value). zarr 2 and 3 read a directory or a
dangling link in a chunk's place the same way, and zarr 2 a symbolic link loop too: silently, as NaN or zeros.
A file that is no regular file (a link to a pipe or a device) would hang a read or fill memory. So a reader asks
here before it reads: one ``stat`` per chunk file it is about to read, nothing next to the decompression.

A chunk that blosc compressed (the compressor xarray and zarr 2 write by default) must be as long as its blosc
header says: numcodecs would decode a truncated one silently in some cases (see :func:`_blosc_frame_problem`),
so its first 16 bytes are read too.

A chunk file that is a link is followed wherever it points, outside the store too: it is read when its target
is a regular file of a plausible size, and then decoded like any chunk (a target that is no chunk fails to
decode, and the reader says so in one line). A missing chunk is no damage by itself: the reader gets the fill
value, and it is the caller's to treat NaN as missing data (:meth:`ChunkProblem.missing` says which it was).

Formats: zarr format 2 (``.zarray``: ``chunks``, ``dimension_separator`` ``.`` or ``/``) and format 3
(``zarr.json``: a regular chunk grid, the ``default`` or ``v2`` chunk key encoding; a sharded array's files
are its shards). Another layout, or metadata that cannot be read, gives no :class:`ChunkLayout`, and the
reader reads without the check.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlscale.data.era5.store_metadata import array_metadata
from dlscale.errors import DataError
from dlscale.runtime.file_status import NOT_FOUND, why_not_a_file

# A chunk's encoding may be larger than its values (a filter that widens the type, a compressor's header),
# never many times larger: a bigger file is another file, and reading it whole could exhaust memory.
LARGEST_ENCODING_FACTOR = 4
LARGEST_ENCODING_SLACK = 1 << 16
BLOSC_NAMES = ("blosc", "numcodecs.blosc")
BLOSC_HEADER_BYTES = 16


@dataclass(frozen=True)
class ChunkProblem:
    """A chunk file that is not a regular file of a plausible size: ``what`` in words."""

    path: Path
    index: tuple[int, ...]  # the chunk's position along each dimension
    what: str

    @property
    def missing(self) -> bool:
        """Whether the file is simply not there (no link, no directory): the fill value, by zarr's rules."""
        return self.what == "is missing"


@dataclass(frozen=True)
class ChunkLayout:
    """Where a local zarr array keeps its chunks."""

    store: Path
    array: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    prefix: tuple[str, ...]  # ("c",) for format 3's default key encoding
    separator: str
    largest_bytes: int | None  # the largest a chunk file can plausibly be; None: unknown (object dtypes)
    blosc_framed: bool = False  # each file is one blosc frame, whose header gives its length

    @classmethod
    def of(cls, store: Path, array: str) -> ChunkLayout | None:
        """The layout of ``array`` (a name in the store's root group), or None where it is not one this module
        knows (see the module's docstring)."""
        try:
            metadata = array_metadata(store, array)
        except Exception:  # noqa: BLE001 - the store's own open reports unreadable metadata in its words
            return None
        if metadata is None:
            return None
        try:
            return cls._from_metadata(store, array, metadata)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    @classmethod
    def _from_metadata(cls, store: Path, array: str, metadata: Mapping) -> ChunkLayout | None:
        shape = tuple(int(size) for size in metadata["shape"])
        if metadata.get("zarr_format") == 3:
            grid = metadata["chunk_grid"]
            if grid.get("name") != "regular":
                return None
            chunks = tuple(int(size) for size in grid["configuration"]["chunk_shape"])
            encoding = metadata.get("chunk_key_encoding") or {"name": "default"}
            separator = (encoding.get("configuration") or {}).get("separator")
            if encoding.get("name") == "default":
                prefix, separator = ("c",), separator or "/"
            elif encoding.get("name") == "v2":
                prefix, separator = (), separator or "."
            else:
                return None
            itemsize = _itemsize(metadata.get("data_type"))
            codecs = [
                codec.get("name") if isinstance(codec, dict) else codec
                for codec in metadata.get("codecs") or []
            ]
            blosc = bool(codecs) and codecs[-1] in BLOSC_NAMES and "sharding_indexed" not in codecs
        else:
            chunks = tuple(int(size) for size in metadata["chunks"])
            prefix, separator = (), metadata.get("dimension_separator") or "."
            itemsize = _itemsize(metadata.get("dtype"))
            compressor = metadata.get("compressor")
            blosc = isinstance(compressor, dict) and compressor.get("id") in BLOSC_NAMES
        if len(chunks) != len(shape) or not shape or min(chunks) < 1 or separator not in (".", "/"):
            return None
        largest = None
        if itemsize is not None:
            largest = math.prod(chunks) * itemsize * LARGEST_ENCODING_FACTOR + LARGEST_ENCODING_SLACK
        return cls(store, array, shape, chunks, prefix, separator, largest, blosc)

    def indices(self, selection: Mapping[int, Sequence[int]]) -> Iterator[tuple[int, ...]]:
        """The chunk index of every chunk that holds an element of ``selection`` (axis -> the element indices
        read along it; an axis not named is read whole)."""
        per_axis = []
        for axis, (size, chunk) in enumerate(zip(self.shape, self.chunks, strict=True)):
            if axis in selection:
                per_axis.append(sorted({int(index) // chunk for index in selection[axis]}))
            else:
                per_axis.append(range(math.ceil(size / chunk)))
        return itertools.product(*per_axis)

    def path(self, index: tuple[int, ...]) -> Path:
        """The file of the chunk at ``index``."""
        key = self.separator.join((*self.prefix, *(str(i) for i in index)))
        return self.store / self.array / Path(*key.split("/"))

    def name(self, index: tuple[int, ...]) -> str:
        """The chunk's file as a message names it: relative to the store (``2m_temperature/2.0.0``)."""
        return self.path(index).relative_to(self.store).as_posix()

    def problems(self, selection: Mapping[int, Sequence[int]]) -> list[ChunkProblem]:
        """What is wrong with each chunk file of ``selection`` that is not a regular file of a plausible size,
        missing ones included."""
        found = []
        for index in self.indices(selection):
            path = self.path(index)
            what = _what_is_wrong(path, self.largest_bytes, self.blosc_framed)
            if what is not None:
                found.append(ChunkProblem(path, index, what))
        return found


@dataclass(frozen=True)
class CheckedChunks:
    """The chunk files a read is about to read (as messages name them) and those of them the store lacks."""

    names: list[str]
    missing: list[str]

    def text(self) -> str:
        """`` (chunk t/2.0.1)`` for a message, or `` (chunks t/2.0.0 and 3 more)``; empty where unknown."""
        if not self.names:
            return ""
        if len(self.names) == 1:
            return f" (chunk {self.names[0]})"
        return f" (chunks {self.names[0]} and {len(self.names) - 1} more)"


class StoreChunks:
    """The chunk checks of a reader of one store: each array's layout read once. ``store`` None (a netCDF file,
    a remote store) checks nothing."""

    def __init__(self, store: Path | None):
        self.store = store
        self._layouts: dict[str, ChunkLayout | None] = {}

    def layout(self, array: str, rank: int) -> ChunkLayout | None:
        """The layout of ``array`` (an array of ``rank`` dimensions), None where it is not checked."""
        if self.store is None:
            return None
        if array not in self._layouts:
            self._layouts[array] = ChunkLayout.of(self.store, array)
        layout = self._layouts[array]
        return layout if layout is not None and len(layout.shape) == rank else None

    def check(
        self, array: str, dims: Sequence[str], selection: Mapping[str, int | Sequence[int]], what: str
    ) -> CheckedChunks:
        """Before reading ``selection`` (dimension -> the index or indices read; others whole) of ``array``
        (dimensions ``dims``): a DataError ``'{store}: {what}: its chunk ... is a directory, ...'`` for the first
        chunk file that is damaged; the chunks read and those missing otherwise."""
        layout = self.layout(array, len(dims))
        if layout is None:
            return CheckedChunks([], [])
        axes = {list(dims).index(dim): np.atleast_1d(indices).tolist() for dim, indices in selection.items()}
        problems = layout.problems(axes)
        for problem in problems:
            if not problem.missing:
                raise DataError(
                    f"{self.store}: {what}: its chunk {layout.name(problem.index)} {problem.what}; the store is "
                    "damaged: repair it or download it again"
                )
        return CheckedChunks(
            [layout.name(index) for index in layout.indices(axes)], [layout.name(p.index) for p in problems]
        )


def _what_is_wrong(path: Path, largest_bytes: int | None, blosc_framed: bool) -> str | None:
    why = why_not_a_file(path)
    if why == NOT_FOUND:
        return "is missing"
    if why is not None:
        return why
    size = os.stat(path).st_size
    if largest_bytes is not None and size > largest_bytes:
        return (
            f"is {size:,} bytes, more than an encoding of its chunk could take (at most {largest_bytes:,}): "
            "another file in its place"
        )
    if blosc_framed:
        return _blosc_frame_problem(path, size)
    return None


def _blosc_frame_problem(path: Path, size: int) -> str | None:
    """A blosc frame whose header's length (bytes 12..16) is not the file's: a truncated or padded chunk.

    numcodecs checks too little of it: a truncated chunk that blosc stored uncompressed (values that do not
    compress, a small chunk) decodes into the values it still holds followed by whatever memory lies beyond
    the buffer, silently."""
    try:
        with path.open("rb") as file:
            header = file.read(BLOSC_HEADER_BYTES)
    except OSError as exc:
        return f"cannot be read: {exc.strerror}"
    if len(header) < BLOSC_HEADER_BYTES:
        return f"is {size:,} bytes, shorter than a blosc header ({BLOSC_HEADER_BYTES}): truncated"
    framed = int.from_bytes(header[12:16], "little")
    if framed != size:
        return f"is {size:,} bytes where its blosc header says {framed:,}: truncated or overwritten"
    return None


def _itemsize(dtype: object) -> int | None:
    """The bytes of one value of a numeric dtype (format 2's ``<f4``, format 3's ``float32``), else None."""
    if not isinstance(dtype, str):
        return None
    try:
        parsed = np.dtype(dtype)
    except (TypeError, ValueError):
        return None
    return parsed.itemsize if parsed.kind in "biufc" else None
