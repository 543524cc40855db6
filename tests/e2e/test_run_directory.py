"""The run directory: one run at a time (the lock), writes that fail early and plainly, and resume that
finds its way (directories, damaged checkpoints, a longer run, weights only)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from killed_runs import kill_during_saves_then_resume
from tensorboard.summary.writer.record_writer import RecordWriter
from test_training_run import StopAtStep

import dlscale.runtime.atomic_files as atomic_files
from dlscale.checkpoint.files import load_checkpoint, save_checkpoint
from dlscale.cli import main
from dlscale.errors import CheckpointError, RunDirectoryLocked, StorageError
from dlscale.run.training import train, train_and_summarize
from dlscale.runtime.run_lock import LOCK_NAME, RunDirectoryLock

REPO = Path(__file__).resolve().parents[2]


def run_dir(cfg) -> Path:
    return Path(cfg.log.expdir) / cfg.name / cfg.log.run_num


def digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.glob("*.pt"))}


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@contextlib.contextmanager
def mounted_tmpfs(directory: Path, options: str):
    """A tmpfs at ``directory`` (root only); skips the test where mounting is not allowed."""
    directory.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory)], capture_output=True, check=False
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({result.stderr.decode().strip() or 'not root'})")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


# ------------------------------------------------------------------------------------------------ the lock


@pytest.mark.slow
def test_a_second_run_on_a_held_directory_fails_at_once_naming_the_holder(tiny_config):
    cfg = tiny_config("train.num_epochs=1")
    train(cfg)
    before = digests(run_dir(cfg) / "checkpoints")
    log_before = (run_dir(cfg) / "out.log").read_text()
    holder = RunDirectoryLock(run_dir(cfg), environ={"SLURM_JOB_ID": "4242"})
    holder.acquire()
    try:
        more = tiny_config("train.num_epochs=2")
        started = time.monotonic()
        with pytest.raises(RunDirectoryLocked) as raised:
            train(more)
        assert time.monotonic() - started < 10  # at once, not after a lease or a wait
    finally:
        holder.release()
    message = str(raised.value)
    assert f"pid {os.getpid()}" in message and "4242" in message and LOCK_NAME in message
    assert raised.value.exit_code == 75
    assert digests(run_dir(cfg) / "checkpoints") == before
    assert (run_dir(cfg) / "out.log").read_text() == log_before  # the refused run wrote nothing there


def test_a_lock_left_by_a_dead_process_is_taken_over_with_a_warning(tiny_config):
    cfg = tiny_config("train.num_epochs=1")
    directory = run_dir(cfg)
    directory.mkdir(parents=True)
    pid = dead_pid()
    record = {"host": os.uname().nodename, "pid": pid, "job_id": None, "started": "earlier", "token": "x"}
    (directory / LOCK_NAME).write_text(json.dumps(record))
    assert train(cfg) == 0
    log = (directory / "out.log").read_text()
    assert str(pid) in log and "no longer exists" in log
    assert not (directory / LOCK_NAME).exists()  # released at the end


@pytest.mark.slow
def test_two_runs_started_together_on_one_directory_exactly_one_trains(tiny_era5, tmp_path):
    command = [
        sys.executable,
        "-m",
        "dlscale",
        "train",
        "--config",
        "tiny",
        "--set",
        f"data.root={tiny_era5}",
        "--expdir",
        str(tmp_path / "runs"),
        "--progress",
        "none",
        "--num_epochs",
        "1",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    runs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in "ab"]
    results = [(run.wait(timeout=120), run.stderr.read().decode()) for run in runs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 75], results
    refused = next(err for code, err in results if code == 75)
    assert "is in use by" in refused or "holds" in refused or "pid" in refused
    assert refused.count("\n") == 1 and "Traceback" not in refused


# ---------------------------------------------------------------------------------------- write failures


def test_an_expdir_that_is_a_file_fails_with_one_plain_line(tiny_config, tmp_path):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file")
    with pytest.raises(StorageError, match=r"not_a_dir.*Not a directory \(ENOTDIR\)"):
        train(tiny_config(expdir=blocker))
    assert blocker.read_text() == "a file"


def test_a_read_only_expdir_fails_before_anything_is_built(tiny_config, tmp_path):
    expected = r"Read-only file system \(EROFS\).*writable --expdir"
    with (
        mounted_tmpfs(tmp_path / "ro", "ro,size=1m") as read_only,
        pytest.raises(StorageError, match=expected) as raised,
    ):
        train(tiny_config(expdir=read_only))
    assert raised.value.exit_code == 74


def test_a_read_only_checkpoints_directory_is_found_at_start_not_after_an_epoch(tiny_config, tmp_path):
    cfg = tiny_config()
    checkpoints = run_dir(cfg) / "checkpoints"
    expected = rf"{checkpoints}: cannot write: Read-only file system"
    with mounted_tmpfs(checkpoints, "ro,size=1m"), pytest.raises(StorageError, match=expected):
        train(cfg, extra_observers=[StopAtStep(1)])
    assert not (run_dir(cfg) / "out.log").exists()  # it failed before the run began: nothing was trained


class FullDisk:
    """``open`` for atomic_files whose files accept ``limit`` bytes, then fail with ENOSPC (a simulated full disk)."""

    def __init__(self, limit: int):
        self.limit = limit

    def __call__(self, path, mode="r", *args, **kwargs):
        handle = open(path, mode, *args, **kwargs)  # noqa: SIM115 - returned to the caller
        limit = self.limit

        class Limited:
            written = 0

            def write(self, data) -> int:
                if self.written + len(data) > limit:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                self.written += len(data)
                return handle.write(data)

            def __getattr__(self, name):
                return getattr(handle, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc_info):
                handle.close()

        return Limited()


@pytest.mark.slow
def test_a_full_disk_at_a_save_keeps_the_last_checkpoint_and_says_so_plainly(tiny_config, monkeypatch):
    cfg = tiny_config("train.num_epochs=1")
    train(cfg)
    checkpoints = run_dir(cfg) / "checkpoints"
    before = digests(checkpoints)
    monkeypatch.setattr(atomic_files, "open", FullDisk(limit=100_000), raising=False)
    with pytest.raises(StorageError) as raised:
        train(tiny_config("train.num_epochs=2"))
    message = str(raised.value)
    assert (
        f"{checkpoints / 'ckpt_latest.pt'}: cannot write the checkpoint (the previous one, if any, is unchanged)"
        in message
    )
    assert "No space left on device (ENOSPC)" in message and "\n" not in message
    assert digests(checkpoints) == before
    assert sorted(p.name for p in checkpoints.iterdir()) == ["ckpt_best.pt", "ckpt_latest.pt"]


def test_a_real_full_disk_fails_plainly_and_keeps_the_first_checkpoint(tiny_config, tmp_path):
    # 1 MB: room for one checkpoint (0.63 MB) and the logs, not for a second one beside it.
    with mounted_tmpfs(tmp_path / "small", "size=1000k") as small:
        cfg = tiny_config("log.tensorboard=false", "checkpoint.keep_best=false", expdir=small)
        with pytest.raises(StorageError, match=r"No space left on device \(ENOSPC\)"):
            train(cfg)
        state = load_checkpoint(run_dir(cfg) / "checkpoints" / "ckpt_latest.pt")
        assert state["progress"]["global_step"] == 11
        assert not [p for p in (run_dir(cfg) / "checkpoints").iterdir() if ".tmp-" in p.name]


def test_a_full_disk_under_tensorboards_writer_thread_is_one_line_naming_the_event_file(
    tiny_era5, tmp_path, monkeypatch, capsys
):
    run = tmp_path / "tiny" / "00"
    latest = run / "checkpoints" / "ckpt_latest.pt"
    real_write = RecordWriter.write

    def write_until_the_disk_is_full(self, data) -> None:
        # TensorBoard's own thread writes the events; the disk fills once the first checkpoint is saved.
        if latest.exists() and threading.current_thread() is not threading.main_thread():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as write() raises it: no file named
        real_write(self, data)

    monkeypatch.setattr(RecordWriter, "write", write_until_the_disk_is_full)
    thread_failures = []
    monkeypatch.setattr(threading, "excepthook", thread_failures.append)  # what Python would print
    status = main(
        ["train", "--yaml_config", str(REPO / "configs" / "vit_era5.yaml"), "--config", "tiny",
         "--set", f"data.root={tiny_era5}", "--expdir", str(tmp_path), "--progress", "none",
         "--num_epochs", "3", "--set", "checkpoint.keep_best=false"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert status == 74, err
    assert thread_failures == []  # no "Exception in thread Thread-1: Traceback ..."
    assert "Traceback" not in err and "Exception in thread" not in err
    (line,) = err.splitlines()
    assert line.startswith(f"dlscale: error: {run / 'tensorboard'}/events.out.tfevents."), line
    assert ": cannot write TensorBoard events: No space left on device (ENOSPC); the disk is full" in line
    # The checkpoint saved before the disk filled is intact.
    assert load_checkpoint(latest)["progress"]["global_step"] > 0
    assert not [p for p in latest.parent.iterdir() if ".tmp-" in p.name]


def test_too_little_space_for_one_checkpoint_fails_at_start(tiny_config, tmp_path):
    with mounted_tmpfs(tmp_path / "tiny", "size=400k") as small:
        cfg = tiny_config("log.tensorboard=false", expdir=small)
        with pytest.raises(StorageError, match="not enough free space for a checkpoint"):
            train(cfg)
        assert "Starting Training Loop" not in (run_dir(cfg) / "out.log").read_text()


@pytest.mark.slow
def test_temporary_files_of_killed_saves_are_removed_at_start(tiny_config):
    cfg = tiny_config("train.num_epochs=1")
    checkpoints = run_dir(cfg) / "checkpoints"
    checkpoints.mkdir(parents=True)
    leftovers = [checkpoints / ".ckpt_latest.pt.tmp-99999-0a1b2c3d", run_dir(cfg) / ".summary.json.tmp-1-ff"]
    for path in leftovers:
        path.write_bytes(b"\0" * 4096)
    keep = checkpoints / "notes.txt"
    keep.write_text("mine")
    train(cfg)
    assert not any(path.exists() for path in leftovers)
    assert keep.read_text() == "mine"
    assert "Removed 2 temporary file(s)" in (run_dir(cfg) / "out.log").read_text()


# ------------------------------------------------------------------------------------------------- resume


def test_resume_accepts_a_run_directory_or_its_checkpoints_directory(tiny_config, tmp_path):
    first = tiny_config(expdir=tmp_path / "first")
    train(first, extra_observers=[StopAtStep(5)])
    for name, source in (("run", run_dir(first)), ("ckpts", run_dir(first) / "checkpoints")):
        second = tiny_config(expdir=tmp_path / name, **{"checkpoint.resume": str(source)})
        train(second, extra_observers=[StopAtStep(6)])
        assert (
            load_checkpoint(run_dir(second) / "checkpoints" / "ckpt_latest.pt")["progress"]["global_step"]
            == 6
        )
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match=r"empty is a directory without ckpt_latest.pt"):
        train(tiny_config(expdir=tmp_path / "third", **{"checkpoint.resume": str(empty)}))


@pytest.mark.slow
def test_a_damaged_latest_checkpoint_names_the_ones_that_load(tiny_config):
    cfg = tiny_config()
    train(cfg, extra_observers=[StopAtStep(14)])  # epoch 1 is the best so far; latest is at step 14
    latest = run_dir(cfg) / "checkpoints" / "ckpt_latest.pt"
    latest.write_bytes(latest.read_bytes()[:1000])
    best = run_dir(cfg) / "checkpoints" / "ckpt_best.pt"
    with pytest.raises(CheckpointError) as raised:
        train(cfg)
    message = str(raised.value)
    assert "truncated or corrupt" in message and f"--resume {best}" in message and "global step 11" in message
    assert "--resume auto" not in message
    latest.unlink()
    with pytest.raises(CheckpointError, match=rf"holds ckpt_best.pt: continue from one with --resume {best}"):
        train(cfg)  # a fresh start here would replace ckpt_best.pt
    assert train(tiny_config(**{"checkpoint.resume": str(best)})) == 0
    assert load_checkpoint(latest)["progress"]["completed"]


@pytest.mark.slow
def test_more_epochs_continue_a_finished_run(tiny_config):
    train(tiny_config())
    assert train(tiny_config("train.num_epochs=3")) == 0
    cfg = tiny_config("train.num_epochs=3")
    state = load_checkpoint(run_dir(cfg) / "checkpoints" / "ckpt_latest.pt")
    assert state["progress"]["global_step"] == 33 and state["progress"]["completed"]
    assert [row["epoch"] for row in state["progress"]["history"]] == [1, 2, 3]
    log = (run_dir(cfg) / "out.log").read_text()
    assert "this config asks for 3 epochs, so it trains on to step 33" in log
    assert "resuming with a changed config" not in log


@pytest.mark.slow
def test_weights_only_starts_a_new_run_from_changed_heads(tiny_config, tmp_path):
    source_cfg = tiny_config("train.num_epochs=1", expdir=tmp_path / "source")
    train(source_cfg)
    source = run_dir(source_cfg) / "checkpoints" / "ckpt_latest.pt"
    before = digests(source.parent)
    tuned = tiny_config(
        "model.num_heads=2",
        "train.num_epochs=1",
        expdir=tmp_path / "tuned",
        **{"checkpoint.resume": str(source), "checkpoint.resume_weights_only": True},
    )
    assert train(tuned) == 0
    state = load_checkpoint(run_dir(tuned) / "checkpoints" / "ckpt_latest.pt")
    assert state["progress"]["global_step"] == 11  # a new run: one epoch from step 0
    assert digests(source.parent) == before
    assert f"Initial weights from {source}" in (run_dir(tuned) / "out.log").read_text()
    # The same command again continues the run it began (finished: nothing to train, its checkpoints kept),
    # instead of a new start from step 0 over them; tests/e2e/test_fine_tune_relaunch.py: the other cases.
    own = digests(run_dir(tuned) / "checkpoints")
    assert train(tuned) == 0
    assert digests(run_dir(tuned) / "checkpoints") == own
    assert "This run already finished (11 steps" in (run_dir(tuned) / "out.log").read_text()


# ------------------------------------------------------------------------- a relaunch, and what --resume refuses


@pytest.mark.slow
def test_a_relaunch_after_a_kill_before_the_report_writes_it_from_the_final_checkpoint(tiny_config):
    cfg = tiny_config()
    assert train(cfg) == 0
    directory = run_dir(cfg)
    reference = json.loads((directory / "summary.json").read_text())
    figures = sorted(p.name for p in (directory / "figures").glob("*.png"))
    assert reference["outcome"] == "finished" and figures
    # What a SIGKILL after the last checkpoint leaves (checked with the CLI): the checkpoints, the metrics CSVs
    # and the log, but no summary.json and an empty figures/.
    (directory / "summary.json").unlink()
    for figure in (directory / "figures").iterdir():
        figure.unlink()

    again = train_and_summarize(tiny_config())
    assert again.status == 0
    written = json.loads((directory / "summary.json").read_text())
    assert written == reference  # the final validation's metrics, the history, the figures' paths: all of it
    assert again.summary == written
    assert sorted(p.name for p in (directory / "figures").glob("*.png")) == figures
    log = (directory / "out.log").read_text()
    assert "the end-of-run report was missing (no summary.json): written from the final checkpoint" in log

    train(tiny_config())  # now complete: nothing to write again
    assert (directory / "out.log").read_text().count("the end-of-run report was missing") == 1


@pytest.mark.slow
def test_resume_names_what_it_was_given_instead_of_a_checkpoint_of_this_run(tiny_config, tiny_era5, tmp_path):
    def refused(source: Path) -> str:
        cfg = tiny_config("train.num_epochs=1", **{"checkpoint.resume": str(source)})
        with pytest.raises(CheckpointError) as raised:
            train(cfg)
        assert raised.value.exit_code == 2 and "\n" not in str(raised.value)
        return str(raised.value)

    data_file = next((tiny_era5 / "train").glob("*.h5"))
    message = refused(data_file)
    assert (
        f"{data_file} is not a dlscale checkpoint (an HDF5 file" in message and "--resume expects" in message
    )
    assert "damaged" not in message

    own = tiny_config("train.num_epochs=1")
    train(own)  # this run's own checkpoints, which the messages below must not offer
    source = load_checkpoint(run_dir(own) / "checkpoints" / "ckpt_latest.pt")
    mnist = tmp_path / "mnist_run" / "checkpoints" / "ckpt_latest.pt"
    save_checkpoint(
        {**source, "meta": {**source["meta"], "workload": "cnn_mnist", "config_name": "small"}}, mnist
    )
    message = refused(mnist)
    assert f"{mnist} is a checkpoint of workload 'cnn_mnist' (config 'small')" in message
    assert "this run trains workload 'era5_vit' (config 'tiny'), so it cannot be resumed" in message
    assert "share" not in message

    foreign = tmp_path / "other_run" / "checkpoints"
    foreign.mkdir(parents=True)
    save_checkpoint(source, foreign / "ckpt_best.pt")
    (foreign / "ckpt_latest.pt").write_bytes(
        (run_dir(own) / "checkpoints" / "ckpt_latest.pt").read_bytes()[:1000]
    )
    message = refused(foreign.parent)
    assert "truncated or corrupt" in message and f"--resume {foreign / 'ckpt_best.pt'}" in message
    assert str(run_dir(own)) not in message


@pytest.mark.slow
def test_a_kill_9_after_the_last_checkpoint_leaves_what_the_relaunch_completes(tiny_era5, tmp_path):
    # The real kill behind the simulated one above: the 2 epochs' saves are done, the report (a second of
    # figures) is not.
    args = [
        "train", "--yaml_config", str(REPO / "configs" / "vit_era5.yaml"), "--config", "tiny",
        "--set", f"data.root={tiny_era5}", "--expdir", str(tmp_path), "--progress", "none",
    ]  # fmt: skip
    run = tmp_path / "tiny" / "00"
    relaunched = kill_during_saves_then_resume(args, run, saves=2)
    assert relaunched.returncode == 0, relaunched.stderr
    assert "the end-of-run report was missing (no summary.json): written from the final checkpoint" in (
        relaunched.stdout
    )
    summary = json.loads((run / "summary.json").read_text())
    assert summary["outcome"] == "finished" and summary["global_step"] == 22 and summary["final"]["metrics"]
    assert all(Path(figure).is_file() for figure in summary["figures"]) and len(summary["figures"]) >= 2
