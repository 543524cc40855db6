"""Atomic file replacement: the old file or the complete new one, never a partial write or stray temp file."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from dlscale.runtime import atomic_files
from dlscale.runtime.atomic_files import write_bytes_atomically, write_text_atomically


def test_text_is_written_and_its_directory_created(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "config.yaml"
    write_text_atomically(target, "first\n")
    write_text_atomically(target, "second\n")
    assert target.read_text() == "second\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["config.yaml"]


@pytest.mark.parametrize("failure", [OSError("disk full"), KeyboardInterrupt()])
def test_a_failure_mid_write_keeps_the_old_file_and_leaves_no_temporary_file(tmp_path: Path, failure) -> None:
    target = tmp_path / "summary.json"
    target.write_text("old")

    def write_half_then_fail(stream) -> None:
        stream.write(b"new but incomp")
        raise failure

    with pytest.raises(type(failure)):
        write_bytes_atomically(target, write_half_then_fail)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


@dataclass(frozen=True)
class Synced:
    path: Path  # what the fsynced descriptor refers to
    inode: int
    size: int  # bytes in the file when it was fsynced


@dataclass(frozen=True)
class Renamed:
    source: Path
    target: Path
    inode: int
    size: int


class DiskJournal:
    """Records, in order, every fsync (with what its descriptor refers to) and every os.replace."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.events: list[Synced | Renamed] = []
        real_fsync, real_replace = os.fsync, os.replace

        def fsync(fd: int) -> None:
            real_fsync(fd)
            status = os.fstat(fd)
            path = Path(os.readlink(f"/proc/self/fd/{fd}"))
            self.events.append(Synced(path, status.st_ino, status.st_size))

        def replace(source, target, **kwargs) -> None:
            status = os.stat(source)
            real_replace(source, target, **kwargs)
            self.events.append(Renamed(Path(source), Path(target), status.st_ino, status.st_size))

        # atomic_files.os is the os module itself, so this also covers every module that writes through it.
        monkeypatch.setattr(atomic_files.os, "fsync", fsync)
        monkeypatch.setattr(atomic_files.os, "replace", replace)

    def assert_durably_replaced(self, target: Path, synced_under_its_temporary_name: bool = True) -> None:
        """``target`` was renamed into place once, its complete data on disk before, the rename on disk after."""
        renames = [
            i for i, event in enumerate(self.events) if isinstance(event, Renamed) and event.target == target
        ]
        assert len(renames) == 1, self.events
        (at,) = renames
        rename = self.events[at]
        assert rename.source.parent == target.parent and rename.source != target
        data_synced = [
            event
            for event in self.events[:at]
            if isinstance(event, Synced) and event.inode == rename.inode and event.size == rename.size
        ]
        assert data_synced, f"{target}: its complete data was not fsynced before the rename: {self.events}"
        if synced_under_its_temporary_name:
            assert data_synced[-1].path == rename.source
        directory_synced = [
            event
            for event in self.events[at + 1 :]
            if isinstance(event, Synced) and event.path == target.parent
        ]
        assert directory_synced, f"{target}: its directory was not fsynced after the rename: {self.events}"


def write_in_small_pieces(target: Path, text: str) -> None:
    """Many writes smaller than the file's buffer: unflushed, they would not be in the file yet."""
    write_bytes_atomically(target, lambda f: [f.write(line.encode()) for line in text.splitlines(True)])


@pytest.mark.parametrize(
    "write", [write_text_atomically, write_in_small_pieces], ids=["text", "small-pieces"]
)
def test_the_data_is_fsynced_before_the_rename_and_the_directory_after_it(tmp_path: Path, monkeypatch, write):
    target = tmp_path / "config.yaml"
    target.write_text("old")
    journal = DiskJournal(monkeypatch)
    text = "new contents\n" * 1000
    write(target, text)
    assert target.read_text() == text
    journal.assert_durably_replaced(target)


def no_hard_links(source, target) -> None:
    raise OSError(1, "Operation not permitted (a file system without hard links)")


@pytest.mark.parametrize("hard_links", [True, False], ids=["best-is-a-hard-link", "best-is-a-copy"])
def test_checkpoints_and_their_best_copy_are_durable_before_they_replace_the_old_ones(
    tmp_path: Path, monkeypatch, hard_links: bool
):
    from dlscale.checkpoint.directory import CheckpointDir
    from dlscale.checkpoint.files import save_checkpoint

    single = tmp_path / "single" / "ckpt.pt"
    payload = {"model": {"weight": torch.arange(1000.0)}, "progress": {"global_step": 3}}
    save_checkpoint(payload, single)  # an old file to replace
    journal = DiskJournal(monkeypatch)
    save_checkpoint(payload, single)
    journal.assert_durably_replaced(single)

    if not hard_links:
        monkeypatch.setattr(os, "link", no_hard_links)
    checkpoints = CheckpointDir(tmp_path / "run")
    journal.events.clear()
    checkpoints.save(payload, is_best=True)
    journal.assert_durably_replaced(checkpoints.latest_path)
    # A hard link shares the inode that was synced under latest's temporary name; a copy is synced itself.
    journal.assert_durably_replaced(checkpoints.best_path, synced_under_its_temporary_name=not hard_links)
    assert checkpoints.best_path.read_bytes() == checkpoints.latest_path.read_bytes()
    assert checkpoints.best_path.samefile(checkpoints.latest_path) == hard_links
