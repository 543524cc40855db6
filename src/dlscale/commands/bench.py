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
from typing import TYPE_CHECKING

from dlscale.commands.flags import CONFIG_FLAGS, config_flag_values
from dlscale.config import RunConfig, load_run_config
from dlscale.perf.bench.sweep_points import (
    Point,
    SweepSpec,
    file_slug,
    flags_not_swept,
    parse_sweep,
    point_overrides,
    sweep_points,
)
from dlscale.report.run_dir import run_directory, setup_logging
from dlscale.runtime.launch import detect_process
from dlscale.version import __version__

if TYPE_CHECKING:
    from dlscale.perf.bench.trials import BenchResults
    from dlscale.runtime.device import Device

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
    """Run the trials (or the sweep) on every rank of the launch; 0 when they completed.

    The config, and with --sweep every point's config, is resolved before torch is imported: a bad value fails
    in a fraction of a second, not after torch's import or hours of trials.
    """
    process = detect_process()
    # Console logging from the start, so that messages before the first run directory exists are formatted.
    setup_logging(None, enabled=process.is_main)
    flags = config_flag_values(args)
    base = load_run_config(args.yaml_config, args.config, args.set, flags)
    if not args.sweep:
        from dlscale import api

        output = Path(args.output).expanduser().resolve() if args.output else None
        api.bench_config(base, output, command_line(args))
        return 0
    specs = [parse_sweep(text) for text in args.sweep]
    flags = flags_not_swept(flags, specs)
    configs = {
        point: load_run_config(args.yaml_config, args.config, [*args.set, *point_overrides(point)], flags)
        for point in sweep_points(specs)
    }
    from dlscale.run.process_group import distributed_run
    from dlscale.runtime.device import Device

    device = Device.select(process.local_rank)
    with distributed_run(process, device, base.parallel.timeout_s) as ending:
        status = _run_bench(args, base, specs, configs, device)
        ending.alike = True
        return status


def _run_bench(
    args: argparse.Namespace,
    base: RunConfig,
    specs: list[SweepSpec],
    configs: dict[Point, RunConfig],
    device: Device,
) -> int:
    """The trials of every point of the command line's sweep over ``base`` (``configs``: each point's)."""
    from dlscale.perf.bench.sweep import run_sweep, sweep_table, write_sweep_outputs
    from dlscale.run.bench import bench_one_config, default_sweep_dir
    from dlscale.runtime.distributed import share_text_from_main

    command = command_line(args)
    output = Path(args.output).expanduser().resolve() if args.output else None
    combined = output
    if combined is None:  # rank 0's clock names the folder, so that every rank writes into the same one
        keys = [s.key.split(".")[-1] for s in specs]
        sweep_dir = share_text_from_main(
            str(default_sweep_dir(run_directory(base.log, base.name), keys)), device
        )
        combined = Path(str(sweep_dir)) / "sweep.json"

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
