"""Kill a ``dlscale train`` subprocess with SIGKILL in the middle of its checkpoint saves, then run it again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def dlscale_command(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """``python -m dlscale ARGS`` from the repository, one thread, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "dlscale", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        **kwargs,
    )


def kill_during_saves_then_resume(args: list[str], run_dir: Path, saves: int) -> subprocess.CompletedProcess:
    """Start ``dlscale ARGS``, SIGKILL it once its ``run_dir/out.log`` shows ``saves`` saved checkpoints, and
    run the same command again; the second run's result."""
    process = subprocess.Popen(
        [sys.executable, "-m", "dlscale", *args],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    log = run_dir / "out.log"
    try:
        deadline = time.monotonic() + 120
        while not (log.is_file() and log.read_text().count("Saved checkpoint") >= saves):
            assert process.poll() is None and time.monotonic() < deadline, (
                "the run ended before it was killed"
            )
            time.sleep(0.005)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        process.kill()
    return dlscale_command(*args)
