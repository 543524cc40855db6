"""The committed benchmark scripts still import (they run on a lent GPU machine, where a broken import would
cost the session), and the ladder draws its committed results."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    sys.path.insert(0, str(BENCHMARKS))  # a script may import a sibling script
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


@pytest.mark.parametrize("name", sorted(p.stem for p in BENCHMARKS.glob("*.py")))
def test_each_benchmark_script_imports(name):
    assert load(name).__doc__


def test_the_ladder_draws_intervals_from_its_trials_and_the_std_from_an_older_record(tmp_path):
    ladder = load("ladder")
    (committed,) = sorted((BENCHMARKS / "results").glob("*-ladder.json"))[:1]
    result = json.loads(committed.read_text())
    row = next(r for r in result["rungs"] if "skipped" not in r)
    assert ladder.error_bar(row["FULL"], with_trials=False) == (row["FULL"]["mean"], row["FULL"]["std"])
    mean, half = ladder.error_bar({"mean": 101.0, "std": 1.0, "trials": [100.0, 102.0]}, with_trials=True)
    assert mean == 101.0 and half == pytest.approx(12.706)  # t(1) x 1 (the standard error)
    ladder.plot(result, tmp_path / "ladder.png")
    assert (tmp_path / "ladder.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("script", "stem"),
    [
        ("workload_plan_report", "2026-11-24-cpu-plan-vs-measured-workloads"),
        ("plan_vs_measured", "2026-11-22-cpu-plan-vs-measured"),
        ("forecast_throughput", "2026-11-25-cpu-2-threads-forecast-throughput"),
    ],
)
def test_the_plan_reports_rewrite_their_committed_markdown_from_their_json(script, stem):
    results = BENCHMARKS / "results"
    record = json.loads((results / f"{stem}.json").read_text())
    assert load(script).markdown(record) == (results / f"{stem}.md").read_text()
