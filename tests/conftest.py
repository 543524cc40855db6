"""Shared fixtures: a tiny synthetic ERA5 data set (made once per session) and run configs that use it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CONFIG_FILE = REPO / "configs" / "vit_era5.yaml"

# The suite's temporary files live under this checkout's build/ folder, and with them torch.compile's C++ builds:
# inductor keeps its cache in TORCHINDUCTOR_CACHE_DIR but its precompiled headers in the system's temporary
# folder whatever that says, so two suites at once (two clones) shared one header and one failed compiling
# against the other's half-written one. A suite now never depends on what another process compiles. This
# runs before torch is imported; tempfile's cached answer is dropped so that this process uses TMPDIR too, and
# every process a test starts inherits both.
# Under pytest-xdist (`make test` runs two workers) each worker has a folder of its own, for the same reason.
SUITE_TMP = REPO / "build" / "tmp" / os.environ.get("PYTEST_XDIST_WORKER", "main")
SUITE_TMP.mkdir(parents=True, exist_ok=True)
os.environ["TMPDIR"] = str(SUITE_TMP)
os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(SUITE_TMP / "torchinductor")
tempfile.tempdir = None

# Tests that start processes must not oversubscribe the 2 cores of the CI machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Runs built by the tests stay on the CPU even on a GPU machine, where their bitwise checks would not hold;
# the GPU tests (marked `gpu`) build their CUDA devices themselves.
os.environ.setdefault("DLSCALE_DEVICE", "cpu")


@pytest.fixture(scope="session")
def tiny_era5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic ERA5 data set of the `tiny` preset (16 x 32 grid, 46 training and 23 validation samples)."""
    from dlscale.data.era5.synth import PRESETS, write_synthetic_era5

    return write_synthetic_era5(tmp_path_factory.mktemp("data") / "era5_tiny", PRESETS["tiny"])


@pytest.fixture
def tiny_config(tiny_era5: Path, tmp_path: Path):
    """A function returning the shipped `tiny` config on the session's data, writing runs under tmp_path."""
    from run_configs import tiny_run_config

    def make(*overrides: str, expdir: Path | None = None, **flags: object):
        expdir = expdir or tmp_path / "runs"
        return tiny_run_config(CONFIG_FILE, tiny_era5, expdir, *overrides, tensorboard=True, **flags)

    return make


# `make test` leaves out the tests marked slow (pyproject.toml) to stay within minutes on 2 cores; a test that
# takes longer without the mark is named at the end of the run, so that the fast suite does not grow unnoticed.
SLOW_SECONDS = 4.0
_unmarked_slow: list[tuple[str, float]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and report.duration >= SLOW_SECONDS and "slow" not in report.keywords:
        _unmarked_slow.append((report.nodeid, report.duration))


def pytest_terminal_summary(terminalreporter) -> None:
    if _unmarked_slow:
        terminalreporter.write_sep("=", f"tests of {SLOW_SECONDS:g} s or more without @pytest.mark.slow")
        for nodeid, seconds in sorted(_unmarked_slow, key=lambda found: -found[1]):
            terminalreporter.write_line(f"{seconds:6.1f}s {nodeid}")
