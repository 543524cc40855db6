"""The suite keeps its temporary files and torch.compile's builds in its own checkout (tests/conftest.py)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD_TMP = REPO / "build" / "tmp"
# this process's own folder: "main" for a plain pytest, "gw0", "gw1", ... for pytest-xdist's workers
SUITE_TMP = BUILD_TMP / os.environ.get("PYTEST_XDIST_WORKER", "main")


def test_temporary_files_and_the_inductor_cache_are_under_this_checkouts_build_folder(tmp_path):
    assert Path(tempfile.gettempdir()) == SUITE_TMP
    # pytest's base folder is made by the process that starts the workers (under its own folder, "main")
    assert tmp_path.is_relative_to(BUILD_TMP)
    assert Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]).is_relative_to(SUITE_TMP)


def test_torchs_precompiled_headers_follow_into_the_suites_folder():
    cache_dir_utils = pytest.importorskip("torch._inductor.runtime.cache_dir_utils")
    # Inductor puts its precompiled headers under default_cache_dir(), the system's temporary folder, not under
    # TORCHINDUCTOR_CACHE_DIR (the processes tests start inherit TMPDIR).
    assert Path(cache_dir_utils.default_cache_dir()).is_relative_to(SUITE_TMP)
    assert os.environ["TMPDIR"] == str(SUITE_TMP)
