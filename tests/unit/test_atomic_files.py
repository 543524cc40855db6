"""Atomic file replacement: the old file or the complete new one, never a partial write or stray temp file."""

from __future__ import annotations

from pathlib import Path

import pytest

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
