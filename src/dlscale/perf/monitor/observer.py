"""The monitor in a training run: sampling on every rank, a CSV per rank, TensorBoard and the efficiency
report on rank 0, and the spread across ranks with the slowest one named.

Files: ``<run_dir>/monitor/rank<N>.csv`` (appended on resume), ``<run_dir>/monitor/efficiency.json`` (this
attempt only) and TensorBoard events in ``<run_dir>/tensorboard/monitor`` (a run of its own in TensorBoard's list,
next to the training curves). Each sample is labelled with the training step reached when it was taken, which
is its TensorBoard step, so the monitor's curves line up with the loss; its wall time stays the sample's own.
"""

from __future__ import annotations

import csv
import logging
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from dlscale.perf.monitor.config import MonitorConfig
from dlscale.perf.monitor.sampler import NO_GPU_MESSAGE, MetricsSampler, Sample, build_report, summarize
from dlscale.runtime.atomic_files import write_text_atomically
from dlscale.runtime.distributed import is_distributed
from dlscale.runtime.gpu_metrics import GpuReading, open_gpu_backend, read_host, usable_cpus
from dlscale.runtime.strict_json import to_json
from dlscale.training.observer import EpochReport, Observer

if TYPE_CHECKING:  # imported when rank 0 opens its logger: TensorBoard's import is not free
    from dlscale.report.tensorboard import TensorBoardLogger

log = logging.getLogger("dlscale.monitor")

GPU_FIELDS = [field.name for field in fields(GpuReading)]  # index, name, utilization_pct, ...
CSV_COLUMNS = ["wall_time", "elapsed_s", "step", "gpu", *GPU_FIELDS[1:], "host_cpu_pct", "process_memory_gb",
               "machine_memory_used_gb", "machine_memory_total_gb"]  # fmt: skip


class MetricsCsv:
    """Appends samples to ``path``: one row per sample per GPU (one row with empty GPU fields when there are
    none), host columns repeated on each row so that every row stands alone in a spreadsheet. A file with
    other columns (written by an older dlscale, resumed now) is moved aside rather than appended to."""

    def __init__(self, path: Path, start_time_s: float | None = None):
        self.path, self.start_time_s = path, start_time_s
        self._columns_checked = False

    def append(self, samples: Sequence[Sample]) -> None:
        if not samples:
            return
        if self.start_time_s is None:
            self.start_time_s = samples[0].time_s
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self._columns_checked:
            self._move_aside_other_columns()
            self._columns_checked = True
        new_file = not self.path.exists() or self.path.stat().st_size == 0
        with self.path.open("a", newline="") as file:
            writer = csv.writer(file)
            if new_file:
                writer.writerow(CSV_COLUMNS)
            for sample in samples:
                h = sample.host
                host = [h.cpu_pct, h.process_memory_gb, h.memory_used_gb, h.memory_total_gb]
                step = "" if sample.step is None else sample.step
                head = [f"{sample.wall_time:.3f}", f"{sample.time_s - self.start_time_s:.3f}", step]
                for gpu in sample.gpus or [None]:
                    values = (
                        [None] * len(GPU_FIELDS) if gpu is None else [getattr(gpu, n) for n in GPU_FIELDS]
                    )
                    writer.writerow(head + ["" if value is None else value for value in values] + host)

    def _move_aside_other_columns(self) -> None:
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with self.path.open(newline="") as file:
            header = next(csv.reader(file), [])
        if header != CSV_COLUMNS:
            aside = self.path.with_name(f"{self.path.stem}.other-columns{self.path.suffix}")
            self.path.replace(aside)
            log.info("%s has other columns (an older dlscale wrote it): moved to %s", self.path, aside)


def write_tensorboard(logger: TensorBoardLogger, samples: Sequence[Sample]) -> None:
    """Per-GPU and host scalars of ``samples`` on ``logger``.

    The step is the training step reached when the sample was taken, so the curves line up with the training
    curves' step axis; the event's wall time is the sample's own, for TensorBoard's "Relative"/"Wall" axes.
    Samples come every ``monitor_interval_s`` whatever the step rate, so one step may hold several samples of
    a tag (a slow step, or the time before the first step), which TensorBoard draws at that step, and a step
    may hold none (fast steps).
    """
    for sample in samples:
        if sample.step is None:
            raise ValueError("a monitor sample without a training step cannot go on TensorBoard's step axis")
        values: dict[str, float] = {}
        for gpu in sample.gpus:
            for tag, value in (
                ("power_W", gpu.power_w),
                ("utilization_pct", gpu.utilization_pct),
                ("memory_GB", gpu.memory_used_gb),
                ("temperature_C", gpu.temperature_c),
                ("sm_clock_MHz", gpu.sm_clock_mhz),
            ):
                if value is not None:
                    values[f"GPU{gpu.index}/{tag}"] = value
        host = sample.host
        values["Host/cpu_pct"] = host.cpu_pct  # the whole machine
        values["Host/process_memory_GB"] = host.process_memory_gb  # this process and its loader workers
        values["Host/machine_memory_used_GB"] = host.memory_used_gb
        logger.log_scalars(sample.step, values, sample.wall_time)


@dataclass
class RankSpread:
    """One number across ranks (NaN values, e.g. no GPU on that rank, are left out)."""

    minimum: float
    maximum: float
    mean: float
    per_rank: list[float]


@dataclass
class CrossRankSummary:
    spreads: dict[str, RankSpread]
    slowest_rank: int
    slowest_value: float
    mean_slowness: float

    def spread_lines(self) -> list[str]:
        """'across ranks <name>: min, max, mean' of each number some rank measured; a number no rank measured
        (GPU power on a CPU run) is left out rather than printed as NaN."""
        return [
            f"across ranks {name}: min {spread.minimum:.4g}, max {spread.maximum:.4g}, mean {spread.mean:.4g}"
            for name, spread in self.spreads.items()
            if not all(math.isnan(value) for value in spread.per_rank)
        ]

    def straggler_line(self, what: str = "slowness") -> str:
        slowest, mean = self.slowest_value, self.mean_slowness
        return f"slowest rank: {self.slowest_rank} ({what} {slowest:.4g} vs mean {mean:.4g})"


def gather_across_ranks(numbers: dict[str, float | None], slowness: float, device=None) -> CrossRankSummary:
    """Min/max/mean of each of ``numbers`` over the ranks, and the rank with the highest ``slowness`` (a
    number the caller picks where higher is slower, e.g. seconds per step spent waiting for input).

    Every rank must call this with the same keys. One all-reduce of a [world_size, n] float tensor where each
    rank fills only its own row: every rank gets every value, without pickling; identity in one process.
    ``device`` must be a CUDA device under NCCL.
    """
    names = sorted(numbers)
    row = torch.tensor(
        [math.nan if numbers[n] is None else float(numbers[n]) for n in names] + [float(slowness)],
        dtype=torch.float64,
    )
    world_size, rank = (dist.get_world_size(), dist.get_rank()) if is_distributed() else (1, 0)
    # [0]: values with 0 for unknown, [1]: 1 where known; NaN itself would poison the sum.
    stacked = torch.zeros(2, world_size, len(row), dtype=torch.float64)
    stacked[0, rank], stacked[1, rank] = torch.nan_to_num(row, nan=0.0), (~torch.isnan(row)).double()
    if world_size > 1:
        stacked = stacked.to(device)
        dist.all_reduce(stacked, op=dist.ReduceOp.SUM)
    table = torch.where(stacked[1] > 0, stacked[0], torch.full_like(stacked[0], math.nan))
    values = table.cpu().tolist()
    spreads = {}
    for column, name in enumerate(names):
        per_rank = [values[r][column] for r in range(world_size)]
        known_values = [v for v in per_rank if not math.isnan(v)] or [math.nan]
        spreads[name] = RankSpread(
            min(known_values), max(known_values), statistics.fmean(known_values), per_rank
        )
    slowness_per_rank = [values[r][-1] for r in range(world_size)]
    slowest = max(range(world_size), key=lambda r: slowness_per_rank[r])
    return CrossRankSummary(spreads, slowest, slowness_per_rank[slowest], statistics.fmean(slowness_per_rank))


class MonitorObserver(Observer):
    """Samples this rank's GPU and the host during training (see the module docstring for the files)."""

    def __init__(
        self,
        cfg: MonitorConfig | None = None,
        all_local_gpus: bool = False,
        tensorboard: bool = False,
        interval_s: float | None = None,
        backend_opener=open_gpu_backend,
        host_reader=read_host,
    ):
        """``cfg``: the ``monitor:`` section; ``all_local_gpus``: this process drives every local GPU
        (``parallel.data_parallel: dataparallel``); ``tensorboard``: also write rank 0's samples there;
        ``backend_opener`` and ``host_reader``: the device reads (the tests script them)."""
        self.cfg = cfg or MonitorConfig()
        self.all_local_gpus, self.tensorboard = all_local_gpus, tensorboard
        self.interval_s, self.backend_opener, self.host_reader = interval_s, backend_opener, host_reader
        self.sampler: MetricsSampler | None = None
        self.csv: MetricsCsv | None = None
        self.writer = None
        self.flushed = 0  # samples already in the CSV and TensorBoard
        self.start_samples_seen = 0
        self.input_wait_s = 0.0  # host time spent fetching batches (the trainer's next(batches))
        self.steps = 0
        self.step = 0  # the training step reached so far: the label of the samples taken now
        self.report = None
        self.closed = False  # sampler stopped and GPU library released
        # Sampler-clock intervals in which training steps ran, after this start's first step and up to the end
        # of each epoch's last step (validation and the checkpoint follow it): the run's steady state.
        self.steady_intervals: list[tuple[float, float]] = []
        self._steady_since: float | None = None

    def on_train_start(self, trainer) -> None:
        setup = trainer.setup
        if not self.cfg.enable_monitor:
            return
        interval = self.interval_s or self.cfg.monitor_interval_s
        # Each rank reads the GPU it trains on; a CPU run reads no GPU even on a GPU machine.
        backend = None
        if setup.device.is_gpu:
            # One process drives all its GPUs under DataParallel; otherwise each rank reads its own.
            indices = (
                list(range(setup.device.visible_gpu_count()))
                if self.all_local_gpus
                else [setup.device.torch.index or 0]  # Device.select names cuda:<n>
            )
            backend = self.backend_opener(indices)
        if backend is None and setup.process.rank == 0:
            log.info(NO_GPU_MESSAGE)
        rank, run_dir = setup.process.rank, Path(setup.run_dir)
        self.csv = MetricsCsv(run_dir / "monitor" / f"rank{rank}.csv")
        if rank == 0 and self.tensorboard:
            self._open_writer(trainer)
        self.start_samples_seen = trainer.progress.samples_seen
        self.step = trainer.progress.global_step
        # The sampler's thread reads self.step, which the hooks below move on as training goes.
        self.sampler = MetricsSampler(
            backend, interval, read_host_metrics=self.host_reader, current_step=lambda: self.step
        ).start()

    def _open_writer(self, trainer) -> None:
        from dlscale.report.tensorboard import TensorBoardLogger  # only rank 0 pays for the import

        # As the trainer's own logger does: hide what an earlier, interrupted attempt wrote after the step this
        # run continues from, so a resumed run does not show the lost steps' samples next to its own.
        directory = Path(trainer.setup.run_dir) / "tensorboard" / "monitor"
        self.writer = TensorBoardLogger(directory, trainer.progress.global_step)

    def on_step_start(self, trainer) -> None:
        # The trainer times exactly the fetch of the batch (not the stop agreement, which waits for every
        # rank and would make the fastest readers look slow).
        self.input_wait_s += trainer.last_fetch_seconds
        self.steps += 1
        if self.steps > 1 and self._steady_since is None and self.sampler is not None:
            self._steady_since = self.sampler.clock()

    def on_step_end(self, trainer, loss) -> None:
        self.step = trainer.progress.global_step
        progress, plan = trainer.progress, trainer.setup.plan
        if progress.step_in_epoch >= plan.steps_in_epoch(progress.epoch):
            self._end_steady()

    def _end_steady(self) -> None:
        if self._steady_since is not None and self.sampler is not None:
            self.steady_intervals.append((self._steady_since, self.sampler.clock()))
        self._steady_since = None

    def steady_samples(self) -> list:
        """The samples taken inside :attr:`steady_intervals`."""
        return [
            sample
            for sample in self.sampler.samples
            if any(start <= sample.time_s <= end for start, end in self.steady_intervals)
        ]

    def on_epoch_end(self, trainer, report: EpochReport) -> None:
        self.step = trainer.progress.global_step
        self.flush()

    def on_rollback(self, trainer, divergence) -> None:
        # Training goes back to the checkpoint's step: the samples so far keep the steps they were taken at,
        # and a fresh writer hides those past it in TensorBoard (the steps are trained again).
        self._end_steady()
        self.step = trainer.progress.global_step
        self.flush()
        if self.writer is not None:
            self.writer.rewind(trainer.progress.global_step)

    def flush(self) -> None:
        """Write the samples taken since the last flush to the CSV (and TensorBoard on rank 0)."""
        if self.sampler is None:
            return
        fresh = self.sampler.samples[self.flushed :]
        self.flushed += len(fresh)
        self.csv.append(fresh)
        if self.writer is not None:
            write_tensorboard(self.writer, fresh)

    def on_train_end(self, trainer, outcome: str) -> None:
        if self.sampler is None:
            return
        self._end_steady()
        self.sampler.stop()
        self.flush()
        setup = trainer.setup
        summary = summarize(self.sampler.samples)
        steady = summarize(self.steady_samples())
        gpu = summary.gpus[0] if summary.gpus else None  # this rank's own GPU
        numbers = {
            "energy_j": summary.energy_j if gpu else None,  # no GPU: energy not measured, not zero
            "mean_power_w": gpu.mean_power_w if gpu else None,
            "mean_utilization_pct": gpu.mean_utilization_pct if gpu else None,
            "peak_memory_gb": gpu.peak_memory_gb if gpu else None,
            "input_wait_s_per_step": self.input_wait_s / max(self.steps, 1),
            "sampler_overhead_pct": 100 * self.sampler.overhead_fraction,
        }
        # A collective: every rank reaches on_train_end (the trainer agrees on stops across ranks).
        ranks = gather_across_ranks(numbers, numbers["input_wait_s_per_step"], setup.device.torch)
        if setup.process.rank == 0:
            # The whole job, against the global samples (ranks without a GPU reading add nothing).
            energy = sum(value for value in ranks.spreads["energy_j"].per_rank if not math.isnan(value))
            samples = trainer.progress.samples_seen - self.start_samples_seen
            samples_per_epoch = setup.plan.steps_per_epoch * setup.global_batch_size
            # A CPU run's speed is its threads' share of the cores: judged against what other processes took.
            threads = None if setup.device.is_gpu else (torch.get_num_threads(), usable_cpus())
            self.report = build_report(
                summary, samples, samples_per_epoch, energy_j=energy, steady=steady, cpu_threads=threads
            )
            lines = self.report.lines()
            if setup.process.world_size > 1:
                lines.extend(ranks.spread_lines())
                lines.append(ranks.straggler_line("input wait s/step"))
            log.info("Efficiency report (%s):\n  %s", outcome, "\n  ".join(lines))
            if self.report.cpu_sharing:
                log.warning("%s", self.report.cpu_sharing)
            document = {**self.report.to_json(), "ranks": {k: vars(v) for k, v in ranks.spreads.items()}}
            document["slowest_rank"] = ranks.slowest_rank
            path = Path(setup.run_dir) / "monitor" / "efficiency.json"
            write_text_atomically(path, to_json(document, default=str))
        self.close()

    def close(self) -> None:
        """Stop sampling and release the GPU library and TensorBoard writer (also after a failed run, which
        never reaches ``on_train_end``). Idempotent."""
        if self.sampler is not None and not self.closed:
            self.closed = True
            self.sampler.stop()
            if self.sampler.gpu_backend is not None:
                self.sampler.gpu_backend.close()
        if self.writer is not None:
            self.writer.close()
            self.writer = None
