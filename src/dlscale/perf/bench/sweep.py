"""``dlscale bench --sweep KEY=v1,v2,...``: the throughput trials once per value, as a table and a plot.

This automates the tutorials' by-hand sweeps (rerun with ``--num_data_workers 0, 2, 4, 8`` and compare the
samples/s). Several ``--sweep`` options run every combination of their values (the cartesian product), so
``--sweep num_data_workers=0,4 --sweep amp_mode=none,bf16`` runs four points. Each point gets a freshly loaded
config and a freshly built setup; the previous one is freed first. A swept key wins over the same key given
as a tutorial flag (``--num_data_workers 4``), since a sweep that silently measured one value would mislead.
The points themselves (the options parsed, their combinations and names) are
:mod:`dlscale.perf.bench.sweep_points`.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from dlscale.perf.bench.intervals import mean_interval
from dlscale.perf.bench.plot import plotted_interval, throughput_figure
from dlscale.perf.bench.report import TEST_NAMES
from dlscale.perf.bench.sweep_points import Point, SweepSpec, point_label, point_overrides, sweep_points
from dlscale.perf.bench.trials import BenchResults
from dlscale.report.figures import save_png
from dlscale.runtime.atomic_files import write_text_atomically
from dlscale.runtime.strict_json import to_json

log = logging.getLogger("dlscale.bench")


@dataclass
class SweepRow:
    """The results of one sweep point."""

    point: Point
    results: BenchResults


def run_sweep(specs: Sequence[SweepSpec], measure: Callable[[Point], BenchResults]) -> list[SweepRow]:
    """``measure(point)`` for every point; garbage is collected between points so two setups never coexist."""
    points = sweep_points(specs)
    rows = []
    for number, point in enumerate(points, start=1):
        log.info("BENCHY::SWEEP::Point %d of %d: %s", number, len(points), " ".join(point_overrides(point)))
        rows.append(SweepRow(point, measure(point)))
        # The previous setup (model, optimizer, loader workers) is unreachable now; free it before the next.
        gc.collect()
    return rows


def _mean_interval(results: BenchResults, name: str) -> str:
    test = results.tests.get(name)
    return "-" if test is None else mean_interval(test.trial_throughput).describe(unit="")


def sweep_table(rows: Sequence[SweepRow]) -> list[str]:
    """A Markdown table: value | IO | SYNTHETIC | FULL samples/s | FULL TFLOP/s | MFU | verdict."""
    keys = ", ".join(key for key, _ in rows[0].point) if rows else "value"
    lines = [
        f"| {keys} | IO samples/s | SYNTHETIC samples/s | FULL samples/s | FULL TFLOP/s | MFU | verdict |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        full = row.results.utilization.get("FULL", {})
        tflops = f"{full['tflops_per_gpu']:.3f}" if full.get("tflops_per_gpu") is not None else "-"
        mfu = f"{full['mfu']:.1%}" if full.get("mfu") is not None else "-"
        cells = [point_label(row.point), *(_mean_interval(row.results, n) for n in TEST_NAMES), tflops, mfu]
        lines.append(f"| {' | '.join(cells)} | {row.results.verdict.kind} |")
    return lines


def sweep_figure(rows: Sequence[SweepRow], title: str) -> Figure:
    """IO, SYNTHETIC and FULL mean samples/s per point, with the 95% interval of the trials as error bars."""
    # One line per key: several keys' labels side by side would overlap.
    labels = [point_label(row.point).replace(", ", "\n") for row in rows]
    results = [{name: plotted_interval(t) for name, t in row.results.tests.items()} for row in rows]
    xlabel = ", ".join(key for key, _ in rows[0].point) if rows else ""
    return throughput_figure(labels, results, title, xlabel)


def write_sweep_outputs(
    rows: Sequence[SweepRow], json_path: Path, title: str, context: Mapping[str, Any]
) -> dict[str, Path]:
    """The combined JSON at ``json_path``, the table (``.md``) and the plot (``.png``) beside it."""
    table = sweep_table(rows)
    document = {
        **context,
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "points": [
            {
                "overrides": point_overrides(row.point),
                "label": point_label(row.point),
                "summary": row.results.record.get("summary"),
                "verdict": row.results.verdict.to_json(),
                "utilization": row.results.utilization,
                "json": str(row.results.output_path) if row.results.output_path else None,
            }
            for row in rows
        ],
        "table": table,
    }
    paths = {"json": json_path, "table": json_path.with_suffix(".md"), "plot": json_path.with_suffix(".png")}
    write_text_atomically(paths["json"], to_json(document))
    write_text_atomically(paths["table"], f"# {title}\n\n" + "\n".join(table) + "\n")
    save_png(sweep_figure(rows, title), paths["plot"])
    return paths
