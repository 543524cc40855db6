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
from dlscale.commands.flags import CONFIG_FLAGS, config_flag_values
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


def command_line(args: argparse.Namespace) -> str:
    """The command as typed, or rebuilt from ``args`` when dlscale was called from Python (``main(argv)``)."""
    if sys.argv[1:2] == ["bench"]:
        return shlex.join(["dlscale", *sys.argv[1:]])
    words = ["dlscale", "bench", "--yaml_config", str(args.yaml_config), "--config", args.config]
    words += [word for text in args.set for word in ("--set", text)]
    for flag in CONFIG_FLAGS:
        value = getattr(args, flag.name, None)
        if isinstance(value, bool):
            words.append(f"--{flag.name}" if value else f"--no-{flag.name}")
        elif value is not None:
            words += [f"--{flag.name}", str(value)]
    words += [word for text in args.sweep for word in ("--sweep", text)]
    if args.output:
        words += ["--output", args.output]
    return shlex.join(words)


def run_bench_command(args: argparse.Namespace) -> int:
    """Run the trials (or the sweep) on every rank of the launch; 0 when they completed."""
    process = detect_process()
    # Console logging from the start, so that messages before the first run directory exists are formatted.
    setup_logging(None, enabled=process.is_main)
    base = load_run_config(args.yaml_config, args.config, args.set, config_flag_values(args))
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
    flags = config_flag_values(args)
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
