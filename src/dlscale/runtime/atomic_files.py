"""Files that are either the old version or the complete new one, never half written.

A crash, a preemption or a full disk at any instant must not leave a truncated checkpoint or config behind:
bytes go to a uniquely named temporary file beside the target, are flushed to disk, and the temporary file
is renamed onto the target (an atomic operation on POSIX file systems).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO


def write_atomically(path: Path, fill: Callable[[Path], None]) -> None:
    """Have ``fill(tmp)`` create a temporary file beside ``path``, then rename it onto ``path``.

    On any exception (KeyboardInterrupt and SystemExit included) the temporary file is removed, ``path`` is
    left as it was, and the exception propagates.
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")  # see is_temporary_name
    try:
        fill(tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        # A preemption mid-write must not leave a multi-GB temporary file behind either.
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError) and exc.errno is not None and exc.filename in (None, str(tmp)):
            # Name the file the user knows, not the temporary one that no longer exists; a failed write() (a
            # full disk) names no file at all.
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    fsync_directory(path.parent)


def write_directory_atomically(path: Path, fill: Callable[[Path], None]) -> None:
    """Have ``fill(tmp)`` fill a new temporary directory beside ``path``, then put it in ``path``'s place.

    A directory of several files that belong together (an evaluation's metrics and figures): readers see the
    previous directory or the complete new one, never a mix. A previous ``path`` is renamed aside and removed
    once the new one is in place (between the two renames, for an instant, neither is there). On any exception
    the temporary directory is removed, ``path`` is left as it was, and the exception propagates.
    """
    tag = f"{os.getpid()}-{secrets.token_hex(4)}"
    tmp, old = (path.with_name(f".{path.name}.{kind}-{tag}") for kind in ("tmp", "old"))
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp.mkdir()
        fill(tmp)
        for entry in tmp.iterdir():
            if entry.is_file():
                fsync_file(entry)
        if path.is_dir() and not path.is_symlink():
            os.replace(path, old)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.is_dir() and not path.exists():
            os.replace(old, path)  # put the previous one back
        raise
    shutil.rmtree(old, ignore_errors=True)
    fsync_directory(path.parent)


def fsync_file(path: Path) -> None:
    """Flush ``path``'s data to disk (before a rename makes it visible under its final name)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_TEMPORARY_NAME = re.compile(r"^\..+\.tmp-\d+-[0-9a-f]+$")


def is_temporary_name(name: str) -> bool:
    """Whether ``name`` is that of a temporary file of :func:`write_atomically` (``.<name>.tmp-<pid>-<hex>``)."""
    return _TEMPORARY_NAME.match(name) is not None


def write_bytes_atomically(path: Path, write: Callable[[BinaryIO], Any]) -> None:
    """Write ``path`` atomically with ``write(file)`` (the file is fsynced before the rename)."""
    write_atomically(path, lambda tmp: write_synced(tmp, write))


def write_text_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically (creating its directory)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomically(path, lambda f: f.write(text.encode()))


def write_synced(path: Path, write: Callable[[BinaryIO], Any]) -> None:
    """Create ``path`` (it must not exist), fill it with ``write(file)`` and flush it to disk."""
    # "xb": a name collision must fail rather than share a file with another writer.
    with open(path, "xb") as f:
        write(f)
        f.flush()
        # Data on disk before the rename, or a power loss could leave a renamed but empty file.
        os.fsync(f.fileno())


def fsync_directory(directory: Path) -> None:
    """Make a rename durable (a power loss right after os.replace could otherwise undo it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        # Some file systems refuse fsync on a directory; the file's data is already on disk, only the rename's
        # durability is best effort there.
        pass
    finally:
        os.close(fd)
