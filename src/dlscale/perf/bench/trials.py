"""benchy's throughput trials (IO, SYNTHETIC, FULL), as an explicit driver over a built training setup.

The tests, their trials and their output lines are those of romerojosh/benchy:

* IO: each trial drains ``nbatches`` batches from the training loader; no compute.
* SYNTHETIC: one real batch is fetched (untimed) and kept on the device; each trial runs ``nbatches + 1``
  training steps on it, the first untimed. No I/O at all, so this is the model's own speed.
* FULL: each trial runs ``nbatches`` training steps on fresh batches, exactly as training does.

Each test runs ``nwarmup`` unrecorded trials, then ``ntrials`` recorded ones. Timing synchronizes the device
(and, optionally, all ranks) at the first timed point and after each iteration, so queued GPU work is inside
the interval it belongs to. Throughputs are global samples/s: local batch x world size per iteration.

Unlike benchy, nothing here hijacks the DataLoader or exits the process: a benchmark
(:func:`dlscale.run.bench.run_benchmark`) returns its results, and every rank runs the same number of steps, so
it works unchanged under DDP. Only rank 0 prints and writes files (benchy's rule); the verdict is drawn from rank
0's timings.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dlscale.errors import DataError
from dlscale.perf.bench.config import BenchConfig
from dlscale.perf.bench.report import (
    TrialSeries,
    Verdict,
)
from dlscale.perf.monitor.sampler import MetricsSampler, summarize
from dlscale.runtime.distributed import barrier
from dlscale.runtime.gpu_metrics import open_gpu_backend
from dlscale.training.training_setup import TrainingSetup

log = logging.getLogger("dlscale.bench")

Clock = Callable[[], float]


@dataclass
class BenchResults:
    """The recorded trials of the tests that ran, and what they mean."""

    tests: dict[str, TrialSeries]  # "IO", "SYNTHETIC", "FULL" (only those that ran)
    nranks: int
    verdict: Verdict
    utilization: dict[str, dict[str, float | None]]  # SYNTHETIC/FULL -> tflops_per_gpu, mfu (empty: unknown)
    record: dict[str, Any]  # the JSON document
    output_path: Path | None  # where rank 0 wrote it (None on other ranks)

    def mean(self, name: str) -> float | None:
        """Mean global samples/s of test ``name``, None if it did not run."""
        return self.tests[name].mean if name in self.tests else None


class EndlessBatches:
    """The training loader's batches without end: each new pass starts with the next sampler epoch.

    A trial lasts ``nbatches`` whatever the data set's length (as in benchy); the restart and its cost (worker
    start-up without persistent workers) land in the trial that hits it, as they would in training.
    """

    def __init__(self, loader: Any, sampler: Any = None):
        self.loader = loader
        self.sampler = sampler
        self.epoch = -1
        self._iterator: Iterator[Any] | None = None

    def next(self) -> Any:
        """The next batch, starting a new pass over the loader when needed."""
        if self._iterator is not None:
            try:
                return next(self._iterator)
            except StopIteration:
                pass
        self._start_pass()
        try:
            return next(self._iterator)
        except StopIteration:
            raise DataError(
                "the training loader yields no batches: the data set is smaller than one batch"
            ) from None

    def _start_pass(self) -> None:
        self.epoch += 1
        if self.sampler is not None:
            self.sampler.set_epoch(self.epoch)
        self._iterator = iter(self.loader)

    def close(self) -> None:
        """Drop the pass in progress (its worker processes exit unless the loader keeps them)."""
        self._iterator = None


class TrialDriver:
    """Runs the enabled tests of ``bench`` on ``setup``; ``clock`` (seconds) can be faked in tests."""

    def __init__(self, setup: TrainingSetup, bench: BenchConfig, clock: Clock = time.perf_counter):
        self.setup = setup
        self.bench = bench
        self.clock = clock
        self.samples_per_iteration = setup.global_batch_size  # local batch x data-parallel ranks
        self.global_step = 0
        self.batches = EndlessBatches(setup.train_loader, setup.train_sampler)
        self._print = log.info if setup.process.is_main else _silent
        device = setup.device
        self.gpu_metrics = open_gpu_backend([device.torch.index or 0]) if device.is_gpu else None

    def run(self) -> dict[str, TrialSeries]:
        """IO, then SYNTHETIC, then FULL (benchy's order), each only if enabled."""
        b, tests = self.bench, {}
        try:
            if b.run_io:
                tests["IO"] = self._run_test("IO", self.batches.next)
            if b.run_synthetic or b.run_full:
                self.setup.model.train()
            if b.run_synthetic:
                # The one real batch SYNTHETIC trains on. A copy, because a pipeline that recycles its device
                # buffers could otherwise overwrite it while the trials still use it.
                inputs, targets = (t.clone() for t in self._fetch_to_device())

                def synthetic_step() -> None:
                    self._train_step(inputs, targets)

                tests["SYNTHETIC"] = self._run_test("SYNTHETIC", synthetic_step, before_trial=synthetic_step)
            if b.run_full:
                tests["FULL"] = self._run_test("FULL", lambda: self._train_step(*self._fetch_to_device()))
        finally:
            self.batches.close()
            if self.gpu_metrics is not None:
                self.gpu_metrics.close()
        return tests

    def _fetch_to_device(self) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = self.batches.next()
        return self.setup.device.move(inputs), self.setup.device.move(targets)

    def _train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.setup.step(inputs, targets, self.global_step)
        self.global_step += 1

    def _run_test(
        self, name: str, iteration: Callable[[], Any], before_trial: Callable[[], Any] | None = None
    ) -> TrialSeries:
        b, device = self.bench, self.setup.device
        series = TrialSeries(name)
        device.reset_peak_memory()
        # Power and energy of this rank's GPU over the test (samples per joule for the ladder); none on a CPU.
        # Warm-up trials (compilation, autotuning) are left out, as they are from the throughput.
        self._run_trials(name, series, iteration, before_trial, range(b.nwarmup))
        sampler = MetricsSampler(self.gpu_metrics, interval_s=0.1) if self.gpu_metrics is not None else None
        with sampler if sampler is not None else contextlib.nullcontext():
            self._run_trials(name, series, iteration, before_trial, range(b.nwarmup, b.nwarmup + b.ntrials))
        series.peak_memory_gb = device.peak_memory_gb()
        # SYNTHETIC's untimed first step of each trial (before_trial) uses energy too.
        steps_per_trial = b.nbatches + (1 if before_trial is not None else 0)
        samples_read = b.ntrials * steps_per_trial * self.setup.local_batch_size
        series.energy = test_energy(sampler, samples_read) if sampler is not None else None
        return series

    def _run_trials(
        self,
        name: str,
        series: TrialSeries,
        iteration: Callable[[], Any],
        before_trial: Callable[[], Any] | None,
        indices: range,
    ) -> None:
        b = self.bench
        for index in indices:
            warmup = index < b.nwarmup
            label = f"{name}_WARMUP_{index}" if warmup else f"{name}_{index - b.nwarmup}"
            if before_trial is not None:
                before_trial()
            rates, elapsed, throughput = self._timed_trial(label, iteration)
            if not warmup:
                series.rates.append(rates)
                series.avg_iter_throughput.append(statistics.fmean(rates))
                series.trial_throughput.append(throughput)
                series.trial_time.append(elapsed)

    def _timed_trial(self, label: str, iteration: Callable[[], Any]) -> tuple[list[float], float, float]:
        """Time ``nbatches`` iterations: their rates (samples/s), the trial's seconds and its samples/s."""
        b = self.bench
        self._synchronize()
        start = previous = self.clock()
        rates = []
        for count in range(1, b.nbatches + 1):
            iteration()
            self._synchronize()
            now = self.clock()
            rates.append(_per_second(self.samples_per_iteration, now - previous))
            previous = now
            if b.report_freq and count % b.report_freq == 0:
                self._print("BENCHY::%s::Iteration Throughput: %s", label, rates[-1])
        elapsed = previous - start
        throughput = _per_second(b.nbatches * self.samples_per_iteration, elapsed)
        self._print("BENCHY::%s::Average Iteration Throughput: %s", label, statistics.fmean(rates))
        self._print("BENCHY::%s::Trial Throughput: %s", label, throughput)
        return rates, elapsed, throughput

    def _synchronize(self) -> None:
        self.setup.device.synchronize()
        # The barrier aligns the ranks' clocks at each timing point (benchy's use_distributed_barrier).
        if self.bench.use_distributed_barrier:
            barrier()


def _silent(*args: object) -> None:
    """Non-zero ranks time the same trials but print nothing."""


def _per_second(samples: float, seconds: float) -> float:
    # A coarse or fake clock can report zero seconds; a tiny floor keeps the rate finite (and valid JSON).
    return samples / max(seconds, 1e-12)


def test_energy(sampler: MetricsSampler, samples: int) -> dict[str, float | None] | None:
    """Energy, power and utilization of this rank's GPU over one test, and joules per sample it read."""
    gpus = summarize(sampler.samples).gpus
    if not gpus:
        return None
    gpu = gpus[0]
    joules = gpu.energy_j if gpu.energy_source != "none" else None
    return {
        "energy_j": joules,
        "joules_per_sample": joules / samples if joules and samples else None,
        "samples_per_joule": samples / joules if joules else None,
        "mean_power_w": gpu.mean_power_w,
        "power_limit_w": gpu.power_limit_w,
        "mean_utilization_pct": gpu.mean_utilization_pct,
        "sampler_overhead": sampler.overhead_fraction,
    }


def run_trials(
    setup: TrainingSetup, bench: BenchConfig, clock: Clock = time.perf_counter
) -> dict[str, TrialSeries]:
    """Run the enabled tests of ``bench`` (the ``bench:`` section) on ``setup``; return their trials."""
    return TrialDriver(setup, bench, clock).run()
