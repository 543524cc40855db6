"""Ways a zarr store on disk gets damaged, applied to one chunk file of a store written by :mod:`era5_stores`, for
the tests of every reader of such stores (the truth, import-era5's source, the climatology).

``missing`` is the one a zarr reader cannot tell from a chunk never written (zarr reads the fill value, NaN for
xarray's floats); every other kind is a store that cannot be read as it is.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

# Damage that makes a chunk unreadable (the reader must refuse it in one line).
UNREADABLE = (
    "truncated",
    "garbage",
    "garbled",
    "empty",
    "link_to_text",
    "link_loop",
    "directory",
    "dangling_link",
    "pipe",
    "link_to_large_file",
)


def damage(chunk: Path, kind: str) -> None:
    """Damage the chunk file ``chunk`` in the way ``kind`` names (:data:`UNREADABLE`, or ``missing``)."""
    if kind == "missing":
        chunk.unlink()
    elif kind == "truncated":
        chunk.write_bytes(chunk.read_bytes()[: len(chunk.read_bytes()) // 3])
    elif kind == "garbage":
        chunk.write_bytes(bytes(range(256)) * 3)
    elif kind == "garbled":  # its blosc header intact (but marked compressed), garbage after it
        raw = chunk.read_bytes()
        header = bytearray(raw[:16])
        header[2] &= ~0x02  # blosc's flag for a chunk stored uncompressed: so blosc decodes the garbage
        chunk.write_bytes(bytes(header) + bytes(i * 7 % 256 for i in range(len(raw) - 16)))
    elif kind == "empty":
        chunk.write_bytes(b"")
    elif kind == "link_to_text":  # a link out of the store, to a file that is no chunk
        text = chunk.parents[2] / f"notes-{chunk.parent.name}.txt"
        text.write_text("not a chunk\n" * 50)
        chunk.unlink()
        chunk.symlink_to(text)
    elif kind == "link_loop":
        chunk.unlink()
        chunk.symlink_to(chunk.name)
    elif kind == "directory":
        chunk.unlink()
        chunk.mkdir()
    elif kind == "dangling_link":
        chunk.unlink()
        chunk.symlink_to(chunk.parent / "no-such-chunk")
    elif kind == "pipe":  # a read would wait for a writer forever
        chunk.unlink()
        os.mkfifo(chunk)
    elif kind == "link_to_large_file":  # 64 MiB (sparse: no disk): far more than any encoding of a tiny chunk
        large = chunk.parents[2] / f"large-{chunk.parent.name}.bin"
        with large.open("wb") as file:
            file.truncate(64 << 20)
        chunk.unlink()
        chunk.symlink_to(large)
    else:
        raise ValueError(kind)


class _RunsCode:
    """Unpickling this creates the file ``marker``: the proof that a reader ran code from a store."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def name_pickle_codec(store: Path, array: str, marker: Path) -> None:
    """Make ``array`` of a zarr format 2 store name numcodecs' ``pickle`` filter (an object array, as zarr 2
    writes one), its metadata and consolidated metadata alike, and each of its chunks a pickle that creates
    ``marker`` when it is loaded."""

    def edit(metadata: dict) -> None:
        metadata.update(
            dtype="|O", fill_value=None, compressor=None, filters=[{"id": "pickle", "protocol": 5}]
        )

    edit_array_metadata(store, array, edit)
    for chunk in (store / array).iterdir():
        if not chunk.name.startswith("."):
            chunk.write_bytes(pickle.dumps(_RunsCode(marker)))


def edit_array_metadata(store: Path, array: str, edit) -> None:
    """Apply ``edit`` (a function that changes a dict in place) to ``array``'s ``.zarray`` and to its entry in the
    store's ``.zmetadata``."""
    own = store / array / ".zarray"
    metadata = json.loads(own.read_text())
    edit(metadata)
    own.write_text(json.dumps(metadata))
    consolidated_file = store / ".zmetadata"
    if consolidated_file.exists():
        consolidated = json.loads(consolidated_file.read_text())
        edit(consolidated["metadata"][f"{array}/.zarray"])
        consolidated_file.write_text(json.dumps(consolidated))


def chunk_of(store: Path, array: str, time_index: int) -> Path:
    """The chunk file of ``array`` at ``time_index`` in a store of one chunk per time step (format 2, '.')."""
    found = [path for path in (store / array).iterdir() if path.name.split(".")[0] == str(time_index)]
    assert len(found) == 1, found
    return found[0]
