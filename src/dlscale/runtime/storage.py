"""Write errors in plain words, found before a run spends an epoch: probes, free space, and error translation.

A run on a read-only or full file system used to find out at its first checkpoint, an epoch (hours) in, and
then die with a raw ``OSError`` or torch's ``RuntimeError: [enforce fail at inline_container.cc]`` whose
``ENOSPC`` hides in the chained exception. Here every such failure becomes one
:class:`~dlscale.errors.StorageError` line: the path, the errno in words, and what to do.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from dlscale.errors import StorageError, first_line
from dlscale.runtime.atomic_files import is_temporary_name

log = logging.getLogger("dlscale.train")

# The option of `dlscale train` that chooses where a run writes; every function here names it unless told another
# (each command names its own: import-era5 --out, data climatology --root, score --out, ...).
TRAINING_OPTION = "--expdir"
# What each errno means for a user, and what to do about it ({option}: the option that chooses the directory).
_ADVICE = {
    errno.EROFS: "the file system is read-only: choose a writable {option}",
    errno.EACCES: "permission denied: fix the directory's permissions or choose another {option}",
    errno.EPERM: "operation not permitted: fix the directory's permissions or choose another {option}",
    errno.ENOSPC: "the disk is full: free some space{examples} or choose another {option}",
    errno.EDQUOT: "your disk quota is exhausted: free some space (`quota -s` or your site's tool shows "
    "it) or choose another {option}",
    errno.ENOTDIR: "a part of the path is a file, not a directory: remove or rename it, or choose another {option}",
    errno.EEXIST: "it exists and is not a directory: remove or rename it, or choose another {option}",
    errno.EISDIR: "it is a directory where a file was expected: remove or rename it",
    errno.ENAMETOOLONG: "the path is too long for the file system: choose a shorter {option}",
    errno.EIO: "the storage reported an I/O error: check the file system (and its quota) or choose another {option}",
}
_OTHER_ADVICE = "check the path, or choose another {option}"
# What a training run can delete to make room (other commands' outputs hold no such thing).
_TRAINING_SPACE = " (old runs, numbered checkpoints)"
# Errors that a message can name from its text alone (torch's C++ writer loses the errno).
_TEXT_ERRNOS = {
    "no space left on device": errno.ENOSPC,
    "disk quota exceeded": errno.EDQUOT,
    "read-only file system": errno.EROFS,
    "permission denied": errno.EACCES,
}
STORAGE_ERRNOS = frozenset(_ADVICE)

PROBE_PREFIX = ".dlscale-write-probe-"


def errno_in_words(code: int | None) -> str:
    """e.g. ``'No space left on device (ENOSPC)'``."""
    if code is None:
        return "unknown error"
    return f"{os.strerror(code)} ({errno.errorcode.get(code, code)})"


def advice_for(code: int, option: str = TRAINING_OPTION) -> str:
    """What to do about a failed write of ``code``, naming ``option``, the command's option that chooses where
    it writes (``--expdir`` for training, ``--out`` for ``dlscale score``, ...)."""
    examples = _TRAINING_SPACE if option == TRAINING_OPTION else ""
    return _ADVICE.get(code, _OTHER_ADVICE).format(option=option, examples=examples)


def storage_error(
    path: str | Path, code: int | None, doing: str = "cannot write", option: str = TRAINING_OPTION
) -> StorageError:
    """One line: ``<path>: cannot write: No space left on device (ENOSPC); the disk is full: ...``, the advice
    naming ``option`` (see :func:`advice_for`)."""
    advice = advice_for(code, option) if code is not None else ""
    message = f"{path}: {doing}: {errno_in_words(code)}"
    return StorageError(f"{message}; {advice}" if advice else message)


def find_storage_errno(exc: BaseException) -> tuple[int, str | None] | None:
    """The (errno, filename) of a write failure anywhere in ``exc``'s chain, or None if it is not one.

    Looks through ``__cause__`` and ``__context__`` (torch.save re-raises a failed write as a RuntimeError with
    the OSError only in its context) and, as a last resort, at the message text.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in STORAGE_ERRNOS:
            return current.errno, current.filename
        current = current.__cause__ or current.__context__
    text = str(exc).lower()
    for words, code in _TEXT_ERRNOS.items():
        if words in text:
            return code, None
    return None


def as_storage_error(
    exc: BaseException,
    path: str | Path | None = None,
    doing: str = "cannot write",
    option: str = TRAINING_OPTION,
) -> StorageError | None:
    """``exc`` as a StorageError naming ``path`` (or the failing file), or None when it is no write failure; the
    advice names ``option`` (see :func:`advice_for`).

    Without a path to name, the original message's first line goes along (e.g. a full /dev/shm under DataLoader
    workers, where the advice about --expdir would mislead on its own).
    """
    found = find_storage_errno(exc)
    if found is None:
        return None
    code, filename = found
    where = path if path is not None else filename
    if where is not None:
        return storage_error(where, code, doing, option)
    return StorageError(f"{doing}: {errno_in_words(code)} ({first_line(exc)}); {advice_for(code, option)}")


def probe_writable(directory: Path, option: str = TRAINING_OPTION) -> None:
    """Create ``directory`` (and its parents) and write, flush and delete a small file in it.

    Raises StorageError naming the directory when any of it fails: a read-only file system, no permission, a
    path through a file, a full disk or an exhausted quota; its advice names ``option``, the command's option
    that chooses the directory (see :func:`advice_for`).
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise storage_error(directory, errno.EEXIST, "cannot create the directory", option) from None
    except OSError as exc:
        raise storage_error(directory, exc.errno, "cannot create the directory", option) from None
    if not directory.is_dir():
        raise storage_error(directory, errno.ENOTDIR, "cannot create the directory", option)
    _write_probe(directory, option)


def probe_creatable(directory: Path, option: str = TRAINING_OPTION) -> None:
    """Whether ``directory`` could be created and written, checked without leaving anything behind: a small file
    is written, flushed and deleted in its nearest existing ancestor (a command that checks before hours of work
    and may still stop on a bad input writes nothing). StorageError as :func:`probe_writable`'s."""
    ancestor = directory
    while not os.path.lexists(ancestor) and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise storage_error(ancestor, errno.ENOTDIR, "cannot create the directory", option)
    _write_probe(ancestor, option)


def _write_probe(directory: Path, option: str) -> None:
    """Write, flush and delete a small file in ``directory``; a StorageError naming it when any of that fails."""
    probe = directory / f"{PROBE_PREFIX}{os.getpid()}"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        try:
            # Some full file systems accept the create and refuse only the data (or only at fsync).
            os.write(fd, b"dlscale checks that it can write here\n")
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise storage_error(directory, exc.errno, "cannot write", option) from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()


def check_free_space(directory: Path, checkpoint_bytes: int) -> None:
    """Fail when ``directory`` cannot hold one checkpoint of ``checkpoint_bytes``; warn below two.

    Two, because a save writes the new checkpoint beside the previous one before replacing it (the best
    and numbered copies are hard links and cost nothing more).
    """
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return  # some file systems do not report; the probes above already wrote there
    needed = 2 * checkpoint_bytes
    if free < checkpoint_bytes:
        raise StorageError(
            f"{directory}: not enough free space for a checkpoint: {format_bytes(free)} free, a checkpoint of "
            f"this run takes about {format_bytes(checkpoint_bytes)} (and {format_bytes(needed)} while one "
            "replaces another); free some space or choose another --expdir"
        )
    if free < needed:
        log.warning(
            "%s: only %s free; a checkpoint takes about %s and a save needs room for two (%s) while the new one "
            "replaces the old: the next saves may fail with a full disk",
            directory,
            format_bytes(free),
            format_bytes(checkpoint_bytes),
            format_bytes(needed),
        )


def require_free_space(
    directory: Path, needed: int, what: str, option: str = TRAINING_OPTION, named: Path | None = None
) -> None:
    """A StorageError (ENOSPC, naming ``option``) when ``directory``'s file system has less than ``needed``
    bytes free for ``what``: said before a write starts rather than when the disk fills in its middle (a write
    that HDF5 finds the disk full in may also leave the library unable to close the file, and the process
    crashes when it exits). Nothing when the file system does not say how much is free. ``named``: the path the
    message names (default ``directory``), e.g. the data set a temporary directory becomes."""
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return
    if free < needed:
        doing = f"cannot write {what}: {format_bytes(needed)} needed, {format_bytes(free)} free"
        raise storage_error(named if named is not None else directory, errno.ENOSPC, doing, option)


def format_bytes(count: float) -> str:
    """e.g. ``'1.5 GB'`` (powers of 1000, as df -H prints)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(count) < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} TB"


def remove_stale_temporaries(directories: list[Path]) -> list[tuple[Path, int]]:
    """Delete the temporary files of atomic writes (``.<name>.tmp-<pid>-<hex>``) in ``directories``.

    Only call this while holding the run directory's lock: then no other writer can be mid-save there, so
    every such file was left by a process killed during a save (each up to a whole checkpoint in size).
    Returns the files removed with their sizes.
    """
    removed = []
    for directory in directories:
        if not directory.is_dir():
            continue
        for entry in directory.iterdir():
            if not is_temporary_name(entry.name) or not entry.is_file():
                continue
            try:
                size = entry.stat().st_size
                entry.unlink()
            except OSError:
                continue
            removed.append((entry, size))
    return removed


class ReportedWrites:
    """The writes of a logger to one file, whose first failure becomes one StorageError line naming the file.

    The OSError of a failed ``write()`` names no file, hence ``where`` (called at the failure: the file may change
    when the logger reopens). After a failure, :meth:`close` closes quietly: closing flushes the same bytes again,
    and the failure was already reported where it happened.
    """

    def __init__(self, where: Callable[[], Path], doing: str = "cannot write"):
        self.where = where
        self.doing = doing
        self.failed = False

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            storage = as_storage_error(exc, exc.filename or self.where(), self.doing)
            if storage is None:
                raise
            self.failed = True
            raise storage from exc

    def close(self, closer: Callable[[], object]) -> None:
        """Call ``closer``: reporting a failure as the writes do, or quietly after one already reported."""
        if self.failed:
            with contextlib.suppress(OSError):
                closer()
            return
        with self():
            closer()
