"""An output directory (a forecast's, a score's, a climatology store) written in one piece by one process at a
time: what killed writers left beside it is removed (a set-aside earlier one put back), a writer that is still
running keeps its temporaries and refuses the second one, a write that fails is one line naming the command's
option and leaves the earlier directory as it was."""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from mounted_disks import mounted_tmpfs

from dlscale.errors import RunDirectoryLocked, StorageError
from dlscale.runtime.output_directory import OutputDirectoryLock, lock_path, write_results_directory


def write_scores(text: str):
    return lambda tmp: (tmp / "scores.json").write_text(text)


def leftovers(directory: Path) -> list[str]:
    """Everything beside ``directory`` that belongs to it but itself."""
    return sorted(
        entry.name for entry in directory.parent.iterdir() if entry.name.startswith(f".{directory.name}.")
    )


def test_a_results_directory_that_cannot_be_written_is_one_line_and_the_earlier_one_stays(tmp_path: Path):
    directory = tmp_path / "forecast" / "test-ckpt_latest"
    write_results_directory(directory, write_scores("{}"), "the forecast")

    def full_disk(tmp: Path) -> None:
        (tmp / "scores.json").write_text('{"new": 1}')
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(StorageError) as raised:
        write_results_directory(directory, full_disk, "the scores", "--out")
    message = str(raised.value)
    assert message.startswith(
        f"{directory}: cannot write the scores (an earlier one is unchanged): No space left"
    )
    assert message.endswith("the disk is full: free some space or choose another --out"), message
    assert (directory / "scores.json").read_text() == "{}"
    assert leftovers(directory) == []  # neither a temporary nor the lock
    with pytest.raises(ValueError, match="a bug"):  # anything else is no storage error: it goes on as it is
        write_results_directory(directory, lambda tmp: (_ for _ in ()).throw(ValueError("a bug")), "it")


def test_what_killed_writers_left_is_removed_by_the_next_write(tmp_path: Path):
    directory = tmp_path / "score-forecast"
    write_results_directory(directory, write_scores("{}"), "the scores")
    half = tmp_path / ".score-forecast.tmp-99999-0a1b2c3d"  # killed while filling: a half forecast.zarr
    (half / "forecast.zarr" / "z").mkdir(parents=True)
    (half / "forecast.zarr" / "z" / "0.0").write_bytes(b"x" * 1000)
    aside = tmp_path / ".score-forecast.old-99998-ff"  # killed after its new one was in place
    aside.mkdir()
    (aside / "scores.json").write_text("{}")
    others = [tmp_path / ".score-forecast.tmp-notes", tmp_path / ".score-other.tmp-1-aa", tmp_path / "keep"]
    for path in others:
        path.write_text("not a temporary of this directory")
    write_results_directory(directory, write_scores('{"second": 1}'), "the scores")
    assert (directory / "scores.json").read_text() == '{"second": 1}'
    assert leftovers(directory) == [".score-forecast.tmp-notes"]
    assert all(path.exists() for path in others)


def test_an_earlier_directory_set_aside_by_a_killed_write_is_put_back(tmp_path: Path, caplog):
    directory = tmp_path / "forecast" / "test-ckpt_latest"
    # Killed between its two renames: the earlier directory aside, the new one complete or not, none in place.
    aside = directory.with_name(".test-ckpt_latest.old-4242-0a")
    aside.mkdir(parents=True)
    (aside / "scores.json").write_text('{"earlier": 1}')
    unfinished = directory.with_name(".test-ckpt_latest.tmp-4242-0a")
    unfinished.mkdir()
    with pytest.raises(ValueError):  # a write that fails must leave the earlier directory, put back, as it is
        write_results_directory(
            directory, lambda tmp: (_ for _ in ()).throw(ValueError("a bug")), "the forecast"
        )
    assert (directory / "scores.json").read_text() == '{"earlier": 1}'
    assert leftovers(directory) == []
    assert "put the forecast back from .test-ckpt_latest.old-4242-0a" in caplog.text


def test_a_directory_another_process_writes_now_is_refused_and_its_temporaries_kept(tmp_path: Path):
    directory = tmp_path / "scores"
    writing = tmp_path / f".scores.tmp-{os.getpid()}-0a1b"  # the holder's own temporary, being filled
    writing.mkdir()
    holder = OutputDirectoryLock(directory, "--out")
    holder.acquire()
    try:
        with pytest.raises(RunDirectoryLocked) as raised:
            write_results_directory(directory, write_scores("{}"), "the scores", "--out")
    finally:
        holder.release()
    message = str(raised.value)
    assert message.startswith(f"{directory}: another process is writing it now: pid {os.getpid()} on host")
    assert f"delete {lock_path(directory)}" in message and "\n" not in message
    assert writing.is_dir() and not directory.exists()


def test_a_read_only_directory_is_one_line_naming_the_commands_option(tmp_path: Path):
    read_only = tmp_path / "results"
    with mounted_tmpfs(read_only, "ro,size=1m"), pytest.raises(StorageError) as raised:
        write_results_directory(
            read_only / "climatology.zarr", write_scores("{}"), "the climatology", "--root"
        )
    message = str(raised.value)
    assert message == (
        f"{read_only / '.climatology.zarr.lock'}: cannot create the lock file of climatology.zarr: Read-only file "
        "system (EROFS); the file system is read-only: choose a writable --root"
    )


WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from dlscale.runtime.output_directory import write_results_directory

    def fill(tmp):
        (tmp / "forecast.zarr").mkdir()
        (tmp / "forecast.zarr" / "chunk").write_bytes(b"x" * 100000)
        (Path(sys.argv[2])).write_text("filling")
        time.sleep(600)

    write_results_directory(Path(sys.argv[1]), fill, "the forecast")
    """
)


def test_a_writer_killed_mid_write_leaves_the_earlier_directory_and_the_next_write_cleans_up(tmp_path: Path):
    directory = tmp_path / "forecast" / "test-ckpt_latest"
    write_results_directory(directory, write_scores('{"earlier": 1}'), "the forecast")
    signal_file = tmp_path / "filling"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(directory), str(signal_file)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not signal_file.exists():
            assert writer.poll() is None and time.monotonic() < deadline, writer.stderr.read()
            time.sleep(0.01)
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
    finally:
        writer.kill()
    assert (directory / "scores.json").read_text() == '{"earlier": 1}'  # the earlier one, whole
    left = leftovers(directory)
    assert len(left) == 2 and left[0] == lock_path(directory).name, left
    assert re.fullmatch(rf"\.test-ckpt_latest\.tmp-{writer.pid}-[0-9a-f]+", left[1]), left
    write_results_directory(directory, write_scores('{"again": 1}'), "the forecast")
    assert (directory / "scores.json").read_text() == '{"again": 1}'
    assert leftovers(directory) == []
