"""``dlscale train``: resolve the config, set up the run directory, build, train, report."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from dlscale import __version__
from dlscale.cli import tutorial_flag_values
from dlscale.config import RunConfig, load_run_config
from dlscale.perf.bench import run_benchmark
from dlscale.perf.memory_report import MemoryReport
from dlscale.perf.monitor_observer import MonitorObserver
from dlscale.perf.profile import build_profiling
from dlscale.report.console import ConsoleReporter
from dlscale.report.progress import ProgressReporter
from dlscale.report.run_dir import run_directory, setup_rank_logging
from dlscale.report.summary import RunSummary
from dlscale.report.tensorboard import TensorBoardReporter
from dlscale.runtime.atomic_files import write_text_atomically
from dlscale.runtime.device import Device
from dlscale.runtime.distributed import start_process_group, stop_process_group
from dlscale.runtime.launch import ProcessInfo, detect_process
from dlscale.runtime.signals import StopRequest
from dlscale.train.checkpointing import CheckpointObserver
from dlscale.train.observer import Observer
from dlscale.train.setup import TrainingSetup, build_training, describe_setup
from dlscale.train.trainer import Trainer

log = logging.getLogger("dlscale.train")


def run_train(args: argparse.Namespace) -> int:
    cfg = load_run_config(args.yaml_config, args.config, args.set, tutorial_flag_values(args))
    return train(cfg)


def train(
    cfg: RunConfig, stop: StopRequest | None = None, extra_observers: list[Observer] | None = None
) -> int:
    """Train the run described by ``cfg``; returns 0 when it finished or stopped cleanly (checkpoint saved)."""
    process = detect_process()
    run_dir = run_directory(cfg.log, cfg.name)
    setup_rank_logging(cfg.log, run_dir, process)
    log.info("dlscale %s: config %r from %s (workload %s)", __version__, cfg.name, cfg.source, cfg.workload)
    if cfg.overrides:
        log.info("Overrides: %s", " ".join(cfg.overrides))
    log.info("Run directory: %s", run_dir)
    device = Device.select(process.local_rank)
    start_process_group(process, device, cfg.parallel.timeout_s)
    finished = False
    try:
        status = _train_on_this_rank(cfg, process, device, run_dir, stop, extra_observers)
        finished = True
        return status
    finally:
        # After a failure, no last barrier: the other ranks may never reach it.
        stop_process_group(wait_for_others=finished)


def _train_on_this_rank(
    cfg: RunConfig,
    process: ProcessInfo,
    device: Device,
    run_dir: Path,
    stop: StopRequest | None,
    extra_observers: list[Observer] | None,
) -> int:
    setup = build_training(cfg, run_dir, process, device, resume=not cfg.bench.enable_benchy)
    if setup.progress.completed:
        log.info(
            "This run already finished (%d steps, checkpoint %s); nothing to train. Its results are in %s. "
            "To train again, use another --run_num.",
            setup.progress.global_step,
            setup.resumed_from,
            run_dir,
        )
        return 0
    for line in describe_setup(setup):
        log.info("%s", line)
    if cfg.bench.enable_benchy:
        # The trials instead of training: no checkpoint or config.yaml of a training run is read or written.
        run_benchmark(setup, run_dir)
        return 0
    if process.is_main:
        write_text_atomically(run_dir / "config.yaml", cfg.to_yaml())
    # Profilers attach on every rank (they decide themselves which ranks record).
    setup.markers, profilers = build_profiling(cfg.profile, setup)
    setup.step.markers = setup.markers
    # The GPU/host monitor runs on every rank too: its end-of-run report gathers numbers from all of them.
    monitors = [MonitorObserver()] if cfg.monitor.enable_monitor else []
    observers = build_observers(setup) + profilers + monitors + (extra_observers or [])
    try:
        with stop or StopRequest() as stop_request:
            Trainer(setup, observers, stop_request).fit()
    finally:
        for monitor in monitors:
            monitor.close()  # its sampler thread must not outlive a run that failed
    return 0


def build_observers(setup: TrainingSetup) -> list[Observer]:
    """The observers of a run, in the order they are told about events (logs before checkpoint lines)."""
    cfg, run_dir = setup.config, setup.run_dir
    if not setup.process.is_main:
        # Every rank takes part in gathering a model-parallel checkpoint; rank 0 writes it.
        return (
            [CheckpointObserver(cfg.checkpoint, setup.checkpoints, write=False)]
            if cfg.checkpoint.enabled
            else []
        )
    observers: list[Observer] = [
        ConsoleReporter(),
        ProgressReporter(cfg.log.progress, cfg.log.progress_interval_s),
        MemoryReport(),
    ]
    tensorboard_dir = run_dir / "tensorboard" if cfg.log.tensorboard else None
    if tensorboard_dir is not None:
        observers.append(TensorBoardReporter(tensorboard_dir))
    if cfg.checkpoint.enabled:
        observers.append(CheckpointObserver(cfg.checkpoint, setup.checkpoints))
    checkpoint_dir = setup.checkpoints.directory if cfg.checkpoint.enabled else None
    observers.append(RunSummary(run_dir, tensorboard_dir, checkpoint_dir))
    return observers
