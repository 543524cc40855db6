"""Reading a ladder record (benchmarks/ladder.py's JSON) without torch: what the ladder and the GPU first-light
report both derive from a rung's row."""

from __future__ import annotations

TESTS = ("IO", "SYNTHETIC", "FULL")


def peak_memory_gb(row: dict) -> float | None:
    """A rung's peak device memory: the highest of its tests'. A CUDA-graphed rung allocates its graph's memory
    when it captures, in the first test's warm-up, so the tests after it see only what lives outside the graph."""
    peaks = [row[name]["peak_memory_gb"] for name in TESTS if (row.get(name) or {}).get("peak_memory_gb")]
    return max(peaks, default=None)
