"""``dlscale bench``: benchy's IO / SYNTHETIC / FULL throughput trials of a config, optionally swept.

dlscale bench --config short --nbatches 20                      # trials, verdict, JSON in the run directory
dlscale bench --config short --sweep num_data_workers=0,2,4,8   # one set of trials per value: table + plot

The bench never reads or writes training checkpoints, so it is safe to run beside (or on the run directory of)
a real training run; its console log goes to ``bench.log`` there, not to the run's ``out.log``.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from pathlib import Path

from dlscale import __version__
from dlscale.cli import TUTORIAL_FLAGS, tutorial_flag_values
from dlscale.config import RunConfig, load_run_config
from dlscale.perf.bench import BenchResults, run_benchmark
from dlscale.perf.sweep import (
    Point,
    file_slug,
    flags_not_swept,
    parse_sweep,
    point_overrides,
    run_sweep,
    sweep_points,
    sweep_table,
    write_sweep_outputs,
)
from dlscale.report.run_dir import run_directory, setup_logging
from dlscale.runtime.device import Device
from dlscale.runtime.distributed import start_process_group, stop_process_group
from dlscale.runtime.launch import detect_process
from dlscale.train.setup import build_training, describe_setup

log = logging.getLogger("dlscale.bench")

# Options of this command that set a bench.* key (applied with the tutorial flags, after --set).
BENCH_FLAGS = {
    "nwarmup": "bench.nwarmup",
    "ntrials": "bench.ntrials",
    "nbatches": "bench.nbatches",
    "report_freq": "bench.report_freq",
}


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``dlscale bench`` beyond the config and tutorial flags."""
    group = parser.add_argument_group("throughput trials (benchy)")
    group.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="KEY=V1,V2,...",
        help="run the trials once per value of a config key (dotted or flat, as --set takes); several "
        "--sweep options run every combination",
    )
    group.add_argument("--nwarmup", type=int, help="unrecorded warm-up trials per test (bench.nwarmup)")
    group.add_argument("--ntrials", type=int, help="recorded trials per test (bench.ntrials)")
    group.add_argument("--nbatches", type=int, help="timed batches per trial (bench.nbatches)")
    group.add_argument(
        "--report_freq", type=int, help="print an iteration's throughput every N batches (bench.report_freq)"
    )
    group.add_argument(
        "--output",
        metavar="FILE",
        help="JSON file to write, relative to the current directory (default: bench.output_filename in the "
        "run directory); with --sweep, the combined JSON, with the table (.md) and plot (.png) beside it",
    )


def bench_flag_values(args: argparse.Namespace) -> dict[str, object]:
    """The config keys set by the tutorial flags and by this command's own trial options."""
    values = tutorial_flag_values(args)
    values.update(
        {
            key: getattr(args, flag)
            for flag, key in BENCH_FLAGS.items()
            if getattr(args, flag, None) is not None
        }
    )
    return values


def command_line(args: argparse.Namespace) -> str:
    """The command as typed, or rebuilt from ``args`` when dlscale was called from Python (``main(argv)``)."""
    if sys.argv[1:2] == ["bench"]:
        return shlex.join(["dlscale", *sys.argv[1:]])
    words = ["dlscale", "bench", "--yaml_config", str(args.yaml_config), "--config", args.config]
    words += [word for text in args.set for word in ("--set", text)]
    for flag in {**TUTORIAL_FLAGS, **BENCH_FLAGS}:
        value = getattr(args, flag, None)
        if isinstance(value, bool):
            words.append(f"--{flag}" if value else f"--no-{flag}")
        elif value is not None:
            words += [f"--{flag}", str(value)]
    words += [word for text in args.sweep for word in ("--sweep", text)]
    if args.output:
        words += ["--output", args.output]
    return shlex.join(words)


def run_bench_command(args: argparse.Namespace) -> int:
    """Run the trials (or the sweep) on every rank of the launch; 0 when they completed."""
    process = detect_process()
    # Console logging from the start, so that messages before the first run directory exists are formatted.
    setup_logging(None, enabled=process.is_main)
    base = load_run_config(args.yaml_config, args.config, args.set, bench_flag_values(args))
    start_process_group(process, Device.select(process.local_rank), base.parallel.timeout_s)
    finished = False
    try:
        status = _run_bench(args)
        finished = True
        return status
    finally:
        stop_process_group(wait_for_others=finished)


def _run_bench(args: argparse.Namespace) -> int:
    command = command_line(args)
    flags = bench_flag_values(args)
    output = Path(args.output).expanduser().resolve() if args.output else None
    if not args.sweep:
        cfg = load_run_config(args.yaml_config, args.config, args.set, flags)
        bench_one_config(cfg, output, command)
        return 0

    specs = [parse_sweep(text) for text in args.sweep]
    flags = flags_not_swept(flags, specs)
    # Every point's config is resolved before any trial runs: a bad value fails in seconds, not after hours.
    configs = {
        point: load_run_config(args.yaml_config, args.config, [*args.set, *point_overrides(point)], flags)
        for point in sweep_points(specs)
    }
    base = load_run_config(args.yaml_config, args.config, args.set, flags)
    sweep_dir = run_directory(base.log, base.name) / f"sweep_{'_'.join(s.key.split('.')[-1] for s in specs)}"
    combined = output or sweep_dir / "sweep.json"

    def measure(point: Point) -> BenchResults:
        return bench_one_config(
            configs[point], combined.with_name(f"{combined.stem}-{file_slug(point)}.json"), command
        )

    rows = run_sweep(specs, measure)
    title = f"dlscale bench {base.name}: " + " x ".join(s.key for s in specs)
    for line in sweep_table(rows):
        log.info("%s", line)
    if detect_process().is_main:
        context = {
            "config": {"name": base.name, "source": base.source, "overrides": list(base.overrides)},
            "sweep": [{"key": s.key, "values": list(s.values)} for s in specs],
            "dlscale_version": __version__,
            "command": command,
        }
        paths = write_sweep_outputs(rows, combined, title, context)
        log.info("BENCHY::SWEEP::Table %s, plot %s, JSON %s", paths["table"], paths["plot"], paths["json"])
    return 0


def bench_one_config(cfg: RunConfig, output: Path | None = None, command: str | None = None) -> BenchResults:
    """Build the training setup of ``cfg`` (no checkpoint is read) and run the trials on it."""
    process = detect_process()
    run_dir = run_directory(cfg.log, cfg.name)
    setup_logging(run_dir / "bench.log", enabled=process.is_main)
    log.info("dlscale %s bench: config %r from %s", __version__, cfg.name, cfg.source)
    if cfg.overrides:
        log.info("Overrides: %s", " ".join(cfg.overrides))
    device = Device.select(process.local_rank)
    setup = build_training(cfg, run_dir, process, device, resume=False)
    for line in describe_setup(setup):
        log.info("%s", line)
    return run_benchmark(setup, run_dir, output, command=command)
