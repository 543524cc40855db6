"""Why a path is no readable file, in words: Path.is_file() is False for all of these alike."""

from __future__ import annotations

from pathlib import Path

from dlscale.runtime.file_status import NOT_FOUND, why_not_a_file


def test_each_kind_of_missing_file_is_told_apart(tmp_path: Path):
    regular = tmp_path / "stats.npy"
    regular.write_bytes(b"x")
    (tmp_path / "to_regular").symlink_to(regular)
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "dangling").symlink_to("nowhere.npy")
    (tmp_path / "folder").mkdir()
    assert why_not_a_file(regular) is None
    assert why_not_a_file(tmp_path / "to_regular") is None
    assert why_not_a_file(tmp_path / "absent.npy") == NOT_FOUND
    assert why_not_a_file(tmp_path / "loop").startswith("is a symbolic link loop (ELOOP)")
    assert why_not_a_file(tmp_path / "loop" / "inside.npy") == (
        "cannot be reached: its path runs into a symbolic link loop (ELOOP)"
    )
    assert why_not_a_file(tmp_path / "dangling") == (
        "is a dangling symbolic link: its target 'nowhere.npy' does not exist"
    )
    assert why_not_a_file(tmp_path / "folder") == "is a directory, not a file"
    assert why_not_a_file(regular / "inside.npy").endswith("(ENOTDIR)")
