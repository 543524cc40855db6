"""Where a bench wrote its record: ``<run dir>/bench/<date-time>-benchy_result.json``, one file per bench."""

from __future__ import annotations

from pathlib import Path


def only_bench_record(run_dir: Path, suffix: str = ".json") -> Path:
    """The one bench record (or its ``.png``) in ``run_dir/bench``; fails when there are none or several."""
    found = sorted((run_dir / "bench").glob(f"*-benchy_result{suffix}"))
    assert len(found) == 1, f"expected one bench record in {run_dir / 'bench'}, found {found}"
    return found[0]
