"""An output directory written in one piece by one process at a time: a forecast's, a score's or an evaluation's
results directory, or a climatology store.

:func:`~dlscale.runtime.atomic_files.write_directory_atomically` fills ``.NAME.tmp-<pid>-<hex>`` beside the
directory, renames the previous one to ``.NAME.old-<pid>-<hex>`` and the new one into place. A process killed on
the way leaves those behind (a whole ``forecast.zarr`` in a temporary, which keeps a full disk full), and a pid
in their name cannot say whether their writer still runs: it may be another ``dlscale score`` on another node of
a shared file system, writing the same directory this instant.

So the writer holds a lock beside the directory, ``.NAME.lock``: a :class:`~dlscale.runtime.run_lock.RunDirectoryLock`
lease (an exclusive create, a heartbeat; taken over at once when its holder's pid is gone on this host, after
90 s without a heartbeat from another host). Under it no other process writes the directory, so every
temporary of the directory is a dead writer's: it is removed, and a ``.old-`` one is put back when the
directory itself is missing (its writer was killed between the two renames). A second process that finds the
lock held stops with :class:`~dlscale.errors.RunDirectoryLocked` (exit status 75) instead of writing beside it.
The lock is beside the directory, not in it, because the directory is replaced whole.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from dlscale.errors import RunDirectoryLocked, StorageError
from dlscale.runtime.atomic_files import write_directory_atomically
from dlscale.runtime.lock_holder import LockHolder
from dlscale.runtime.run_lock import RunDirectoryLock, stop_advice
from dlscale.runtime.storage import TRAINING_OPTION, as_storage_error, format_bytes, storage_error

log = logging.getLogger("dlscale.train")

LOCK_SUFFIX = ".lock"


def lock_path(directory: Path) -> Path:
    """``<parent>/.<name>.lock``: the lock of ``directory``, beside it."""
    return directory.with_name(f".{directory.name}{LOCK_SUFFIX}")


class OutputDirectoryLock(RunDirectoryLock):
    """The lock of one output directory (see the module docstring): refused at once while another process holds
    it, whatever its batch job (two tasks of one job writing the same directory are two writers too).

    ``option`` is the command's option that chooses the directory, for the advice of a lock file that cannot be
    written (a read-only or full disk). ``lock_file``: where the lock is, by default beside the directory
    (:func:`lock_path`); one inside it for a directory that is written in place, not replaced (an import's)."""

    kind = "output directory"

    def __init__(
        self, directory: Path, option: str = TRAINING_OPTION, lock_file: Path | None = None, **lease: float
    ) -> None:
        where = lock_file if lock_file is not None else lock_path(directory)
        super().__init__(directory, lock_path=where, wait_same_job_s=0.0, **lease)
        self._option = option

    def _make_run_dir(self) -> None:
        # The directory itself appears only when it is complete; its parent holds the lock and the temporaries.
        parent = self.path.parent
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except FileExistsError as exc:
            raise storage_error(parent, errno.ENOTDIR, "cannot create the directory", self._option) from exc
        except OSError as exc:
            raise storage_error(parent, exc.errno, "cannot create the directory", self._option) from exc

    def _locked(self, holder: LockHolder, waited_s: float | None) -> RunDirectoryLocked:
        stop = stop_advice(holder).rstrip(", ")
        return RunDirectoryLocked(
            f"{self._run_dir}: another process is writing it now: {holder.describe()}. Wait for it to end and run "
            f"this again{f', or {stop}' if stop else ''}; if you are sure no process writes it, delete {self.path}"
        )

    def _storage_error(self, exc: OSError, path: Path, action: str = "create") -> StorageError:
        code = exc.errno if exc.errno is not None else errno.EIO
        return storage_error(
            path, code, f"cannot {action} the lock file of {self._run_dir.name}", self._option
        )


def remove_leftovers(directory: Path, what: str) -> None:
    """Remove what writers of ``directory`` that were killed left beside it (call under its lock): its
    temporaries, and its earlier versions set aside, of which the newest is put back if ``directory`` is
    missing. ``what`` names the directory's contents in the log lines (``the forecast``)."""
    parent = directory.parent
    if not parent.is_dir():
        return
    pattern = re.compile(rf"^\.{re.escape(directory.name)}\.(tmp|old)-\d+-[0-9a-f]+$")
    kinds = {entry: match.group(1) for entry in parent.iterdir() if (match := pattern.match(entry.name))}
    leftovers = sorted(kinds)
    set_aside = [entry for entry in leftovers if kinds[entry] == "old"]
    if set_aside and not os.path.lexists(directory):
        earlier = max(set_aside, key=lambda entry: entry.lstat().st_ctime)  # the last one renamed aside
        os.replace(earlier, directory)
        leftovers.remove(earlier)
        log.warning(
            "%s: put %s back from %s, where a write that was killed before it finished had set it aside",
            directory,
            what,
            earlier.name,
        )
    for entry in leftovers:
        size = _size(entry)
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                entry.unlink(missing_ok=True)
        if os.path.lexists(entry):
            # Not this write's business to fail for (another user's files, say): the next write tries again.
            log.warning("Could not remove %s, left by a write of %s that did not finish", entry, what)
        else:
            log.info(
                "Removed %s (%s), left by a write of %s that did not finish", entry, format_bytes(size), what
            )


def write_results_directory(
    directory: Path, fill: Callable[[Path], None], what: str, option: str = TRAINING_OPTION
) -> None:
    """Write ``directory`` in one piece with ``fill(tmp)``, holding its lock, after removing what killed writers
    left (see the module docstring). A full disk, a quota or a read-only directory becomes a StorageError saying
    that ``what`` could not be written, that the earlier one is unchanged, and naming ``option`` (the command's
    option that chooses the directory); another process writing it now, RunDirectoryLocked."""
    with OutputDirectoryLock(directory, option):
        try:
            remove_leftovers(directory, what)
            write_directory_atomically(directory, fill)
        except (OSError, RuntimeError) as exc:
            doing = f"cannot write {what} (an earlier one is unchanged)"
            storage = as_storage_error(exc, directory, doing, option)
            if storage is not None:
                raise storage from exc
            raise


def _size(path: Path) -> int:
    """Bytes in ``path``, a file or a directory tree (what removing it frees)."""
    if path.is_symlink() or not path.is_dir():
        try:
            return path.lstat().st_size
        except OSError:
            return 0
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total
