"""Small disks for the tests of full and read-only file systems: a tmpfs mounted for the length of a test (root
only; the test is skipped where mounting is not allowed)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def mounted_tmpfs(directory: Path, options: str, copy_from: Path | None = None) -> Iterator[Path]:
    """A tmpfs at ``directory`` (created) with the mount ``options`` (``size=1m``, ``ro,size=1m``), holding a copy
    of ``copy_from``'s files (before a read-only one is made read-only); unmounted at the end."""
    directory.mkdir(parents=True, exist_ok=True)
    writable = ",".join(part for part in options.split(",") if part != "ro")
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", writable or "size=1m", "tmpfs", str(directory)],
        capture_output=True,
        check=False,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({result.stderr.decode().strip() or 'not root'})")
    try:
        if copy_from is not None:
            for entry in copy_from.iterdir():
                copy = shutil.copytree if entry.is_dir() else shutil.copy2
                copy(entry, directory / entry.name)
        if "ro" in options.split(","):
            subprocess.run(["mount", "-o", "remount,ro", str(directory)], check=True, capture_output=True)
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)
