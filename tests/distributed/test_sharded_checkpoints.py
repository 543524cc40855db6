"""Sharded checkpoints (``checkpoint.format: dcp``): every rank writes its own shards, and a run continues from
them in another layout, on another number of processes, or on one, as if it had never stopped."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from forked_ranks import run_ranks
from test_data_parallel import StopAtStep, tiny
from test_model_parallel import WEIGHT_TOLERANCE, history, train_layout

import dlscale
from dlscale.checkpoint.directory import CheckpointDir
from dlscale.checkpoint.files import load_checkpoint
from dlscale.checkpoint.sharded_files import HEADER_NAME, is_complete
from dlscale.errors import CheckpointError
from dlscale.run.training import train

SHARDED = ("log.tensorboard=false", "checkpoint.format=dcp")


def checkpoints_of(expdir: Path) -> CheckpointDir:
    return CheckpointDir(expdir / "tiny" / "00" / "checkpoints")


def latest(expdir: Path) -> dict:
    return load_checkpoint(checkpoints_of(expdir).latest_path)


def weights(expdir: Path) -> dict[str, np.ndarray]:
    return {name: value.numpy() for name, value in latest(expdir)["model"].items()}


def train_serial(data: Path, expdir: Path, *overrides: str, stop_step: int | None = None) -> str:
    observers = [StopAtStep(stop_step)] if stop_step is not None else []
    return train(tiny(data, expdir, *overrides), extra_observers=observers)


@pytest.mark.slow
def test_a_sharded_checkpoint_resumes_bitwise_on_one_process(tiny_era5, tmp_path):
    unstopped = tmp_path / "unstopped"
    train_serial(tiny_era5, unstopped, "log.tensorboard=false")
    stopped = tmp_path / "stopped"
    train_serial(tiny_era5, stopped, *SHARDED, "checkpoint.keep_last=1", stop_step=5)
    checkpoints = checkpoints_of(stopped)
    assert checkpoints.latest_path.name == "ckpt_latest" and checkpoints.latest_path.is_symlink()
    assert checkpoints.latest_path.resolve().name == "ckpt_step00000005"
    assert latest(stopped)["progress"]["global_step"] == 5

    train_serial(tiny_era5, stopped, *SHARDED, "checkpoint.keep_last=1")
    assert latest(stopped)["progress"]["completed"]
    expected, actual = weights(unstopped), weights(stopped)
    assert expected.keys() == actual.keys()
    for name in expected:
        assert np.array_equal(expected[name], actual[name]), name
    losses = [(row["train_loss"], row["val_loss"]) for row in history(unstopped)]
    assert [(row["train_loss"], row["val_loss"]) for row in history(stopped)] == losses
    # latest, best and one more are kept; the directories no pointer keeps are gone
    kept = {path.name for path in checkpoints.numbered_directories()}
    assert checkpoints.latest_path.resolve().name in kept and len(kept) <= 3
    assert all(is_complete(checkpoints.directory / name) for name in kept)
    assert (checkpoints.best_path / HEADER_NAME).is_file()

    # dlscale evaluate reads the best one (a sharded directory) as it reads a file: the best validation loss again
    metrics = dlscale.evaluate(stopped / "tiny" / "00", checkpoint="best")
    assert metrics["checkpoint"] == str(checkpoints.best_path)
    assert metrics["loss"] == pytest.approx(min(row["val_loss"] for row in history(stopped)), rel=1e-6)
    # dlscale export consolidates the shards into one weights file, on one process
    exported = dlscale.load_model(dlscale.export(stopped / "tiny" / "00", tmp_path / "export").directory)
    assert exported.manifest["source"]["checkpoint"] == str(checkpoints.latest_path.resolve())
    for name, value in exported.model.state_dict().items():
        assert np.array_equal(value.numpy(), actual[name]), name


@pytest.mark.slow
def test_dp2_tp2_shards_resume_on_dp2_tp2_bitwise_and_on_dp4_and_one_process(tiny_era5, tmp_path):
    layout = (*SHARDED, "parallel.tensor_parallel=2", "parallel.stop_check_every=1")
    unstopped = tmp_path / "unstopped"
    assert run_ranks(4, train_layout, tiny_era5, unstopped, layout) == [0] * 4
    expected = weights(unstopped)

    stopped = tmp_path / "dp2xtp2"
    assert run_ranks(4, train_layout, tiny_era5, stopped, layout, 5) == [0] * 4
    saved = checkpoints_of(stopped).latest_path
    assert sorted(p.name for p in saved.glob("*.distcp")) == [f"__{r}_0.distcp" for r in range(4)]
    resume = f"checkpoint.resume={saved.resolve()}"
    dp4, one_process = tmp_path / "dp4", tmp_path / "one"
    assert run_ranks(4, train_layout, tiny_era5, dp4, (*SHARDED, resume)) == [0] * 4  # dp=4 from dp=2 x tp=2
    train_serial(tiny_era5, one_process, *SHARDED, resume)
    assert run_ranks(4, train_layout, tiny_era5, stopped, layout) == [0] * 4  # the same layout continues

    actual = weights(stopped)
    assert all(np.array_equal(actual[name], expected[name]) for name in expected)
    for resumed in (dp4, one_process):
        assert latest(resumed)["progress"]["completed"]
        actual = weights(resumed)  # another layout sums in another order: equal to rounding
        for name in expected:
            np.testing.assert_allclose(
                actual[name], expected[name], rtol=WEIGHT_TOLERANCE, atol=2e-6, err_msg=name
            )


def train_with_a_stalled_write(data: Path, expdir: Path, stalled: str, started: Path) -> None:
    """Train with background saves whose write into ``stalled`` (a step directory's name) never ends: it marks
    ``started`` and sleeps until the parent kills this process."""
    from torch.distributed.checkpoint import filesystem

    original = filesystem.FileSystemWriter.write_data

    def write_data(self, plan, planner):
        if Path(str(self.path)).name == stalled:
            started.write_text("writing")
            time.sleep(300)
        return original(self, plan, planner)

    filesystem.FileSystemWriter.write_data = write_data
    train_serial(data, expdir, *ASYNC)


ASYNC = (*SHARDED, "checkpoint.async_save=true", "checkpoint.save_every_steps=3")


@pytest.mark.slow
def test_kill_9_during_a_background_save_leaves_the_previous_checkpoint_whole(tiny_era5, tmp_path):
    expdir, started = tmp_path / "killed", tmp_path / "started"
    child = multiprocessing.get_context("fork").Process(
        target=train_with_a_stalled_write, args=(tiny_era5, expdir, "ckpt_step00000006", started)
    )
    child.start()
    try:
        deadline = time.monotonic() + 120
        while not started.exists():
            assert child.is_alive() and time.monotonic() < deadline, "the run ended before its second save"
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGKILL)  # while the step-6 shards are being written in the background
        child.join(30)
    finally:
        child.kill()
    checkpoints = checkpoints_of(expdir)
    assert checkpoints.latest_path.resolve().name == "ckpt_step00000003"
    assert latest(expdir)["progress"]["global_step"] == 3  # complete and loadable
    interrupted = checkpoints.directory / "ckpt_step00000006"
    assert interrupted.is_dir() and not is_complete(interrupted)
    with pytest.raises(CheckpointError, match="incomplete sharded checkpoint"):
        load_checkpoint(interrupted)

    # Continued from step 3, it ends where a run that was never stopped ends, and the leftovers are gone.
    train_serial(tiny_era5, expdir, *ASYNC)
    unstopped = tmp_path / "unstopped"
    train_serial(tiny_era5, unstopped, "log.tensorboard=false")
    assert latest(expdir)["progress"]["completed"]
    expected, actual = weights(unstopped), weights(expdir)
    assert all(np.array_equal(expected[name], actual[name]) for name in expected)
    assert [d.name for d in checkpoints.numbered_directories()] == [checkpoints.latest_path.resolve().name]
    log_text = (expdir / "tiny" / "00" / "out.log").read_text()
    assert "being written to" in log_text and "written in the background" in log_text


@pytest.mark.slow
@pytest.mark.parametrize("method", ["sync", "async"])
def test_two_ranks_write_their_shards_and_one_process_continues(tiny_era5, tmp_path, method):
    """dp=2 (DDP replicas): DCP writes the replicated tensors once; the run continues on one process."""
    expdir = tmp_path / "dp2"
    extra = ("checkpoint.async_save=true",) if method == "async" else ()
    assert run_ranks(
        2, train_layout, tiny_era5, expdir, (*SHARDED, *extra, "parallel.stop_check_every=1"), 5
    ) == [0, 0]
    saved = checkpoints_of(expdir).latest_path
    assert latest(expdir)["progress"]["global_step"] == 5 and latest(expdir)["meta"]["world_size"] == 2
    sizes = [p.stat().st_size for p in sorted(saved.glob("*.distcp"))]
    one_copy = sum(v.numel() * v.element_size() for v in latest(expdir)["model"].values())
    # Each rank writes a part of the weights and Adam's two moments; replicas do not each write all of them.
    assert len(sizes) == 2 and max(sizes) < 3 * one_copy
    train_serial(tiny_era5, expdir, *SHARDED, *extra)
    assert latest(expdir)["progress"]["completed"] and latest(expdir)["meta"]["world_size"] == 1
