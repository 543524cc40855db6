"""Write errors in plain words: errno translation, probes, free space, and stale temporary files."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dlscale.checkpoint.files import save_checkpoint
from dlscale.checkpoint.size import estimate_checkpoint_bytes, serial_state_bytes
from dlscale.errors import StorageError
from dlscale.runtime import storage
from dlscale.runtime.atomic_files import write_bytes_atomically
from dlscale.runtime.storage import (
    as_storage_error,
    check_free_space,
    probe_writable,
    remove_stale_temporaries,
    storage_error,
)


@pytest.mark.parametrize(
    ("code", "words", "advice"),
    [
        (errno.EROFS, "Read-only file system (EROFS)", "writable --expdir"),
        (errno.EACCES, "Permission denied (EACCES)", "permissions"),
        (errno.ENOSPC, "No space left on device (ENOSPC)", "free some space"),
        (errno.EDQUOT, "Disk quota exceeded (EDQUOT)", "quota"),
        (errno.ENOTDIR, "Not a directory (ENOTDIR)", "is a file, not a directory"),
    ],
)
def test_each_write_errno_becomes_one_line_with_the_path_the_errno_and_what_to_do(code, words, advice):
    message = str(storage_error("/scratch/run/ckpt.pt", code))
    assert message.startswith("/scratch/run/ckpt.pt: cannot write: ")
    assert words in message and advice in message and "\n" not in message


@pytest.mark.parametrize("code", sorted(storage.STORAGE_ERRNOS), ids=errno.errorcode.get)
def test_the_advice_names_the_option_of_the_command_that_writes(code):
    for option in ("--out", "--root"):
        message = str(storage_error("/data/era5/stats/climatology.zarr", code, option=option))
        assert "--expdir" not in message and "numbered checkpoints" not in message, message
        assert option in message or code == errno.EISDIR, message  # a directory in a file's place: rename it
    converted = as_storage_error(OSError(code, os.strerror(code)), option="--out")
    assert converted is not None and "--expdir" not in str(converted)
    training = str(storage_error("/scratch/run/ckpt.pt", code))  # training keeps its own wording
    assert "--expdir" in training or code == errno.EISDIR
    if code == errno.ENOSPC:
        assert "free some space (old runs, numbered checkpoints) or choose another --expdir" in training


def test_an_enospc_hidden_in_torch_saves_chained_exception_is_found(tmp_path: Path):
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError(
                "[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0"
            ) from inner
    except RuntimeError as outer:
        converted = as_storage_error(outer, tmp_path / "ckpt.pt")
    assert converted is not None and "No space left on device (ENOSPC)" in str(converted)
    assert as_storage_error(RuntimeError("shapes do not match")) is None
    assert as_storage_error(OSError(errno.ENOENT, "missing")) is None  # not a write failure: stays as it is


@pytest.mark.parametrize(
    "names_the_file", [True, False], ids=["open-names-the-temporary-file", "write-names-none"]
)
def test_a_write_error_is_named_by_the_target_file_not_the_temporary_one(tmp_path: Path, names_the_file):
    def fail(stream) -> None:
        # A failed open names the file it opened; a failed write() (a full disk) names none.
        raise OSError(errno.ENOSPC, "No space left on device", *([stream.name] if names_the_file else []))

    with pytest.raises(OSError) as raised:
        write_bytes_atomically(tmp_path / "summary.json", fail)
    assert raised.value.filename == str(tmp_path / "summary.json")
    assert raised.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_that_torch_cannot_finish_writing_is_a_storage_error_and_leaves_nothing(
    tmp_path: Path, monkeypatch
):
    target = tmp_path / "ckpt_latest.pt"
    save_checkpoint({"model": {"w": torch.zeros(4)}}, target)
    before = target.read_bytes()

    def disk_full(obj, f, *args, **kwargs):
        f.write(b"PK")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos") from OSError(
            errno.ENOSPC, "No space left on device"
        )

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(StorageError, match=r"ckpt_latest.pt: cannot write the checkpoint .*ENOSPC"):
        save_checkpoint({"model": {"w": torch.ones(4)}}, target)
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt_latest.pt"]


def test_probing_creates_the_directory_and_leaves_nothing_behind(tmp_path: Path):
    directory = tmp_path / "a" / "b"
    probe_writable(directory)
    assert directory.is_dir() and list(directory.iterdir()) == []


def test_probing_a_path_through_a_file_names_it(tmp_path: Path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(
        StorageError, match=r"file/run: cannot create the directory: Not a directory \(ENOTDIR\)"
    ):
        probe_writable(tmp_path / "file" / "run")
    with pytest.raises(StorageError, match=r"cannot create the directory: File exists \(EEXIST\)"):
        probe_writable(tmp_path / "file")


def test_probing_a_place_to_create_writes_nothing_there_and_names_the_option(tmp_path: Path, monkeypatch):
    storage.probe_creatable(tmp_path / "new" / "scores", "--out")
    assert list(tmp_path.iterdir()) == [], "no directory made, no probe left"
    (tmp_path / "file").write_text("x")
    with pytest.raises(StorageError, match=r"file: cannot create the directory: .*ENOTDIR.* another --out"):
        storage.probe_creatable(tmp_path / "file" / "scores", "--out")

    def read_only(fd, data):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(storage.os, "write", read_only)
    with pytest.raises(StorageError, match=rf"{tmp_path}: cannot write: .*EROFS.*choose a writable --out$"):
        storage.probe_creatable(tmp_path / "new" / "scores", "--out")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["file"]


def test_too_little_free_space_for_a_write_is_said_before_it_starts(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(storage.shutil, "disk_usage", lambda path: SimpleNamespace(free=1_500_000))
    storage.require_free_space(tmp_path, 1_500_000, "a year file", "--out")
    with pytest.raises(StorageError) as raised:
        storage.require_free_space(tmp_path, 1_500_001, "a year file", "--out")
    assert str(raised.value) == (
        f"{tmp_path}: cannot write a year file: 1.5 MB needed, 1.5 MB free: No space left on device (ENOSPC); "
        "the disk is full: free some space or choose another --out"
    )


def test_probing_reports_a_failing_write_even_when_the_create_works(tmp_path: Path, monkeypatch):
    real_write = os.write

    def full(fd, data):
        if os.fstat(fd).st_size == 0 and b"dlscale" in data:
            raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
        return real_write(fd, data)

    monkeypatch.setattr(storage.os, "write", full)
    with pytest.raises(StorageError, match=r"Disk quota exceeded \(EDQUOT\)"):
        probe_writable(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_free_space_below_one_checkpoint_fails_and_below_two_warns(tmp_path: Path, monkeypatch, caplog):
    def free(amount: int) -> None:
        monkeypatch.setattr(storage.shutil, "disk_usage", lambda path: SimpleNamespace(free=amount))

    free(999)
    with pytest.raises(StorageError, match=r"not enough free space for a checkpoint: 999 B free, .* 1.0 kB"):
        check_free_space(tmp_path, 1000)
    free(1999)
    with caplog.at_level(logging.WARNING, logger="dlscale.train"):
        check_free_space(tmp_path, 1000)
    assert "the next saves may fail with a full disk" in caplog.text
    caplog.clear()
    free(2000)
    with caplog.at_level(logging.WARNING, logger="dlscale.train"):
        check_free_space(tmp_path, 1000)
    assert caplog.text == ""


def test_only_the_temporary_files_of_atomic_writes_are_removed(tmp_path: Path):
    stale = [tmp_path / ".ckpt_latest.pt.tmp-123-0a1b2c3d", tmp_path / ".summary.json.tmp-9-ff"]
    kept = [
        tmp_path / "ckpt_latest.pt",
        tmp_path / ".hidden",
        tmp_path / "x.tmp-1-aa",
        tmp_path / ".a.tmp-x-aa",
    ]
    for path in stale + kept:
        path.write_bytes(b"12345")
    removed = remove_stale_temporaries([tmp_path, tmp_path / "missing"])
    assert sorted(removed) == sorted((path, 5) for path in stale)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in kept)


def test_the_checkpoint_estimate_is_close_to_the_written_size(tmp_path: Path):
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.LayerNorm(128), torch.nn.Linear(128, 8))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 64)).sum().backward()
    optimizer.step()
    path = save_checkpoint(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict()}, tmp_path / "c.pt"
    )
    optim_cfg = SimpleNamespace(optimizer="Adam", momentum=0.9)
    estimate = estimate_checkpoint_bytes(model, optim_cfg)
    written = path.stat().st_size
    assert written <= estimate <= written + (64 << 10) + written // 10
    state, params = serial_state_bytes(model)
    assert state == params == sum(p.numel() * 4 for p in model.parameters())


def test_a_write_failure_without_a_path_keeps_the_original_words():
    converted = as_storage_error(
        RuntimeError("unable to write to file </torch_77_1>: No space left on device (28)")
    )
    assert str(converted).startswith(
        "cannot write: No space left on device (ENOSPC) (unable to write to file </torch_77_1>"
    )
