"""The run directory lock: one live run per directory, stale locks taken over, clear errors otherwise."""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dlscale.errors import RunDirectoryLocked, StorageError
from dlscale.runtime.run_lock import LOCK_NAME, LockHolder, RunDirectoryLock, job_id_from_environment

HOST = socket.gethostname()
OTHER_HOST = "some-other-node.invalid"


def process_start(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat, read independently of the module under test."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rfind(")") + 2 :].split()[19])


def own_start() -> int | None:
    """This process's start time where the module can check it (Linux), else None."""
    return process_start(os.getpid()) if sys.platform.startswith("linux") else None


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def write_lock(
    run_dir: Path,
    *,
    host: str = HOST,
    pid: int,
    job_id: str | None = None,
    token: str = "feedfacefeedface",
    process_start: int | None = None,
    age_s: float = 0.0,
) -> Path:
    """A lock file as another process would have left it, with its last heartbeat ``age_s`` ago."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_NAME
    record = {
        "host": host,
        "pid": pid,
        "job_id": job_id,
        "started": "2026-11-23T10:00:01+01:00",
        "started_unix": 0.0,
        "token": token,
        "process_start": process_start,
    }
    path.write_text(json.dumps(record))
    set_age(path, age_s)
    return path


def set_age(path: Path, age_s: float) -> None:
    then = time.time() - age_s
    os.utime(path, (then, then))


@pytest.fixture
def make_lock(tmp_path: Path) -> Iterator:
    """Builds locks on ``tmp_path/run`` (no batch job unless given) and releases them all after the test."""
    locks: list[RunDirectoryLock] = []

    def make(run_dir: Path | None = None, **kwargs) -> RunDirectoryLock:
        # An explicit environ, so that running the tests inside a Slurm job does not make them wait.
        kwargs.setdefault("environ", {})
        lock = RunDirectoryLock(tmp_path / "run" if run_dir is None else run_dir, **kwargs)
        locks.append(lock)
        return lock

    yield make
    for lock in locks:
        lock.release()


@pytest.fixture
def lock_log(caplog: pytest.LogCaptureFixture) -> Iterator:
    """Records of the dlscale.train logger, even after setup_logging stopped 'dlscale' propagating."""
    dlscale_logger = logging.getLogger("dlscale")
    propagate = dlscale_logger.propagate
    dlscale_logger.propagate = True
    with caplog.at_level(logging.INFO, logger="dlscale.train"):
        yield lambda level: [
            r.getMessage() for r in caplog.records if r.name == "dlscale.train" and r.levelno == level
        ]
    dlscale_logger.propagate = propagate


def heartbeat_threads(lock: RunDirectoryLock) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if str(lock.path) in t.name]


def test_job_id_comes_from_the_first_scheduler_variable_set() -> None:
    assert job_id_from_environment({"LSB_JOBID": "12", "PBS_JOBID": "34"}) == "12"
    assert job_id_from_environment({"SLURM_JOB_ID": "", "PBS_JOBID": "34.server"}) == "34.server"
    assert job_id_from_environment({}) is None


def test_acquire_records_the_holder_and_release_removes_the_file(make_lock, tmp_path: Path) -> None:
    lock = make_lock(environ={"SLURM_JOB_ID": "5678"})
    lock.acquire()
    assert lock.path == tmp_path / "run" / LOCK_NAME
    record = json.loads(lock.path.read_text())
    assert record["host"] == HOST
    assert record["pid"] == os.getpid()
    assert record["job_id"] == "5678"
    assert abs(record["started_unix"] - time.time()) < 60
    assert record["started"][:10] == time.strftime("%Y-%m-%d")
    assert len(record["token"]) == 16
    if sys.platform.startswith("linux"):
        assert record["process_start"] == process_start(os.getpid())
    holder = lock.current_holder()
    assert (holder.host, holder.pid, holder.job_id, holder.token) == (
        HOST,
        os.getpid(),
        "5678",
        record["token"],
    )
    assert f"pid {os.getpid()} on host {HOST} (job 5678)" in holder.describe()
    with pytest.raises(RuntimeError):
        lock.acquire()

    lock.release()
    assert not lock.path.exists()
    assert lock.current_holder() is None
    lock.release()  # a second release is harmless

    with lock:
        assert json.loads(lock.path.read_text())["token"] != record["token"]
    assert not lock.path.exists()


def test_the_context_manager_releases_when_the_run_fails(make_lock) -> None:
    lock = make_lock()
    with pytest.raises(KeyError), lock:
        raise KeyError("boom")
    assert not lock.path.exists()
    assert heartbeat_threads(lock) == []


def test_a_second_lock_on_a_held_directory_fails_at_once_naming_the_holder(make_lock) -> None:
    first = make_lock()
    first.acquire()
    token = json.loads(first.path.read_text())["token"]
    with pytest.raises(RunDirectoryLocked) as raised:
        make_lock().acquire()
    message = str(raised.value)
    assert f"pid {os.getpid()}" in message
    assert f"host {HOST}" in message
    assert str(first.path) in message
    assert "no job id" in message and "--expdir" in message
    assert "\n" not in message
    assert json.loads(first.path.read_text())["token"] == token


def test_a_lock_left_by_a_dead_process_on_this_host_is_taken_over(
    make_lock, lock_log, tmp_path: Path
) -> None:
    pid = dead_pid()
    write_lock(tmp_path / "run", pid=pid, job_id="4242")
    lock = make_lock()
    lock.acquire()
    assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    [warning] = lock_log(logging.WARNING)
    assert f"pid {pid} on host {HOST} (job 4242)" in warning
    assert f"process {pid} on this host no longer exists" in warning
    assert not lock.path.with_name(LOCK_NAME + ".takeover").exists()


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="process start times come from Linux's /proc"
)
def test_a_lock_whose_pid_was_reused_by_a_later_process_is_taken_over(
    make_lock, lock_log, tmp_path: Path
) -> None:
    # Our own pid exists, but it was not this process that took the lock.
    write_lock(tmp_path / "run", pid=os.getpid(), process_start=process_start(os.getpid()) - 1)
    make_lock().acquire()
    [warning] = lock_log(logging.WARNING)
    assert f"process {os.getpid()} on this host is a later process that reused the pid" in warning


def test_a_holder_on_another_host_blocks_until_its_lease_expires(make_lock, lock_log, tmp_path: Path) -> None:
    path = write_lock(tmp_path / "run", host=OTHER_HOST, pid=1234, age_s=5.0)
    with pytest.raises(RunDirectoryLocked, match=f"pid 1234 on host {OTHER_HOST}.*last heartbeat 5 s ago"):
        make_lock(lease_s=90.0).acquire()
    assert json.loads(path.read_text())["host"] == OTHER_HOST

    set_age(path, 300.0)
    make_lock(lease_s=90.0).acquire()
    assert json.loads(path.read_text())["host"] == HOST
    [warning] = lock_log(logging.WARNING)
    assert f"host {OTHER_HOST}" in warning
    assert "its last heartbeat was 300 s ago, beyond the 90 s lease" in warning


def test_a_live_holder_of_our_own_job_is_waited_for(make_lock, lock_log, tmp_path: Path) -> None:
    # Our own pid with another token: a holder that is alive, as a requeued job's previous incarnation may be.
    path = write_lock(tmp_path / "run", pid=os.getpid(), job_id="77", process_start=own_start())
    previous_ends = threading.Timer(0.3, path.unlink)
    previous_ends.start()
    try:
        lock = make_lock(environ={"SLURM_JOB_ID": "77"}, wait_same_job_s=5.0, poll_s=0.02)
        lock.acquire()
    finally:
        previous_ends.cancel()
    assert lock.current_holder().token != "feedfacefeedface"
    [info] = lock_log(logging.INFO)
    assert "job 77" in info and "waiting up to 5 s" in info


def test_waiting_for_our_own_job_gives_up_after_wait_same_job_s(make_lock, tmp_path: Path) -> None:
    write_lock(tmp_path / "run", pid=os.getpid(), job_id="77")
    lock = make_lock(environ={"SLURM_JOB_ID": "77"}, wait_same_job_s=0.1, poll_s=0.02)
    with pytest.raises(
        RunDirectoryLocked, match=r"We waited 0\.1\d* s for it to end, as it belongs to our own job 77\."
    ):
        lock.acquire()


def test_a_live_holder_of_another_job_fails_at_once(make_lock, tmp_path: Path) -> None:
    write_lock(tmp_path / "run", pid=os.getpid(), job_id="76")
    lock = make_lock(environ={"SLURM_JOB_ID": "77"}, wait_same_job_s=60.0, poll_s=0.02)
    started = time.monotonic()
    with pytest.raises(RunDirectoryLocked, match="job 76") as raised:
        lock.acquire()
    assert time.monotonic() - started < 1.0
    assert "waited" not in str(raised.value)


def contend_at_once(locks: list[RunDirectoryLock]) -> list[str]:
    """Let every lock try to acquire at the same moment, each in its own thread; "won" or "locked" for each."""
    start_together = threading.Barrier(len(locks))
    outcomes: list[str] = []

    def contend(lock: RunDirectoryLock) -> None:
        start_together.wait()
        try:
            lock.acquire()
            outcomes.append("won")
        except RunDirectoryLocked:
            outcomes.append("locked")

    threads = [threading.Thread(target=contend, args=(lock,)) for lock in locks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(outcomes)


def test_contenders_for_one_stale_lock_yield_exactly_one_winner(tmp_path: Path) -> None:
    contenders = 3
    # Repeated, so that the contenders really do collide in some rounds.
    for round_number in range(10):
        run_dir = tmp_path / f"run{round_number}"
        write_lock(run_dir, pid=dead_pid())
        locks = [RunDirectoryLock(run_dir, environ={}) for _ in range(contenders)]
        try:
            outcomes = contend_at_once(locks)
            assert outcomes == ["locked"] * (contenders - 1) + ["won"], f"round {round_number}"
            assert not (run_dir / (LOCK_NAME + ".takeover")).exists()
        finally:
            for lock in locks:
                lock.release()


def test_a_contender_that_saw_the_stale_lock_does_not_remove_the_winners_fresh_one(
    make_lock, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The unlucky interleaving, made certain: B reads the stale lock, then A takes it over completely before B
    # starts its own takeover. B must notice that the file changed instead of deleting A's fresh lock.
    write_lock(tmp_path / "run", pid=dead_pid())
    a, b = make_lock(), make_lock()
    read = RunDirectoryLock._read

    def read_then_let_a_in(self: RunDirectoryLock):
        state = read(self)
        if self is b and a.current_holder().pid != os.getpid():
            a.acquire()
        return state

    monkeypatch.setattr(RunDirectoryLock, "_read", read_then_let_a_in)
    with pytest.raises(RunDirectoryLocked):
        b.acquire()
    a.release()
    assert not a.path.exists()  # A's own lock was still there for it to remove


def test_the_heartbeat_refreshes_the_lease_and_stops_on_release(make_lock) -> None:
    lock = make_lock(heartbeat_s=0.05)
    lock.acquire()
    [heartbeat] = heartbeat_threads(lock)
    set_age(lock.path, 1000.0)
    deadline = time.monotonic() + 5.0
    while time.time() - lock.path.stat().st_mtime > 10.0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert time.time() - lock.path.stat().st_mtime < 10.0
    lock.release()
    assert not heartbeat.is_alive()
    assert heartbeat_threads(lock) == []


def test_the_heartbeat_reports_a_takeover_once_and_stops(make_lock, lock_log) -> None:
    lock = make_lock(heartbeat_s=0.02)
    lock.acquire()
    [heartbeat] = heartbeat_threads(lock)
    # Someone on another node decided our lease had expired and took the directory.
    write_lock(lock.path.parent, host=OTHER_HOST, pid=999, job_id="31", age_s=0.0)
    heartbeat.join(timeout=5.0)
    assert not heartbeat.is_alive()
    [error] = lock_log(logging.ERROR)
    assert "was taken over by pid 999 on host some-other-node.invalid (job 31)" in error
    lock.release()
    assert json.loads(lock.path.read_text())["host"] == OTHER_HOST  # not ours to remove


def test_an_unparsable_lock_file_is_waited_for_while_it_may_be_being_written(
    make_lock, lock_log, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path = run_dir / LOCK_NAME
    # Its writer finishes it: the waiting contender then sees a live holder and fails naming it.
    path.write_bytes(b'{"host": "nid0')
    finish = threading.Timer(
        0.2, lambda: write_lock(run_dir, host=OTHER_HOST, pid=999, job_id="8", age_s=0.0)
    )
    finish.start()
    with pytest.raises(RunDirectoryLocked, match=r"pid 999 on host some-other-node.invalid"):
        make_lock(unparsable_grace_s=10.0, poll_s=0.02).acquire()
    finish.join()

    # Its writer was killed between creating and writing it: taken over once the grace period is over.
    path.write_bytes(b'{"host": "nid0')
    started = time.monotonic()
    make_lock(unparsable_grace_s=0.3, poll_s=0.02).acquire()
    assert time.monotonic() - started >= 0.25
    assert json.loads(path.read_text())["pid"] == os.getpid()
    [warning] = lock_log(logging.WARNING)
    assert "empty or unreadable" in warning


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_run_directory_is_a_storage_error(make_lock, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_dir.chmod(0o555)
    try:
        with pytest.raises(StorageError, match=r"Permission denied \(EACCES\).*--expdir") as raised:
            make_lock(run_dir).acquire()
    finally:
        run_dir.chmod(0o755)
    assert str(run_dir / LOCK_NAME) in str(raised.value)


def test_a_run_directory_that_is_a_file_is_a_storage_error(make_lock, tmp_path: Path) -> None:
    not_a_dir = tmp_path / "run"
    not_a_dir.write_text("a file")
    with pytest.raises(StorageError, match=r"Not a directory \(ENOTDIR\).*--expdir") as raised:
        make_lock(not_a_dir).acquire()
    assert str(not_a_dir) in str(raised.value)
    with pytest.raises(StorageError, match=r"\(ENOTDIR\)"):
        make_lock(not_a_dir / "below").acquire()


def test_a_full_disk_while_writing_the_lock_is_a_storage_error_and_leaves_no_file(
    make_lock, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disk_full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", disk_full)
    lock = make_lock()
    with pytest.raises(StorageError, match=r"No space left on device \(ENOSPC\)") as raised:
        lock.acquire()
    assert str(lock.path) in str(raised.value)
    assert not lock.path.exists()
    assert heartbeat_threads(lock) == []


def test_holder_description_without_a_job_or_heartbeat() -> None:
    holder = LockHolder("nid001", 1234, None, "2026-11-23T10:00:01", "t", None, None)
    assert holder.describe() == "pid 1234 on host nid001 (no job id), started 2026-11-23 10:00:01"
