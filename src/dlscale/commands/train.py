"""``dlscale train``: resolve the config, set up the run directory, build, train, report."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from dlscale import __version__
from dlscale.commands.flags import config_flag_values
from dlscale.config import RunConfig, load_run_config
from dlscale.errors import DlscaleError, TrainingDiverged
from dlscale.perf.bench import run_benchmark
from dlscale.perf.memory_report import MemoryReport
from dlscale.perf.monitor_observer import MonitorObserver
from dlscale.perf.profile import build_profiling
from dlscale.report.console import ConsoleReporter
from dlscale.report.progress import ProgressReporter
from dlscale.report.run_dir import early_logging, run_directory, setup_rank_logging, write_to_log_files
from dlscale.report.summary import RunSummary
from dlscale.report.tensorboard import TensorBoardReporter
from dlscale.runtime.atomic_files import write_text_atomically
from dlscale.runtime.device import Device
from dlscale.runtime.distributed import share_from_main, start_process_group, stop_process_group
from dlscale.runtime.launch import ProcessInfo, detect_process
from dlscale.runtime.run_lock import RunDirectoryLock
from dlscale.runtime.signals import StopRequest
from dlscale.runtime.storage import (
    as_storage_error,
    check_free_space,
    format_bytes,
    probe_writable,
    remove_stale_temporaries,
)
from dlscale.train.checkpoint_size import estimate_checkpoint_bytes
from dlscale.train.checkpointing import CheckpointObserver
from dlscale.train.divergence import divergence_message
from dlscale.train.observer import Observer
from dlscale.train.setup import TrainingSetup, build_training, describe_setup
from dlscale.train.trainer import Trainer

log = logging.getLogger("dlscale.train")


def run_train(args: argparse.Namespace) -> int:
    cfg = load_run_config(args.yaml_config, args.config, args.set, config_flag_values(args))
    return train(cfg)


def train(
    cfg: RunConfig, stop: StopRequest | None = None, extra_observers: list[Observer] | None = None
) -> int:
    """Train the run described by ``cfg``; returns 0 when it finished or stopped cleanly (checkpoint saved).

    Raises a DlscaleError the CLI prints as one line: RunDirectoryLocked when another run holds the run
    directory, StorageError when something cannot be written, TrainingDiverged when the loss diverged.
    """
    process = detect_process()
    run_dir = run_directory(cfg.log, cfg.name)
    training = not cfg.bench.enable_benchy  # throughput trials neither read nor write a run's checkpoints
    lock = (
        RunDirectoryLock(run_dir, wait_same_job_s=cfg.log.lock_wait_s)
        if training and process.is_main
        else None
    )
    try:
        # Nothing goes into the run's log files before the lock says the directory is ours.
        with early_logging(process.is_main) as early_records:
            start_problem = _claim_run_directory(lock, cfg, run_dir) if lock is not None else None
            device = Device.select(process.local_rank)
            start_process_group(process, device, cfg.parallel.timeout_s)
        in_step = (
            False  # whether every rank ends here alike (then a last barrier cannot wait for a lost rank)
        )
        try:
            # Every rank learns whether rank 0 could claim the directory, so none waits for a run that never starts.
            problem = share_from_main(start_problem, device)
            if problem is not None:
                in_step = True
                raise problem
            setup_rank_logging(cfg.log, run_dir, process)
            write_to_log_files(early_records)
            log.info(
                "dlscale %s: config %r from %s (workload %s)", __version__, cfg.name, cfg.source, cfg.workload
            )
            if cfg.overrides:
                log.info("Overrides: %s", " ".join(cfg.overrides))
            log.info("Run directory: %s", run_dir)
            status = _train_on_this_rank(cfg, process, device, run_dir, stop, extra_observers)
            in_step = True
            return status
        except TrainingDiverged:
            in_step = True  # the divergence guard makes every rank stop at the same step
            raise
        except (OSError, RuntimeError) as exc:
            storage = as_storage_error(exc)
            if storage is not None:
                raise storage from exc
            raise
        finally:
            # The barrier keeps rank 0, which hosts the rendezvous store, alive until every rank has left: a rank
            # still leaving when rank 0's process exits can wait for the store until the timeout. After a
            # failure of one rank alone there is no barrier: the others may never reach it.
            stop_process_group(wait_for_others=in_step)
    finally:
        if lock is not None:
            lock.release()


def _claim_run_directory(lock: RunDirectoryLock, cfg: RunConfig, run_dir: Path) -> DlscaleError | None:
    """Rank 0: lock the run directory, clear what killed saves left, and check it can be written (before
    anything is built: a read-only ``checkpoints/`` must not surface an epoch later). The problem, if any."""
    try:
        lock.acquire()
        leftovers = remove_stale_temporaries([run_dir, run_dir / "checkpoints", run_dir / "figures"])
        if leftovers:
            log.info(
                "Removed %d temporary file(s) (%s) that interrupted saves left: %s",
                len(leftovers),
                format_bytes(sum(size for _, size in leftovers)),
                ", ".join(str(path) for path, _ in leftovers),
            )
        for directory in writable_directories(cfg, run_dir):
            probe_writable(directory)
    except DlscaleError as exc:
        return exc
    return None


def writable_directories(cfg: RunConfig, run_dir: Path) -> list[Path]:
    """The directories a training run writes into."""
    directories = [run_dir, run_dir / "figures"]
    if cfg.checkpoint.enabled:
        directories.append(run_dir / "checkpoints")
    if cfg.log.tensorboard:
        directories.append(run_dir / "tensorboard")
    return directories


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
            "To train longer, raise --num_epochs (or --num_iters); to train again, use another --run_num.",
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
        if cfg.checkpoint.enabled:
            check_free_space(setup.checkpoints.directory, estimate_checkpoint_bytes(setup))
        write_text_atomically(run_dir / "config.yaml", cfg.to_yaml())
    # Profilers attach on every rank (they decide themselves which ranks record).
    setup.markers, profilers = build_profiling(cfg.profile, setup)
    setup.step.markers = setup.markers
    # The GPU/host monitor runs on every rank too: its end-of-run report gathers numbers from all of them.
    monitors = [MonitorObserver()] if cfg.monitor.enable_monitor else []
    observers = build_observers(setup) + profilers + monitors + (extra_observers or [])
    try:
        with stop or StopRequest() as stop_request:
            trainer = Trainer(setup, observers, stop_request)
            trainer.fit()
    finally:
        for monitor in monitors:
            monitor.close()  # its sampler thread must not outlive a run that failed
    if trainer.guard.divergence is not None:  # also when a stop's save found diverged weights
        raise TrainingDiverged(divergence_message(trainer.guard.divergence, setup))
    return 0


def build_observers(setup: TrainingSetup) -> list[Observer]:
    """The observers of a run, in the order they are told about events (logs before checkpoint lines)."""
    cfg, run_dir = setup.config, setup.run_dir
    rollback = cfg.train.on_nonfinite == "rollback"  # needs a checkpoint to go back to from the start
    if not setup.process.is_main:
        # Every rank takes part in gathering a model-parallel checkpoint; rank 0 writes it.
        return (
            [CheckpointObserver(cfg.checkpoint, setup.checkpoints, write=False, save_at_start=rollback)]
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
        observers.append(CheckpointObserver(cfg.checkpoint, setup.checkpoints, save_at_start=rollback))
    checkpoint_dir = setup.checkpoints.directory if cfg.checkpoint.enabled else None
    observers.append(RunSummary(run_dir, tensorboard_dir, checkpoint_dir))
    return observers
