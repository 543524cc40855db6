"""Throughput trials of a whole config: build its run (no checkpoint is read), run benchy's IO / SYNTHETIC / FULL
trials on it, print the verdict, and write the JSON and the plot (the trials themselves: :mod:`dlscale.perf.bench.trials`).
"""

from __future__ import annotations

import logging
import shlex
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from dlscale.config import RunConfig
from dlscale.perf.bench.config import BenchConfig
from dlscale.perf.bench.plot import plotted_interval, throughput_figure
from dlscale.perf.bench.report import (
    TrialSeries,
    Verdict,
    benchy_record,
    decide_from_trials,
    energy_line,
    interval_line,
    summary_lines,
    summary_record,
    utilization_line,
    utilization_numbers,
)
from dlscale.perf.bench.trials import BenchResults, Clock, run_trials
from dlscale.report.figures import save_png
from dlscale.report.run_dir import run_directory, setup_logging
from dlscale.run.assembly import build_training, describe_run
from dlscale.runtime.atomic_files import write_text_atomically
from dlscale.runtime.device import Device
from dlscale.runtime.launch import detect_process
from dlscale.runtime.strict_json import to_json
from dlscale.training.training_setup import TrainingSetup
from dlscale.version import __version__

log = logging.getLogger("dlscale.bench")


def bench_one_config(cfg: RunConfig, output: Path | None = None, command: str | None = None) -> BenchResults:
    """Build the run of ``cfg`` (no checkpoint is read) and run the trials on it."""
    process = detect_process()
    run_dir = run_directory(cfg.log, cfg.name)
    setup_logging(run_dir / "bench.log", enabled=process.is_main)
    log.info("dlscale %s bench: config %r from %s", __version__, cfg.name, cfg.source)
    if cfg.overrides:
        log.info("Overrides: %s", " ".join(cfg.overrides))
    device = Device.select(process.local_rank)
    run = build_training(cfg, run_dir, process, device, training=False)
    for line in describe_run(run):
        log.info("%s", line)
    return run_benchmark(cfg, run.setup, run_dir, output, command=command)


def run_benchmark(
    cfg: RunConfig,
    setup: TrainingSetup,
    run_dir: Path,
    output_path: Path | None = None,
    clock: Clock = time.perf_counter,
    command: str | None = None,
) -> BenchResults:
    """Run the trials on a built training setup, print benchy's lines and a verdict, and write the JSON.

    The JSON goes to ``output_path``, by default a new file in ``run_dir/bench/`` (:func:`default_bench_path`; an
    absolute ``output_filename`` is kept as it is). Only rank 0 prints and writes. Never reads or writes checkpoints.
    """
    bench, process = cfg.bench, setup.process
    if process.is_main:
        log.info(
            "BENCHY::INFO::Message: Using dlscale bench config: nwarmup %d, ntrials %d, nbatches %d, "
            "global batch %d (%d x %d data-parallel rank(s)).",
            bench.nwarmup,
            bench.ntrials,
            bench.nbatches,
            setup.global_batch_size,
            setup.local_batch_size,
            setup.global_batch_size // setup.local_batch_size,
        )
    tests = run_trials(setup, bench, clock)
    verdict = decide_from_trials(tests).for_run(switched_on_knobs(cfg), setup.device.is_gpu)
    utilization = utilization_numbers(tests, setup.utilization, process.world_size)
    record = build_record(cfg, setup, tests, verdict, utilization, command)
    path = None
    if process.is_main:
        for line in summary_lines(tests):
            log.info("%s", line)
        if utilization:
            log.info(
                "%s", utilization_line(utilization, setup.utilization.describe(), on_gpu=setup.device.is_gpu)
            )
        energy = energy_line(tests)
        if energy:
            log.info("%s", energy)
        memory = [f"{n} {t.peak_memory_gb:.2f} GB" for n, t in tests.items() if t.peak_memory_gb is not None]
        if memory:
            log.info("BENCHY::MEMORY::peak device memory: %s", "; ".join(memory))
        log.info("%s", interval_line(tests))  # the verdict below compares these intervals
        log.info("%s", verdict.line())
        path = Path(output_path) if output_path is not None else default_bench_path(Path(run_dir), bench)
        path = path.expanduser()
        log.info("BENCHY::INFO::Message: Writing JSON output to %s.", path)
        write_text_atomically(path, to_json(record))
        results = {name: plotted_interval(t) for name, t in tests.items()}
        title = f"dlscale bench {cfg.name} on {setup.device.name}: {verdict.kind}"
        figure = throughput_figure([f"{bench.ntrials} trials of {bench.nbatches} batches"], [results], title)
        log.info("BENCHY::INFO::Plot: %s", save_png(figure, path.with_suffix(".png")))
    return BenchResults(tests, process.world_size, verdict, utilization, record, path)


def default_bench_path(run_dir: Path, bench: BenchConfig, now: datetime | None = None) -> Path:
    """``<run_dir>/bench/<date-time>-<output_filename>``: each bench in a file of its own, beside the training run
    but not among its files, never over an earlier bench (a second in the same second gets ``-2``, ...)."""
    name = Path(bench.output_filename).expanduser()
    if name.is_absolute():
        return name
    return _unused_path(run_dir / "bench", name.name, now)


def default_sweep_dir(run_dir: Path, keys: Sequence[str]) -> Path:
    """``<run_dir>/bench/<date-time>-sweep-<key>[-<key>...]/``: a sweep's files in a folder of their own, never
    over an earlier sweep's."""
    return _unused_path(run_dir / "bench", "sweep-" + "-".join(keys), None)


def _unused_path(folder: Path, name: str, now: datetime | None) -> Path:
    """``folder/<date-time>-<name>``, or ``<date-time>-2-<name>``, ... when that exists already."""
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    path = folder / f"{stamp}-{name}"
    number = 2
    while path.exists():
        path = folder / f"{stamp}-{number}-{name}"
        number += 1
    return path


def switched_on_knobs(cfg: RunConfig) -> set[str]:
    """The verdict knobs (by flag) a run's config already has on."""
    train = cfg.train
    on = {
        "--amp_mode": train.amp_mode != "none",
        "--enable_fused": cfg.optim.enable_fused,
        "--enable_jit": train.enable_jit,
        "--cuda_graphs": train.cuda_graphs,
        "--tf32 on": train.tf32,
        "--data_loader_config gpu": cfg.loader.pipeline == "gpu",
        "--set loader.device_prefetch=true": cfg.loader.device_prefetch,
        "--set loader.pin_memory=true": cfg.loader.pin_memory is True,
    }
    return {flag for flag, active in on.items() if active}


def build_record(
    cfg: RunConfig,
    setup: TrainingSetup,
    tests: dict[str, TrialSeries],
    verdict: Verdict,
    utilization: dict[str, dict[str, float | None]],
    command: str | None = None,
) -> dict[str, Any]:
    """benchy's JSON document plus what a reader needs to compare runs: config, knobs, device, versions."""
    record = benchy_record(setup.process.world_size, tests)
    record.update(
        {
            "summary": summary_record(tests),
            "verdict": verdict.to_json(),
            "utilization": {
                **utilization,
                "describe": setup.utilization.describe() if setup.utilization is not None else None,
            },
            "device": setup.device.name,
            "torch_version": torch.__version__,
            "dlscale_version": __version__,
            "config": {"name": cfg.name, "source": cfg.source, "overrides": list(cfg.overrides)},
            "batch": {
                "local": setup.local_batch_size,
                "global": setup.global_batch_size,
                "world_size": setup.process.world_size,
                "layout": setup.mesh.shape.describe(),
            },
            "knobs": {
                "amp_mode": cfg.train.amp_mode,
                "tf32": cfg.train.tf32,
                "enable_jit": cfg.train.enable_jit,
                "cuda_graphs": cfg.train.cuda_graphs,
                "enable_fused": cfg.optim.enable_fused,
                "data_loader_config": cfg.loader.data_loader_config,
                "num_data_workers": cfg.loader.num_data_workers,
                # Whether gradients were all-reduced: `dlscale scaling` pairs runs with and without it at
                # one GPU count to measure the communication overhead.
                "noddp": cfg.parallel.noddp,
            },
            "bench": {
                name: getattr(cfg.bench, name)
                for name in ("nwarmup", "ntrials", "nbatches", "use_distributed_barrier")
            },
            "date": datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": command if command is not None else shlex.join(sys.argv),
        }
    )
    return record
