"""Why a path that should be a file cannot be read as one, in words: missing, a symbolic link loop, a dangling
link, a directory, no permission.

``Path.is_file()`` answers False for all of these alike, so a message built on it alone calls a symbolic link
loop "not found"; :func:`why_not_a_file` tells them apart.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

NOT_FOUND = "not found"


def why_not_a_file(path: Path) -> str | None:
    """None when ``path`` is a regular file (through any symbolic links); else what it is, in words:
    :data:`NOT_FOUND`, ``'is a symbolic link loop (ELOOP)...'``, ``'is a directory, not a file'``, ..."""
    try:
        status = os.stat(path)
    except OSError as exc:
        return _stat_failure(path, exc)
    if stat.S_ISDIR(status.st_mode):
        return "is a directory, not a file"
    if not stat.S_ISREG(status.st_mode):
        return "is not a regular file (a device, pipe or socket)"
    return None


def _stat_failure(path: Path, exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        if os.path.islink(path):
            return f"is a symbolic link loop (ELOOP): its link to {os.readlink(path)!r} never reaches a file"
        return "cannot be reached: its path runs into a symbolic link loop (ELOOP)"
    if exc.errno == errno.ENOENT:
        if os.path.islink(path):
            return f"is a dangling symbolic link: its target {os.readlink(path)!r} does not exist"
        return NOT_FOUND
    if exc.errno == errno.ENOTDIR:
        return "cannot be reached: a part of its path is a file, not a directory (ENOTDIR)"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"cannot be reached: permission denied ({errno.errorcode[exc.errno]})"
    code = errno.errorcode.get(exc.errno, exc.errno) if exc.errno is not None else "unknown error"
    return f"cannot be reached: {exc.strerror or 'error'} ({code})"
