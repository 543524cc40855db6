"""What --resume says when it is given the wrong thing: a file that is no checkpoint (named for what it looks
like), another workload's checkpoint, another run's damaged checkpoint (the checkpoints beside *it* that load);
and when a finished run's end-of-run report is missing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from dlscale.checkpoint.directory import CheckpointDir
from dlscale.checkpoint.files import foreign_file_kind, save_checkpoint
from dlscale.checkpoint.resume import (
    check_workload,
    checkpoint_file,
    load_for_resume,
    recovery_hint,
)
from dlscale.errors import CheckpointError
from dlscale.report.summary import missing_report
from dlscale.training.training_setup import RunRecord


def checkpoint_at(path: Path, global_step: int) -> Path:
    """A small checkpoint file (what recovery reads of one: its position)."""
    return save_checkpoint({"progress": {"epoch": 1, "global_step": global_step}}, path)


def record(workload: str = "cnn_mnist", name: str = "tiny") -> RunRecord:
    return RunRecord(name, "configs/x.yaml", workload, (), {}, frozenset())


def one_line_naming(message: str, path: Path) -> None:
    assert str(path) in message and "\n" not in message


# ------------------------------------------------------------------------------- files that are no checkpoint


def write_hdf5(path: Path) -> Path:
    with h5py.File(path, "w") as f:
        f["fields"] = np.zeros((2, 3), dtype=np.float32)
    return path


@pytest.mark.parametrize(
    "name, write, looks_like",
    [
        ("1980.h5", write_hdf5, "an HDF5 file"),
        ("ckpt_latest.pt", write_hdf5, "an HDF5 file"),  # whatever its name says
        ("stats.npy", lambda p: np.save(p, np.zeros(3)), "a NumPy .npy array"),
        ("stats.npz", lambda p: np.savez(p, a=np.zeros(3)), "a NumPy .npz archive"),
        ("tiny.yaml", lambda p: p.write_text("tiny:\n  extends: base\n"), "a text file, beginning 'tiny:'"),
        (
            "model.pt",
            lambda p: p.write_text("version https://git-lfs.github.com/spec/v1\n"),
            "a Git LFS pointer",
        ),
        ("notes.txt", lambda p: p.write_bytes(b""), "an empty file"),
        ("blob.bin", lambda p: p.write_bytes(bytes(range(256)) * 4), "a file of unknown format"),
        (
            "legacy.pt",
            lambda p: torch.save({"a": 1}, p, _use_new_zipfile_serialization=False),
            "a pickle file",
        ),
    ],
)
def test_a_file_that_is_no_checkpoint_is_named_for_what_it_looks_like(tmp_path, name, write, looks_like):
    path = tmp_path / name
    write(path)
    assert looks_like in (foreign_file_kind(path) or "")
    with pytest.raises(CheckpointError) as raised:
        checkpoint_file(path)
    message = str(raised.value)
    one_line_naming(message, path)
    assert f"{path} is not a dlscale checkpoint ({looks_like}" in message
    assert "--resume expects a checkpoint file" in message
    assert "damaged" not in message and "aside" not in message


def test_checkpoints_intact_or_damaged_are_left_to_the_loader(tmp_path):
    good = checkpoint_at(tmp_path / "ckpt_latest.pt", 3)
    truncated = tmp_path / "ckpt_best.pt"
    truncated.write_bytes(good.read_bytes()[:200])
    garbage = tmp_path / "ckpt_step00000003.pt"
    garbage.write_bytes(bytes(range(256)) * 4)  # unknown bytes under a checkpoint's name: damage
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    for path in (good, truncated, garbage, empty):
        assert foreign_file_kind(path) is None, path
        assert checkpoint_file(path) == path


def test_an_intact_torch_file_of_another_kind_is_not_called_damaged(tmp_path):
    bare = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(2)}, bare)
    own = CheckpointDir(tmp_path / "run" / "checkpoints")
    with pytest.raises(CheckpointError) as raised:
        load_for_resume(bare, own)
    message = str(raised.value)
    one_line_naming(message, bare)
    assert "not a dlscale checkpoint" in message and "--resume expects" in message
    assert "damaged" not in message and "aside" not in message


def test_a_directory_without_checkpoints_says_what_it_holds(tmp_path):
    data = tmp_path / "data"
    (data / "train").mkdir(parents=True)
    write_hdf5(data / "train" / "1980.h5")
    with pytest.raises(CheckpointError, match=r"data is a directory without ckpt_latest.pt .*HDF5 files"):
        checkpoint_file(data)
    stats = tmp_path / "stats"
    stats.mkdir()
    np.save(stats / "means.npy", np.zeros(2))
    with pytest.raises(CheckpointError, match=r"it holds means.npy and no checkpoint; --resume expects"):
        checkpoint_file(stats)
    run = tmp_path / "run"
    best = checkpoint_at(run / "checkpoints" / "ckpt_best.pt", 5)
    with pytest.raises(
        CheckpointError, match=rf"but holds ckpt_best.pt: continue from one with --resume {best}"
    ):
        checkpoint_file(run)


# ------------------------------------------------------------------------------------------- another workload


def test_another_workloads_checkpoint_given_to_resume_names_both_workloads(tmp_path):
    own = CheckpointDir(tmp_path / "mine" / "checkpoints")
    theirs = tmp_path / "era5" / "checkpoints" / "ckpt_latest.pt"
    with pytest.raises(CheckpointError) as raised:
        check_workload({"workload": "era5_vit", "config_name": "short"}, record(), theirs, own)
    message = str(raised.value)
    one_line_naming(message, theirs)
    assert "workload 'era5_vit' (config 'short')" in message
    assert "this run trains workload 'cnn_mnist' (config 'tiny'), so it cannot be resumed" in message
    assert "share" not in message and "--run_num" not in message


def test_another_workloads_checkpoint_in_the_own_directory_is_a_shared_directory(tmp_path):
    own = CheckpointDir(tmp_path / "tiny" / "00" / "checkpoints")
    with pytest.raises(CheckpointError) as raised:
        check_workload({"workload": "era5_vit", "config_name": "tiny"}, record(), own.latest_path, own)
    message = str(raised.value)
    one_line_naming(message, own.latest_path)
    assert "two configs of the same name share the run directory" in message and "--run_num" in message
    check_workload({"workload": "cnn_mnist"}, record(), own.latest_path, own)  # the same workload: fine
    check_workload({}, record(), own.latest_path, own)  # a checkpoint that does not say: fine


# ----------------------------------------------------------------------------- another run's damaged checkpoint


def test_another_runs_damaged_checkpoint_lists_the_checkpoints_beside_it(tmp_path):
    own = CheckpointDir(tmp_path / "mine" / "checkpoints")
    checkpoint_at(own.latest_path, 40)
    checkpoint_at(own.best_path, 30)
    foreign = CheckpointDir(tmp_path / "other" / "checkpoints")
    checkpoint_at(foreign.latest_path, 22)
    foreign.latest_path.write_bytes(foreign.latest_path.read_bytes()[:300])
    checkpoint_at(foreign.best_path, 11)
    with pytest.raises(CheckpointError) as raised:
        load_for_resume(foreign.latest_path, own)
    message = str(raised.value)
    one_line_naming(message, foreign.latest_path)
    assert (
        f"Checkpoints in {foreign.directory} that load: {foreign.best_path} (epoch 1, global step 11)"
        in message
    )
    assert f"--resume {foreign.best_path}" in message
    assert str(own.directory) not in message and "of this run" not in message
    foreign.best_path.unlink()
    hint = recovery_hint(own, foreign.latest_path)
    assert f"No other checkpoint in {foreign.directory} loads" in hint and str(own.directory) not in hint


def test_the_own_damaged_checkpoint_lists_the_runs_own(tmp_path):
    own = CheckpointDir(tmp_path / "mine" / "checkpoints")
    checkpoint_at(own.latest_path, 40)
    own.latest_path.write_bytes(own.latest_path.read_bytes()[:300])
    checkpoint_at(own.best_path, 30)
    hint = recovery_hint(own, Path(os.path.relpath(own.latest_path)))  # however the path is spelt
    assert f"Checkpoints of this run that load: {own.best_path} (epoch 1, global step 30)" in hint


# ------------------------------------------------------------------------------ a finished run's lost report


def write_summary(run_dir: Path, outcome: str = "finished", global_step: int = 22, figures=("loss.png",)):
    (run_dir / "figures").mkdir(parents=True, exist_ok=True)
    paths = [str(run_dir / "figures" / name) for name in figures]
    for path in paths:
        Path(path).write_bytes(b"png")
    document = {"outcome": outcome, "global_step": global_step, "figures": paths}
    (run_dir / "summary.json").write_text(json.dumps(document))


def test_a_missing_or_stale_report_is_noticed(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert missing_report(run_dir, 22) == "no summary.json"  # what a kill after the last save leaves
    write_summary(run_dir)
    assert missing_report(run_dir, 22) is None
    (run_dir / "figures" / "loss.png").unlink()
    assert missing_report(run_dir, 22) == "figures/loss.png is missing"
    write_summary(run_dir, outcome="stopped", global_step=5)  # an earlier attempt's, stopped by a signal
    assert "earlier attempt's (stopped at step 5)" in missing_report(run_dir, 22)
    write_summary(run_dir, global_step=11)  # of the run before it was given more epochs
    assert "earlier attempt's (finished at step 11)" in missing_report(run_dir, 22)
    (run_dir / "summary.json").write_text('{"outcome": "fini')  # torn by hand: the writes are atomic
    assert missing_report(run_dir, 22) == "summary.json cannot be read"
