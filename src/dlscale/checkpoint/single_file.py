"""The single-file checkpoint format: atomic saving and safe loading of one ``torch.save`` file.

A checkpoint file holds a plain dict (model, optimizer, scheduler, grad_scaler, rng, progress, config, meta) plus
`format` and `version` keys. It is loaded with `weights_only=True` only, so it may hold nothing but tensors and
plain Python containers/scalars; `save_checkpoint` checks that before writing, so a run finds out at its first
save, not at the resume after a crash. A sharded checkpoint's header (:mod:`dlscale.checkpoint.sharded_files`) is
such a file too. Readers use :func:`dlscale.checkpoint.files.load_checkpoint`, which takes either format.
"""

from __future__ import annotations

import collections
import pickle
import re
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from dlscale.errors import CheckpointError, exception_line
from dlscale.runtime.atomic_files import write_atomically, write_synced
from dlscale.runtime.storage import as_storage_error

CHECKPOINT_FORMAT = "dlscale-checkpoint"
CHECKPOINT_VERSION = 1

_ZIP_MAGIC = b"PK\x03\x04"
# The suffixes torch.save files go by: a file of unknown bytes named so is taken for a damaged checkpoint, one
# named otherwise for a file that never was one.
_CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt")
# How other files a user may hand to --resume by mistake begin (the first that matches names the file).
_FOREIGN_MAGIC = (
    (b"\x89HDF\r\n\x1a\n", "an HDF5 file: a data file, not a checkpoint"),
    (b"\x93NUMPY", "a NumPy .npy array"),
    (b"\x1f\x8b", "a gzip-compressed file"),
    (
        b"version https://git-lfs",
        "a Git LFS pointer: the checkpoint itself was never downloaded (git lfs pull)",
    ),
    (
        b"\x80",
        "a pickle file (torch.save's legacy format or another program's), which dlscale never unpickles",
    ),
)

# What torch's weights_only unpickler accepts besides tensors (see torch/_weights_only_unpickler.py). Exact
# types, not isinstance: numpy.float64 is a float and an IntEnum an int, yet both pickle as their own class,
# which the safe loader refuses.
_PLAIN_SCALARS = (str, bytes, bytearray, int, float, complex, bool, type(None)) + (
    torch.dtype,
    torch.device,
    torch.Size,
)


# --------------------------------------------------------------------------------------------- save / load


class NotADlscaleCheckpoint(CheckpointError):
    """A file that is intact but holds something else than a dlscale checkpoint (not a damaged checkpoint)."""


def save_checkpoint(payload: Mapping[str, Any], path: str | Path) -> Path:
    """Write `payload` (plus `format` and `version`) to `path` atomically; return the path.

    The bytes go to a uniquely named temporary file in the same directory, which is fsynced and then renamed
    onto `path`: readers (and a resume after a crash at any instant) see either the previous file or the
    complete new one, never a partial write. On any error the temporary file is removed and the previous
    file is left untouched.
    """
    path = Path(path)
    if not isinstance(payload, Mapping):
        raise CheckpointError(f"{path}: the checkpoint payload must be a dict, got {type(payload).__name__}")
    _check_weights_only_safe(payload, path)
    document = {**payload, "format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        storage = as_storage_error(exc, path.parent, "cannot create the checkpoint directory")
        raise storage or CheckpointError(f"{path}: cannot create the checkpoint directory: {exc}") from exc
    write_checkpoint_atomically(path, lambda tmp: write_synced(tmp, lambda f: torch.save(document, f)))
    return path


def load_checkpoint_file(path: str | Path, map_location: Any = "cpu") -> dict[str, Any]:
    """Load a checkpoint file written by `save_checkpoint`, with torch's safe (weights_only) loader.

    Raises CheckpointError, naming the path, when the file is missing, corrupt or truncated, holds objects
    other than tensors and plain containers, is not a dlscale checkpoint, or comes from a newer dlscale.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint file")
    if not path.is_file():
        raise CheckpointError(f"{path}: is not a file (expected a checkpoint written by dlscale)")
    try:
        with open(path, "rb") as f:
            magic = f.read(len(_ZIP_MAGIC))
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read the checkpoint: {exc}") from exc
    if magic != _ZIP_MAGIC:
        # torch.save has written zip archives since torch 1.6; anything else is damaged or not ours, and
        # handing it to torch.load would only produce a confusing unpickling error.
        raise CheckpointError(
            f"{path}: is corrupt or not a PyTorch checkpoint (it does not start like a torch.save zip archive"
            f"{', it is empty' if not magic else ''})"
        )
    try:
        # Reads only the archive's central directory (at its end): cheap, and it tells a truncated file apart
        # from a complete one that torch then fails to load for another reason.
        with zipfile.ZipFile(path) as archive:
            archive.infolist()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise CheckpointError(
            f"{path}: is truncated or corrupt (its zip archive is incomplete: {exception_line(exc)})"
        ) from exc
    try:
        document = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        refused = _refused_global(str(exc))
        if refused is not None:
            raise CheckpointError(
                f"{path}: holds objects other than tensors and plain Python containers ({refused}); "
                "dlscale loads checkpoints with torch.load(weights_only=True) and will not unpickle "
                "arbitrary code"
            ) from exc
        raise CheckpointError(
            f"{path}: is corrupt (its pickled data cannot be read: {_unpickling_reason(exc)}); dlscale loads "
            "checkpoints with torch.load(weights_only=True) and will not unpickle arbitrary code"
        ) from exc
    except Exception as exc:
        # E.g. a damaged record inside an intact archive, or a map_location this machine cannot honour.
        raise CheckpointError(f"{path}: cannot be loaded ({exception_line(exc)})") from exc

    if not isinstance(document, dict):
        raise NotADlscaleCheckpoint(
            f"{path}: is not a dlscale checkpoint (it holds a {type(document).__name__}, expected a dict with "
            f"format '{CHECKPOINT_FORMAT}')"
        )
    fmt = document.get("format")
    if fmt != CHECKPOINT_FORMAT:
        found = "has no 'format' key" if fmt is None else f"has format {fmt!r}"
        hint = ""
        if document and all(isinstance(v, torch.Tensor) for v in document.values()):
            hint = "; it looks like a bare model state_dict"
        raise NotADlscaleCheckpoint(
            f"{path}: is not a dlscale checkpoint (it {found}, expected '{CHECKPOINT_FORMAT}'){hint}"
        )
    check_format_version(
        path, document.get("version"), CHECKPOINT_VERSION, "checkpoint version", CheckpointError
    )
    return document


def check_format_version(path: Path, version: Any, newest: int, what: str, error: type[Exception]) -> None:
    """Refuse a file whose format version ``what`` is no int >= 1, or is newer than this dlscale reads (``newest``),
    with ``error`` naming ``path`` (checkpoints and exports alike)."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise error(f"{path}: has an invalid {what} {version!r} (expected an int >= 1)")
    if version > newest:
        raise error(
            f"{path}: was written by a newer dlscale ({what} {version}; this dlscale reads up to {newest}); "
            "upgrade dlscale to load it"
        )


def foreign_file_kind(path: Path) -> str | None:
    """What ``path`` looks like when it plainly is no checkpoint that torch.save wrote (e.g. "an HDF5 file: ...",
    "a text file ...", "a NumPy .npz archive"); None when it may be one, damaged or not (loading it says which).

    Reads the file's first bytes only (and a zip archive's directory of names), never unpickles anything.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        return None  # loading it names the problem
    if head.startswith(_ZIP_MAGIC):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError, EOFError, ValueError):
            return None  # a truncated archive: a damaged checkpoint, as far as anyone can tell
        if any(name == "data.pkl" or name.endswith("/data.pkl") for name in names):
            return None  # torch.save's layout
        if names and all(name.endswith(".npy") for name in names):
            return "a NumPy .npz archive"
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        return f"a zip archive that torch.save did not write (it holds {shown or 'nothing'})"
    for magic, kind in _FOREIGN_MAGIC:
        if head.startswith(magic):
            return kind
    text = _as_text(head)
    if text and text.strip():
        first = text.strip().splitlines()[0][:60]
        return f"a text file, beginning {first!r}"
    if path.suffix.lower() in _CHECKPOINT_SUFFIXES:
        return None  # unknown bytes under a checkpoint's name: damaged, and loading it says so
    if not head:
        return "an empty file"
    return f"a file of unknown format (not a torch.save zip archive; its suffix is {path.suffix or 'none'!r})"


def _as_text(head: bytes) -> str | None:
    """``head`` as text when it is printable UTF-8 (its last character may be cut off), else None."""
    for cut in range(4):  # a multi-byte character cut at the end of the bytes read
        try:
            text = head[: len(head) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
        return text if all(c.isprintable() or c in "\t\r\n\f" for c in text) else None
    return None


def write_checkpoint_atomically(path: Path, fill: Callable[[Path], None]) -> None:
    """Atomically (see :mod:`dlscale.runtime.atomic_files`), with write errors in plain words.

    A full disk, a quota, a read-only or forbidden directory become a StorageError naming the file (torch.save
    reports them as a RuntimeError with the OSError only in its context); the previous file is unchanged.
    """
    try:
        write_atomically(path, fill)
    except (OSError, RuntimeError) as exc:
        storage = as_storage_error(
            exc, path, "cannot write the checkpoint (the previous one, if any, is unchanged)"
        )
        if storage is not None:
            raise storage from exc
        if isinstance(exc, OSError):
            raise CheckpointError(f"{path}: cannot write the checkpoint: {exc}") from exc
        raise


def _check_weights_only_safe(value: Any, path: Path, where: str = "payload") -> None:
    """Refuse, naming the entry, anything that torch.load(weights_only=True) would refuse to read back."""
    if isinstance(value, torch.Tensor) or type(value) in _PLAIN_SCALARS:
        return
    if type(value) in (dict, collections.OrderedDict, collections.Counter):
        for key, item in value.items():
            if type(key) not in _PLAIN_SCALARS:
                raise CheckpointError(
                    f"{path}: {where} has a key of type {type(key).__name__}; a checkpoint may only hold "
                    "tensors and plain Python containers/scalars"
                )
            _check_weights_only_safe(item, path, f"{where}[{key!r}]")
        return
    if type(value) in (list, tuple, set):
        for index, item in enumerate(value):
            _check_weights_only_safe(item, path, f"{where}[{index}]")
        return
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    raise CheckpointError(
        f"{path}: not saving the checkpoint: {where} is a {kind}, which torch.load(weights_only=True) would "
        "refuse to read back; convert it to a tensor or plain Python containers/scalars"
    )


def _refused_global(message: str) -> str | None:
    """The object the safe loader refused, if the unpickling error is a refusal (not a corrupt stream)."""
    match = re.search(r"GLOBAL (\S+) was not an allowed global", message)
    if match:
        return f"found {match.group(1)}"
    match = re.search(r"whose module (\S+) is blocked", message)
    if match:
        return f"found a reference to the blocked module {match.group(1)}"
    return None


def _unpickling_reason(exc: BaseException) -> str:
    """What torch's safe unpickler could not read (e.g. "Unsupported operand 105"), without the advice around
    it: its message suggests loading again with weights_only=False, which would run code from the file."""
    text = str(exc)
    marker = "WeightsUnpickler error:"
    if marker in text:
        reason = next((line.strip() for line in text.split(marker, 1)[1].splitlines() if line.strip()), "")
        if reason:
            return reason[:200]
    return exception_line(exc) if "weights_only" not in text else type(exc).__name__
