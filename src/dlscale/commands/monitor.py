"""``dlscale monitor``: a live table of the local GPUs and the host, focused on what matters for training
(utilization next to power against the board's limit, memory, clocks), like ``watch -n1 nvidia-smi``.

On a terminal the table is redrawn in place; when stdout is a file or a pipe (batch logs) each refresh is
appended as a plain table. ``--once`` prints one table and exits. Without a GPU library or GPU it shows the
host alone and says so.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from dlscale.errors import InvalidValue
from dlscale.perf.monitor.sampler import NO_GPU_MESSAGE, MetricsSampler, Sample
from dlscale.runtime.gpu_metrics import open_gpu_backend

CLEAR_SCREEN = "\x1b[H\x1b[2J"  # cursor home, then erase the screen
CPU_WINDOW_S = 0.2  # psutil's CPU% needs a window since its previous reading


def _cell(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_table(sample: Sample, gpu_library: str | None) -> str:
    """The sample as a fixed-width table: one row per GPU, then the host."""
    header = (
        f"{'GPU':>3}  {'name':<22} {'util%':>5} {'power W':>13} {'memory GB':>13} {'temp C':>6} {'SM MHz':>6}"
    )
    lines = [time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(sample.wall_time)), header]
    for gpu in sample.gpus:
        power = f"{_cell(gpu.power_w)}/{_cell(gpu.power_limit_w)}"
        memory = f"{_cell(gpu.memory_used_gb, 1)}/{_cell(gpu.memory_total_gb, 1)}"
        lines.append(
            f"{gpu.index:>3}  {gpu.name[:22]:<22} {_cell(gpu.utilization_pct):>5} {power:>13} {memory:>13} "
            f"{_cell(gpu.temperature_c):>6} {_cell(gpu.sm_clock_mhz):>6}"
        )
    if not sample.gpus:
        lines.append(f"     {NO_GPU_MESSAGE}")
    host = sample.host
    lines.append(
        f"host CPU {host.cpu_pct:.0f}%, memory {host.memory_used_gb:.1f}/{host.memory_total_gb:.1f} GB"
        + (f"   ({gpu_library})" if gpu_library else "")
    )
    return "\n".join(lines)


def run_monitor_command(args: argparse.Namespace) -> int:
    """Print the table once, ``--count`` times, or until Ctrl-C; 0 then (bad options: a DlscaleError, exit 2)."""
    if not (args.interval > 0 and math.isfinite(args.interval)):
        raise InvalidValue("--interval", f"must be a number of seconds > 0, got {args.interval}")
    if args.count is not None and args.count < 1:
        raise InvalidValue("--count", f"must be a number of refreshes >= 1, got {args.count}")
    from dlscale.perf.monitor.observer import MetricsCsv  # imports torch: after the options are checked

    backend = open_gpu_backend()
    sampler = MetricsSampler(backend)
    csv_file = MetricsCsv(Path(args.csv)) if args.csv else None
    redraw = sys.stdout.isatty() and not args.once
    refreshes = 1 if args.once else args.count
    library = backend.name if backend is not None else None
    try:
        time.sleep(CPU_WINDOW_S)
        shown = 0
        while refreshes is None or shown < refreshes:
            if shown:
                time.sleep(args.interval)
            sample = sampler.sample_once()
            table = format_table(sample, library)
            print((CLEAR_SCREEN + table) if redraw else table + "\n", flush=True)
            if csv_file is not None:
                csv_file.append([sample])
            shown += 1
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a live view ends
    finally:
        if backend is not None:
            backend.close()
    return 0
