"""Arrays read from ``.npy`` files without unpickling, and in plain words when the file is something else.

``np.load(allow_pickle=False)`` on a file that is not a ``.npy`` (a text file, a CSV) says it "contains pickled
(object) data" and suggests ``allow_pickle=``: both wrong for a text file, and advice that would run code from
the file. Here the file's first bytes say what it is instead, and no message suggests unsafe loading.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dlscale.errors import DataError, first_line

NPY_MAGIC = b"\x93NUMPY"
_HEAD_BYTES = 64


def read_npy_array(path: Path, expected: str) -> np.ndarray:
    """The array in the ``.npy`` file ``path``, never unpickled. ``expected`` says what the file should hold
    (e.g. ``"global_means_path: an array of shape (1, 20, 1, 1)"``), for the messages.

    Raises DataError naming ``path`` and ``expected`` when the file cannot be read, is not a ``.npy`` file (text,
    a pickle, an ``.npz`` or HDF5 file; the message says which), holds Python objects or is damaged.
    """
    try:
        with open(path, "rb") as stream:
            head = stream.read(_HEAD_BYTES)
    except OSError as exc:
        raise DataError(f"{path}: cannot be read ({exc.strerror or exc}); expected {expected}") from exc
    if not head.startswith(NPY_MAGIC):
        raise DataError(
            f"{path}: is not a NumPy .npy file ({describe_start(head)}); expected {expected}, "
            "as numpy.save writes it"
        )
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as exc:
        if "pickle" in str(exc).lower() or "object arrays" in str(exc).lower():
            raise DataError(
                f"{path}: holds Python objects (a .npy array of dtype object, which only unpickling can read, "
                f"and unpickling can run code from the file); expected {expected}, of real numbers"
            ) from exc
        raise DataError(
            f"{path}: is a damaged .npy file ({first_line(exc, limit=200)}); expected {expected}"
        ) from exc
    except (OSError, EOFError) as exc:
        raise DataError(
            f"{path}: is a damaged .npy file ({first_line(exc, limit=200)}); expected {expected}"
        ) from exc


def describe_start(head: bytes) -> str:
    """What a file that starts with ``head`` looks like, e.g. ``"it starts with text 'mean 1.0 2.0'"``."""
    if not head:
        return "it is empty"
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "it is a Python pickle"
    if head.startswith(b"PK\x03\x04"):
        return "it is a zip archive, e.g. a NumPy .npz of several arrays"
    if head.startswith(b"\x89HDF\r\n\x1a\n"):
        return "it is an HDF5 file"
    text = head[:40].decode("utf-8", errors="replace")
    if all(ch.isprintable() or ch in "\t\r\n" for ch in text):
        return f"it starts with text {text.strip()[:32]!r}"
    return f"it starts with the bytes {head[:8].hex(' ')}"
