"""An exclusive lock on a training run's directory, so two runs in the same directory cannot corrupt each other.

A double submit, or a requeued Slurm job that starts while its previous incarnation is still writing its last
checkpoint, would otherwise interleave checkpoints, logs and TensorBoard events of two runs. Rank 0 takes this
lock before it writes anything into the run directory and releases it when the run ends.

Why a lease file and not ``fcntl``/``flock``: the lock is a file created with ``os.open(O_CREAT | O_EXCL)``,
which is atomic (exactly one creator succeeds) on local disks, NFSv3 and later, Lustre and GPFS. POSIX and BSD
locks are not that dependable on cluster file systems: on Lustre they depend on the client's mount options, and
with ``localflock`` they are node-local, so a requeued job on another node would get its lock while the old one
still holds it, silently excluding nothing. A file is also readable: it says who holds the directory (host, pid,
batch job, start time), which a process on another node could not learn from a kernel lock.

The holder may die without removing the file (SIGKILL, node failure), so the file is a *lease*: a heartbeat
thread touches its mtime every ``heartbeat_s`` seconds, and a lock whose mtime is more than ``lease_s`` seconds
old is stale and may be taken over. This compares this node's clock with the mtime set by the holder's node (or
by the file server), so the nodes' clocks must agree to well under ``lease_s``; NTP keeps cluster nodes within
milliseconds of each other. A holder on our own host needs no lease wait: if its pid no longer exists, or (on
Linux) the pid now belongs to another process started later, the lock is stale at once. A live holder on our
own host is never stale, whatever its heartbeat: a stopped (Ctrl-Z) process would resume writing.

Taking over a stale lock is itself serialised by a second short-lived ``O_EXCL`` file, ``<lock>.takeover``:
without it, two contenders that both saw the same stale lock could each delete it and the second one would
delete the first one's fresh lock, leaving both "holding" the directory.

What the file records about its holder, and the checks of a pid on this host, are
:mod:`dlscale.runtime.lock_holder`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import random
import secrets
import socket
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType

import psutil

from dlscale.errors import RunDirectoryLocked, StorageError
from dlscale.runtime.lock_holder import (
    LockHolder,
    job_id_from_environment,
    parse_holder,
    process_start_time,
)
from dlscale.runtime.storage import storage_error
from dlscale.runtime.strict_json import to_json

log = logging.getLogger("dlscale.train")

LOCK_NAME = ".dlscale-run.lock"
_TAKEOVER_SUFFIX = ".takeover"
_HEARTBEAT_THREAD_PREFIX = "dlscale-run-lock-heartbeat"
# A takeover holds its mutex for a few file operations; one this old belongs to a contender that crashed.
_TAKEOVER_ABANDONED_S = 60.0
_TAKEOVER_BACKOFF_S = 0.02
_MAX_COMMAND_CHARS = 200
_UNPARSABLE_HOST = "unknown (lock file being written)"
_UNREADABLE_HOST = "unknown (unreadable lock file)"


@dataclass(frozen=True)
class _LockFile:
    """One reading of the lock file: its bytes (to recognise the same file again), holder and age."""

    raw: bytes
    holder: LockHolder
    parsed: bool
    age_s: float


class RunDirectoryLock:
    """Exclusive, lease-based lock on ``run_dir`` (see the module docstring); a context manager.

    ``lease_s``: a holder on another host whose heartbeat is older than this is presumed dead. ``heartbeat_s``:
    how often the holder refreshes its lease. ``wait_same_job_s``: how long to wait for a live holder of our own
    batch job (a requeued job's previous incarnation) before failing; ``poll_s``: how often to look meanwhile.
    ``unparsable_grace_s``: how long an empty or half-written lock file may be in the middle of being written
    before it counts as left by a crash. ``environ`` supplies the batch job id (default ``os.environ``).
    ``lock_path``: the lock file (default ``<run_dir>/.dlscale-run.lock``).
    """

    kind = "run directory"  # what the log lines call the locked directory

    def __init__(
        self,
        run_dir: str | Path,
        *,
        lease_s: float = 90.0,
        heartbeat_s: float = 15.0,
        wait_same_job_s: float = 300.0,
        poll_s: float = 2.0,
        environ: Mapping[str, str] | None = None,
        unparsable_grace_s: float = 10.0,
        lock_path: str | Path | None = None,
    ) -> None:
        if heartbeat_s >= lease_s:
            raise ValueError(f"heartbeat_s={heartbeat_s} must be shorter than lease_s={lease_s}")
        self._run_dir = Path(run_dir)
        self._path = Path(lock_path) if lock_path is not None else self._run_dir / LOCK_NAME
        self._takeover_path = self._path.with_name(self._path.name + _TAKEOVER_SUFFIX)
        self._lease_s = lease_s
        self._heartbeat_s = heartbeat_s
        self._wait_same_job_s = wait_same_job_s
        self._poll_s = poll_s
        self._unparsable_grace_s = unparsable_grace_s
        self._job_id = job_id_from_environment(os.environ if environ is None else environ)
        self._host = socket.gethostname()
        self._token: str | None = None
        self._stop_heartbeat = threading.Event()
        self._heartbeat: threading.Thread | None = None

    @property
    def path(self) -> Path:
        """The lock file, ``<run_dir>/.dlscale-run.lock``."""
        return self._path

    def __enter__(self) -> RunDirectoryLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lock, taking over a stale one; raise RunDirectoryLocked if a live run holds it.

        Waits up to ``wait_same_job_s`` when the live holder belongs to our own batch job. Raises StorageError
        when the run directory or the lock file cannot be created, RuntimeError if this object holds it already.
        """
        if self._token is not None:
            raise RuntimeError(f"{self._path} is already held by this RunDirectoryLock")
        self._make_run_dir()
        wait_started: float | None = None
        while True:
            token = self._create()
            if token is not None:
                break
            current = self._read()
            if current is None:
                continue  # released between our attempt and our look: try again
            reason = self._stale_reason(current)
            if reason is not None:
                token = self._take_over(current)
                if token is not None:
                    log.warning(
                        "Took over the lock of %s %s from %s: %s.",
                        self.kind,
                        self._run_dir,
                        current.holder.describe(),
                        reason,
                    )
                    break
                continue
            if not current.parsed:
                # Being written this instant (it reads as the holder in a moment), or left half written by a
                # process killed right after creating it (stale once the grace period is over): either way, wait.
                time.sleep(min(self._poll_s, 0.05))
                continue
            holder = current.holder
            if holder.job_id is None or holder.job_id != self._job_id or self._wait_same_job_s <= 0:
                raise self._locked(holder, waited_s=None)
            now = time.monotonic()
            if wait_started is None:
                wait_started = now
                log.info(
                    "Run directory %s is held by %s, of our own batch job %s (probably its previous "
                    "incarnation, still saving its checkpoint): waiting up to %g s for it to end.",
                    self._run_dir,
                    holder.describe(),
                    holder.job_id,
                    self._wait_same_job_s,
                )
            waited_s = now - wait_started
            if waited_s >= self._wait_same_job_s:
                raise self._locked(holder, waited_s=waited_s)
            time.sleep(min(self._poll_s, self._wait_same_job_s - waited_s))
        self._token = token
        self._start_heartbeat(token)

    def release(self) -> None:
        """Stop the heartbeat and remove the lock file if it is still ours. Never raises for a missing file."""
        token, self._token = self._token, None
        self._stop_heartbeat.set()
        if self._heartbeat is not None:
            # The beat in progress must end before the file goes, or it would report a takeover. The timeout
            # keeps a hung file server from hanging the end of the run.
            self._heartbeat.join(timeout=10.0)
            self._heartbeat = None
        if token is None:
            return
        try:
            current = self._read()
            if current is not None and current.holder.token == token:
                self._path.unlink()
        except FileNotFoundError:
            pass
        except (OSError, StorageError) as exc:
            # Raising here would hide the run's own outcome; a lock left behind is recognised as stale later.
            log.warning("Could not remove the run directory lock %s: %s", self._path, exc)

    def current_holder(self) -> LockHolder | None:
        """Who holds the lock now according to the lock file, or None if there is no lock file."""
        current = self._read()
        return None if current is None else current.holder

    # -- the lock file -------------------------------------------------------------------------------------

    def _make_run_dir(self) -> None:
        try:
            self._run_dir.mkdir(parents=True, exist_ok=True)
        except FileExistsError as exc:
            # mkdir(exist_ok=True) reports an existing non-directory as EEXIST, which would read as nonsense.
            raise self._storage_error(OSError(errno.ENOTDIR, "not a directory"), self._run_dir) from exc
        except OSError as exc:
            raise self._storage_error(exc, self._run_dir) from exc

    def _create(self) -> str | None:
        """Create the lock file with our record; its token, or None if the file exists already."""
        try:
            fd = os.open(self._path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return None
        except OSError as exc:
            raise self._storage_error(exc, self._path) from exc
        token = secrets.token_hex(8)
        try:
            with os.fdopen(fd, "wb") as stream:
                stream.write(self._record(token))
                stream.flush()
                # A reader on another node must never see our file without the holder's details.
                os.fsync(stream.fileno())
        except OSError as exc:
            # A lock file without content (disk full, quota) would block the directory for the grace period.
            with contextlib.suppress(OSError):
                self._path.unlink()
            raise self._storage_error(exc, self._path) from exc
        return token

    def _record(self, token: str) -> bytes:
        now = datetime.now().astimezone()
        record = {
            "host": self._host,
            "pid": os.getpid(),
            "job_id": self._job_id,
            "started": now.isoformat(timespec="seconds"),
            "started_unix": now.timestamp(),
            "token": token,
            "process_start": process_start_time(os.getpid()),
            "command": " ".join(sys.argv)[:_MAX_COMMAND_CHARS],
        }
        return to_json(record, indent=None).encode()

    def _read(self) -> _LockFile | None:
        """The lock file as it is now, or None if there is none."""
        try:
            # O_NOFOLLOW: a dangling symlink would make O_EXCL fail and this read find nothing, forever.
            fd = os.open(self._path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._storage_error(exc, self._path, action="read") from exc
        try:
            with os.fdopen(fd, "rb") as stream:
                raw = stream.read()
                mtime = os.fstat(stream.fileno()).st_mtime
        except OSError as exc:
            raise self._storage_error(exc, self._path, action="read") from exc
        age_s = time.time() - mtime
        holder = parse_holder(raw, age_s)
        if holder is not None:
            return _LockFile(raw, holder, parsed=True, age_s=age_s)
        host = _UNPARSABLE_HOST if age_s <= self._unparsable_grace_s else _UNREADABLE_HOST
        return _LockFile(
            raw, LockHolder(host, None, None, None, None, None, age_s), parsed=False, age_s=age_s
        )

    def _stale_reason(self, lock: _LockFile) -> str | None:
        """Why the lock's holder is gone, or None while it may still be running."""
        if not lock.parsed:
            if lock.age_s > self._unparsable_grace_s:
                return (
                    f"the lock file is empty or unreadable and was last written {lock.age_s:.0f} s ago, "
                    f"beyond the {self._unparsable_grace_s:g} s a writer needs"
                )
            return None
        holder = lock.holder
        if holder.host == self._host and holder.pid is not None:
            if not psutil.pid_exists(holder.pid):  # also a process of another user
                return f"process {holder.pid} on this host no longer exists"
            start = process_start_time(holder.pid)
            if holder.process_start is not None and start is not None:
                if start != holder.process_start:
                    return f"process {holder.pid} on this host is a later process that reused the pid"
                return None
        if lock.age_s > self._lease_s:
            return f"its last heartbeat was {lock.age_s:.0f} s ago, beyond the {self._lease_s:g} s lease"
        return None

    def _take_over(self, stale: _LockFile) -> str | None:
        """Replace the stale lock file with ours, unless another contender gets there first; our token or None."""
        if not self._enter_takeover():
            return None
        try:
            current = self._read()
            # The same bytes are the same acquisition (each carries its own token, and an unparsable file is
            # matched byte for byte); it must also still be stale, as a suspended holder may have resumed.
            if current is None or current.raw != stale.raw or self._stale_reason(current) is None:
                return None
            try:
                self._path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise self._storage_error(exc, self._path, action="remove the stale") from exc
            return self._create()
        finally:
            with contextlib.suppress(OSError):
                self._takeover_path.unlink()

    def _enter_takeover(self) -> bool:
        """Create the takeover mutex file; False (after a short back-off) if another contender holds it."""
        try:
            fd = os.open(self._takeover_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            self._remove_abandoned_takeover()
            # Jitter, so that contenders that collided do not collide again in lockstep.
            time.sleep(_TAKEOVER_BACKOFF_S * (1.0 + random.random()))
            return False
        except OSError as exc:
            raise self._storage_error(exc, self._takeover_path) from exc
        with os.fdopen(fd, "wb") as stream:
            # Only for a person looking at a leftover file; nobody parses it.
            stream.write(f"{self._host} {os.getpid()}\n".encode())
        return True

    def _remove_abandoned_takeover(self) -> None:
        try:
            first = os.stat(self._takeover_path)
        except FileNotFoundError:
            return
        if time.time() - first.st_mtime <= _TAKEOVER_ABANDONED_S:
            return
        # Two contenders may find the same abandoned file; looking again just before the unlink, and the back-off
        # before creating a new one, keep one of them from deleting the other's fresh mutex.
        with contextlib.suppress(OSError):
            again = os.stat(self._takeover_path)
            if (again.st_ino, again.st_mtime) == (first.st_ino, first.st_mtime):
                os.unlink(self._takeover_path)
                log.warning("Removed %s, left by a takeover that did not finish.", self._takeover_path)

    # -- heartbeat ------------------------------------------------------------------------------------------

    def _start_heartbeat(self, token: str) -> None:
        self._stop_heartbeat = threading.Event()
        self._heartbeat = threading.Thread(
            target=self._beat,
            args=(token, self._stop_heartbeat),
            name=f"{_HEARTBEAT_THREAD_PREFIX}:{self._path}",
            daemon=True,  # never keeps a finished (or crashed) training process alive
        )
        self._heartbeat.start()

    def _beat(self, token: str, stop: threading.Event) -> None:
        """Refresh the lease until stopped, or until the lock file turns out to be someone else's."""
        failing = False
        while not stop.wait(self._heartbeat_s):
            try:
                current = self._read()
                if current is not None and current.holder.token == token:
                    os.utime(self._path)
                    failing = False
                    continue
            except FileNotFoundError:
                current = None
            except (OSError, StorageError) as exc:
                # A file server hiccup: keep trying, the lease allows several missed beats.
                if not failing:
                    log.warning("Could not refresh the run directory lock %s: %s", self._path, exc)
                failing = True
                continue
            if stop.is_set():
                return  # released while we looked: the file is gone because we removed it
            taker = "someone who removed the lock file" if current is None else current.holder.describe()
            log.error(
                "The lock of %s %s was taken over by %s; this run no longer holds the directory "
                "exclusively and another run may now write into it.",
                self.kind,
                self._run_dir,
                taker,
            )
            return

    # -- messages -------------------------------------------------------------------------------------------

    def _locked(self, holder: LockHolder, waited_s: float | None) -> RunDirectoryLocked:
        waited = ""
        if waited_s is not None:
            waited = (
                f" We waited {waited_s:.3g} s for it to end, as it belongs to our own job {holder.job_id}."
            )
        stop = stop_advice(holder)
        message = (
            f"run directory {self._run_dir} is in use by another run: {holder.describe()}.{waited} Wait for that "
            f"run to end, {stop}or train into another directory with --run_num/--expdir; if you are sure no run "
            f"uses it, delete {self._path}"
        )
        return RunDirectoryLocked(" ".join(message.splitlines()))

    def _storage_error(self, exc: OSError, path: Path, action: str = "create") -> StorageError:
        code = exc.errno if exc.errno is not None else errno.EIO
        what = "run directory" if path == self._run_dir else "run directory's lock file"
        return storage_error(path, code, f"cannot {action} the {what}")


def stop_advice(holder: LockHolder) -> str:
    """``'stop it (kill 1234 on host nid001, or cancel job 5678, e.g. scancel 5678), '``, or ``''`` when the lock
    file names neither a pid nor a job."""
    stops = []
    if holder.pid is not None:
        stops.append(f"kill {holder.pid} on host {holder.host}")
    if holder.job_id:
        stops.append(f"cancel job {holder.job_id}, e.g. scancel {holder.job_id}")
    return f"stop it ({', or '.join(stops)}), " if stops else ""
