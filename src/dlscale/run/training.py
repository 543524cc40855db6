"""Train a run: claim its directory, start the process group, build the run, attach the observers, fit, report.

:func:`train` is what ``dlscale train`` runs on every rank; :func:`train_and_summarize` also returns the run's
summary (the Python API's :func:`dlscale.api.train`).
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlscale.checkpoint.checkpoint_observer import CheckpointObserver
from dlscale.checkpoint.sharded_writer import ShardedCheckpointWriter
from dlscale.checkpoint.size import estimate_checkpoint_bytes
from dlscale.checkpoint.training_state import CheckpointRecovery
from dlscale.config import RunConfig
from dlscale.errors import DlscaleError, TrainingDiverged, WorkloadError
from dlscale.perf.monitor.memory_lines import MemoryReport
from dlscale.perf.monitor.observer import MonitorObserver
from dlscale.report.console import ConsoleReporter
from dlscale.report.loggers import missing_logger_package
from dlscale.report.metrics_observer import MetricsReporter
from dlscale.report.progress_display import ProgressReporter
from dlscale.report.run_dir import early_logging, run_directory, setup_rank_logging, write_to_log_files
from dlscale.report.summary import RunSummary, missing_report
from dlscale.run.assembly import BuiltRun, build_training, describe_run, writes_sharded_checkpoints
from dlscale.run.bench import run_benchmark
from dlscale.run.divergence_advice import divergence_message
from dlscale.run.process_group import distributed_run
from dlscale.runtime.atomic_files import write_text_atomically
from dlscale.runtime.device import Device
from dlscale.runtime.distributed import share_from_main, share_text_from_main
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
from dlscale.runtime.strict_json import to_json
from dlscale.scoring.evaluator import evaluate
from dlscale.training.observer import Observer
from dlscale.training.trainer import Trainer
from dlscale.version import __version__
from dlscale.workloads.user_code import raised_by_workload

log = logging.getLogger("dlscale.train")


@dataclass(frozen=True)
class TrainOutcome:
    """How a run ended: the exit status, its directory, and its ``summary.json`` document (the same on every
    rank; the bench record instead for ``bench.enable_benchy``; None when the run wrote none)."""

    status: int
    run_dir: Path
    summary: dict[str, Any] | None


def train(
    cfg: RunConfig, stop: StopRequest | None = None, extra_observers: list[Observer] | None = None
) -> int:
    """Train the run described by ``cfg``; returns 0 when it finished or stopped cleanly (checkpoint saved).

    Raises a DlscaleError the CLI prints as one line: RunDirectoryLocked when another run holds the run
    directory, StorageError when something cannot be written, TrainingDiverged when the loss diverged.
    """
    return train_and_summarize(cfg, stop, extra_observers).status


def train_and_summarize(
    cfg: RunConfig, stop: StopRequest | None = None, extra_observers: list[Observer] | None = None
) -> TrainOutcome:
    """:func:`train`, returning the run's summary too (see :class:`TrainOutcome`)."""
    process = detect_process()
    run_dir = run_directory(cfg.log, cfg.name)
    training = not cfg.bench.enable_benchy  # throughput trials neither read nor write a run's checkpoints
    lock = (
        RunDirectoryLock(run_dir, wait_same_job_s=cfg.log.lock_wait_s)
        if training and process.is_main
        else None
    )
    try:
        with contextlib.ExitStack() as group:
            # Nothing goes into the run's log files before the lock says the directory is ours.
            with early_logging(process.is_main) as early_records:
                start_problem = _claim_run_directory(lock, cfg, run_dir) if lock is not None else None
                device = Device.select(process.local_rank)
                ending = group.enter_context(distributed_run(process, device, cfg.parallel.timeout_s))
            try:
                # Every rank learns whether rank 0 could claim the directory, so none waits for a run that never
                # starts.
                problem = share_from_main(start_problem, device)
                if problem is not None:
                    ending.alike = True
                    raise problem
                setup_rank_logging(cfg.log, run_dir, process)
                write_to_log_files(early_records)
                log.info(
                    "dlscale %s: config %r from %s (workload %s)",
                    __version__,
                    cfg.name,
                    cfg.source,
                    cfg.workload,
                )
                if cfg.overrides:
                    log.info("Overrides: %s", " ".join(cfg.overrides))
                log.info("Run directory: %s", run_dir)
                summary = _train_on_this_rank(cfg, process, device, run_dir, stop, extra_observers)
                # Every rank returns rank 0's summary, so a script reads the same result under torchrun.
                shared = share_text_from_main(to_json(summary) if summary is not None else None, device)
            except TrainingDiverged:
                ending.alike = True  # the divergence guard makes every rank stop at the same step
                raise
            except WorkloadError as exc:
                log_traceback_to_files(exc)
                raise
            except (OSError, RuntimeError) as exc:
                storage = as_storage_error(exc)
                if storage is not None:
                    raise storage from exc
                raise
            ending.alike = True
            return TrainOutcome(0, run_dir, json.loads(shared) if shared is not None else None)
    finally:
        if lock is not None:
            lock.release()


def log_traceback_to_files(error: WorkloadError) -> None:
    """The whole traceback of an exception in the workload's code goes to the run's log file (the console
    shows the error's one line), which the error then names."""
    if not error.details:
        return
    record = logging.LogRecord(log.name, logging.ERROR, __file__, 0, "%s", (error.details.rstrip(),), None)
    files = write_to_log_files([record])
    if files:
        error.logged_to = files[0]


def _claim_run_directory(lock: RunDirectoryLock, cfg: RunConfig, run_dir: Path) -> DlscaleError | None:
    """Rank 0: lock the run directory, clear what killed saves left, and check it can be written (before
    anything is built: a read-only ``checkpoints/`` must not surface an epoch later). The problem, if any."""
    try:
        lock.acquire()
        leftovers = remove_stale_temporaries(
            [run_dir, run_dir / "checkpoints", run_dir / "figures", run_dir / "metrics"]
        )
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
    directories = [run_dir, run_dir / "figures", run_dir / "metrics"]
    if cfg.checkpoint.enabled:
        directories.append(run_dir / "checkpoints")
    if cfg.log.writes_tensorboard:
        directories.append(run_dir / "tensorboard")
    return directories


def _train_on_this_rank(
    cfg: RunConfig,
    process: ProcessInfo,
    device: Device,
    run_dir: Path,
    stop: StopRequest | None,
    extra_observers: list[Observer] | None,
) -> dict[str, Any] | None:
    """Train on this rank; rank 0's summary document (None on the other ranks)."""
    if not cfg.bench.enable_benchy:
        # Before anything is built, and on every rank alike: a logger whose package is missing is a one-line
        # error naming the extra to install, not a traceback an epoch later.
        problem = share_from_main(
            missing_logger_package(cfg.log.loggers) if process.is_main else None, device
        )
        if problem is not None:
            raise problem
    run = build_training(cfg, run_dir, process, device, training=not cfg.bench.enable_benchy)
    setup = run.setup
    if setup.progress.completed:
        return _finished_already(run, device)
    for line in describe_run(run):
        log.info("%s", line)
    if cfg.bench.enable_benchy:
        # The trials instead of training: no checkpoint or config.yaml of a training run is read or written.
        return run_benchmark(cfg, setup, run_dir).record
    if process.is_main:
        if cfg.checkpoint.enabled:
            check_free_space(run.checkpoints.directory, estimate_checkpoint_bytes(setup.model, cfg.optim))
        write_text_atomically(run_dir / "config.yaml", cfg.to_yaml())
    # The GPU/host monitor runs on every rank: its end-of-run report gathers numbers from all of them.
    monitors = (
        [
            MonitorObserver(
                cfg.monitor, cfg.parallel.data_parallel == "dataparallel", cfg.log.writes_tensorboard
            )
        ]
        if cfg.monitor.enable_monitor
        else []
    )
    sharded = sharded_writer(run)
    own = build_observers(run, sharded)
    observers = own + list(run.profilers) + monitors + (extra_observers or [])
    recovery = CheckpointRecovery(setup, run.checkpoints, run.resumed_from, sharded)
    try:
        with stop or StopRequest() as stop_request:
            trainer = Trainer(setup, observers, stop_request, recovery)
            # A later batch may still fail in the user's code (a data set's sample 517, a loss's corner case).
            with raised_by_workload(run.workload, None):
                trainer.fit()
    finally:
        for monitor in monitors:
            monitor.close()  # its sampler thread must not outlive a run that failed
    if trainer.guard.divergence is not None:  # also when a stop's save found diverged weights
        raise TrainingDiverged(
            divergence_message(trainer.guard.divergence, cfg, run.checkpoints, setup.global_batch_size)
        )
    return next((o.written for o in own if isinstance(o, RunSummary)), None)


def _finished_already(run: BuiltRun, device: Device) -> dict[str, Any] | None:
    """A finished run launched again: nothing to train. Its end-of-run report, if a kill after the last checkpoint
    lost it, is written from the final checkpoint (whose weights the run holds). Rank 0's summary document."""
    setup, run_dir, is_main = run.setup, run.setup.run_dir, run.setup.process.is_main
    progress = setup.progress
    missing = share_text_from_main(missing_report(run_dir, progress.global_step) if is_main else None, device)
    advice = "To train longer, raise --num_epochs (or --num_iters); to train again, use another --run_num."
    if missing is None or not progress.history:
        log.info(
            "This run already finished (%d steps, checkpoint %s); nothing to train. Its results are in %s. %s",
            progress.global_step,
            run.resumed_from,
            run_dir,
            advice,
        )
        return _read_summary(run_dir / "summary.json") if is_main else None
    # The last epoch's validation again, on every rank (its metrics are summed over them), for the numbers and
    # figures that the summary takes from it and the checkpoint does not hold.
    v = setup.validation
    if v.sync_buffers is not None:
        v.sync_buffers()
    validation = evaluate(
        setup.model, v.loader, v.evaluator, setup.device, v.predict, v.metric_sum, v.lockstep
    )
    if not is_main:
        return None
    written = run_summary(run).write_finished(Trainer(setup, []), validation)
    log.info(
        "This run already finished (%d steps, checkpoint %s), and the end-of-run report was missing (%s): "
        "written from the final checkpoint (%s, figures in %s). %s",
        progress.global_step,
        run.resumed_from,
        missing,
        run_dir / "summary.json",
        run_dir / "figures",
        advice,
    )
    return written


def _read_summary(path: Path) -> dict[str, Any] | None:
    """The ``summary.json`` an earlier run of this directory wrote, if it is there and readable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def sharded_writer(run: BuiltRun) -> ShardedCheckpointWriter | None:
    """The writer of the run's sharded checkpoints when it writes them (``checkpoint.format``), else None."""
    if not writes_sharded_checkpoints(run):
        return None
    setup = run.setup
    return ShardedCheckpointWriter(
        run.checkpoints, setup.process.is_main, run.config.checkpoint.async_save, setup.device
    )


def build_observers(run: BuiltRun, sharded: ShardedCheckpointWriter | None = None) -> list[Observer]:
    """The observers of a run, in the order they are told about events (logs before checkpoint lines)."""
    cfg, setup, run_dir = run.config, run.setup, run.setup.run_dir
    rollback = cfg.train.on_nonfinite == "rollback"  # needs a checkpoint to go back to from the start
    if not setup.process.is_main:
        # Every rank takes part in gathering a model-parallel checkpoint (rank 0 writes it), or writes its shards.
        return (
            [CheckpointObserver(cfg.checkpoint, run.checkpoints, False, rollback, sharded)]
            if cfg.checkpoint.enabled
            else []
        )
    observers: list[Observer] = [
        ConsoleReporter(),
        ProgressReporter(cfg.log.progress, cfg.log.progress_interval_s),
        MemoryReport(),
    ]
    if cfg.checkpoint.enabled:
        observers.append(CheckpointObserver(cfg.checkpoint, run.checkpoints, True, rollback, sharded))
    # After the checkpoints (it writes its rows when a save has read the loss) and before RunSummary (which
    # plots its steps.csv).
    observers.append(MetricsReporter(cfg.log, run_dir))
    observers.append(run_summary(run))
    return observers


def run_summary(run: BuiltRun) -> RunSummary:
    """The observer that writes the run's end-of-run report (summary.json, figures/)."""
    cfg, run_dir = run.config, run.setup.run_dir
    return RunSummary(
        run_dir,
        run_dir / "tensorboard" if cfg.log.writes_tensorboard else None,
        run.checkpoints.directory if cfg.checkpoint.enabled else None,
        explain_divergence=lambda divergence: divergence_message(
            divergence, cfg, run.checkpoints, run.setup.global_batch_size
        ),
        loss_name=getattr(run.workload, "loss_name", None),
    )
