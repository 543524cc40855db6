"""GPU and host monitoring, backend-agnostic: a background sampler, its summary, and an efficiency report with
a plain verdict per GPU, and on a CPU run the warning of :mod:`.cpu_sharing` when other processes took the cores its
threads needed. Device calls live in ``dlscale.runtime.gpu_metrics``; a GPU backend here is anything whose ``read()`` returns
``GpuReading`` values, so the tests drive all of this with a scripted fake (and a scripted host)."""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from dlscale.perf.monitor.cpu_sharing import cpu_sharing_warning, process_cpu_cores
from dlscale.runtime.gpu_metrics import GpuBackend, GpuReading, HostReading, read_host

log = logging.getLogger("dlscale.monitor")

NO_GPU_MESSAGE = "no GPU metrics (no NVML/amdsmi or no GPU): recording host CPU and memory only"

# Verdict thresholds (see ``verdict``): utilization is the share of time a kernel ran, power the share of the
# board's enforced limit that it drew on average.
IDLE_UTILIZATION_PCT = 50.0  # below: the GPU sat idle much of the time
HIGH_UTILIZATION_PCT = 80.0  # at or above, with power below LOW_POWER_FRACTION: kernels run but do little
LOW_POWER_FRACTION = 0.5
BUSY_POWER_FRACTION = 0.7  # at or above: the GPU is doing real work


@dataclass(frozen=True)
class Sample:
    time_s: float  # the sampler's clock (monotonic): differences give durations
    wall_time: float  # seconds since the epoch, for the CSV and TensorBoard
    gpus: list[GpuReading]
    host: HostReading
    step: int | None = None  # the training step reached when the sample was taken (None outside training)


class MetricsSampler:
    """Reads the GPUs (``gpu_backend``; None: host only) and the host every ``interval_s`` on a daemon thread;
    ``current_step`` (called on that thread) labels each sample with the training step reached by then.

    ``stop()`` wakes the thread at once and joins it, so stopping costs no waiting for the interval. The time
    spent inside the reads over the time sampled is ``overhead_fraction``.
    """

    def __init__(
        self,
        gpu_backend: GpuBackend | None,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        read_host_metrics: Callable[[], HostReading] = read_host,
        current_step: Callable[[], int | None] = lambda: None,
    ):
        self.gpu_backend, self.interval_s, self.clock = gpu_backend, interval_s, clock
        self.read_host_metrics, self.current_step = read_host_metrics, current_step
        self._samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started_at: float | None = None  # perf_counter times of start() and stop(), for the overhead
        self._stopped_at: float | None = None
        self.busy_s = 0.0  # time spent reading the devices
        self._reported_error = False
        read_host_metrics()  # psutil's CPU% measures from the previous call: start the window now

    @property
    def samples(self) -> list[Sample]:
        """A copy of the samples so far (the thread keeps appending)."""
        with self._lock:
            return list(self._samples)

    def sample_once(self) -> Sample:
        """Read everything now and keep the sample (also what the thread does each interval)."""
        begin = time.perf_counter()
        gpus: list[GpuReading] = []
        if self.gpu_backend is not None:
            try:
                gpus = self.gpu_backend.read()
            except Exception as exc:  # a driver hiccup must not end the run's monitoring (nor the run)
                if not self._reported_error:
                    log.warning("reading the GPUs failed (%s); those samples keep host metrics only", exc)
                    self._reported_error = True
        sample = Sample(self.clock(), time.time(), gpus, self.read_host_metrics(), self.current_step())
        with self._lock:
            self._samples.append(sample)
        self.busy_s += time.perf_counter() - begin
        return sample

    def start(self) -> MetricsSampler:
        if self._thread is None:
            self._started_at = time.perf_counter()
            self._thread = threading.Thread(target=self._loop, name="dlscale-monitor", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while True:
            self.sample_once()
            if self._stop.wait(self.interval_s):
                break

    def stop(self) -> None:
        """Stop and join the thread, with one last sample so the run's end is covered; safe to call twice."""
        if self._thread is not None and not self._stop.is_set():
            self._stop.set()
            self._thread.join()
            self.sample_once()
            self._stopped_at = time.perf_counter()

    @property
    def overhead_fraction(self) -> float:
        """Time spent sampling over the time the sampler ran (0 before it started)."""
        if self._started_at is None:
            return 0.0
        elapsed = (self._stopped_at or time.perf_counter()) - self._started_at
        return self.busy_s / elapsed if elapsed > 0 else 0.0

    def __enter__(self) -> MetricsSampler:  # `with MetricsSampler(...) as sampler:` stops even on errors
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]  # a field the board did not report is left out, not zero
    return statistics.fmean(known) if known else None


def _peak(values: Sequence[float | None]) -> float | None:
    return max((v for v in values if v is not None), default=None)


def gpu_energy_j(
    times_s: Sequence[float], powers_w: Sequence[float | None], counters_j: Sequence[float | None]
):
    """Energy between the first and last sample, and how it was found: the board's counter when every sample
    has it and it never went back (a driver reload resets it), else the trapezoid integral of power."""
    if len(times_s) < 2:
        return 0.0, "none"
    steps = range(1, len(times_s))
    if all(c is not None for c in counters_j) and all(counters_j[i] >= counters_j[i - 1] for i in steps):
        return counters_j[-1] - counters_j[0], "counter"
    energy, pairs = 0.0, 0
    for i in steps:
        if powers_w[i - 1] is not None and powers_w[i] is not None:
            energy += (powers_w[i - 1] + powers_w[i]) / 2 * (times_s[i] - times_s[i - 1])
            pairs += 1
    # A board that reports neither (MIG slices, some consumer cards) has no energy, not zero energy.
    return (energy, "power integral") if pairs else (0.0, "none")


@dataclass
class GpuStats:
    index: int
    name: str
    mean_power_w: float | None
    peak_power_w: float | None
    power_limit_w: float | None
    mean_utilization_pct: float | None
    peak_memory_gb: float | None
    memory_total_gb: float | None
    peak_temperature_c: float | None
    mean_sm_clock_mhz: float | None
    energy_j: float
    energy_source: str  # "counter", "power integral" or "none"

    @property
    def power_fraction(self) -> float | None:
        """Mean power over the enforced limit (None when either is unknown)."""
        if self.mean_power_w is None or not self.power_limit_w:
            return None
        return self.mean_power_w / self.power_limit_w


@dataclass
class MonitorSummary:
    duration_s: float
    sample_count: int
    gpus: list[GpuStats]
    host_mean_cpu_pct: float | None  # the whole machine's CPU
    process_peak_memory_gb: float | None  # this process with its children (DataLoader workers), resident
    machine_peak_memory_used_gb: float | None  # every process on the machine, not only this run
    machine_memory_total_gb: float | None
    process_mean_cpu_cores: float | None = (
        None  # this process's CPU seconds per second (its threads together)
    )
    machine_cpus: int | None = None  # the logical CPUs that host_mean_cpu_pct covers

    @property
    def energy_j(self) -> float:
        return sum(gpu.energy_j for gpu in self.gpus)


def summarize(samples: Sequence[Sample]) -> MonitorSummary:
    """Per-GPU means, peaks and energy, and host means/peaks (the process's memory apart from the machine's,
    its CPU use apart from the machine's), over ``samples``."""
    by_gpu: dict[int, list[tuple[float, GpuReading]]] = {}
    for sample in samples:
        for reading in sample.gpus:
            by_gpu.setdefault(reading.index, []).append((sample.time_s, reading))
    gpus = []
    for index, series in sorted(by_gpu.items()):
        readings = [r for _, r in series]

        def column(name: str, readings: list[GpuReading] = readings) -> list[float | None]:
            return [getattr(r, name) for r in readings]

        energy, source = gpu_energy_j([t for t, _ in series], column("power_w"), column("energy_j"))
        gpus.append(
            GpuStats(
                index=index,
                name=readings[-1].name,
                mean_power_w=_mean(column("power_w")),
                peak_power_w=_peak(column("power_w")),
                power_limit_w=_peak(column("power_limit_w")),
                mean_utilization_pct=_mean(column("utilization_pct")),
                peak_memory_gb=_peak(column("memory_used_gb")),
                memory_total_gb=_peak(column("memory_total_gb")),
                peak_temperature_c=_peak(column("temperature_c")),
                mean_sm_clock_mhz=_mean(column("sm_clock_mhz")),
                energy_j=energy,
                energy_source=source,
            )
        )
    return MonitorSummary(
        duration_s=samples[-1].time_s - samples[0].time_s if samples else 0.0,
        sample_count=len(samples),
        gpus=gpus,
        host_mean_cpu_pct=_mean([s.host.cpu_pct for s in samples]),
        process_peak_memory_gb=_peak([s.host.process_memory_gb for s in samples]),
        machine_peak_memory_used_gb=_peak([s.host.memory_used_gb for s in samples]),
        machine_memory_total_gb=_peak([s.host.memory_total_gb for s in samples]),
        process_mean_cpu_cores=process_cpu_cores([(s.time_s, s.host.process_cpu_s) for s in samples]),
        machine_cpus=max((s.host.machine_cpus for s in samples if s.host.machine_cpus), default=None),
    )


def verdict(gpu: GpuStats) -> str:
    """One plain sentence on how hard a GPU worked, from its mean utilization and power (thresholds above)."""
    util, fraction = gpu.mean_utilization_pct, gpu.power_fraction
    head = f"GPU {gpu.index} power unknown"
    if fraction is not None:
        head = f"GPU {gpu.index} averaged {gpu.mean_power_w:.0f} W of {gpu.power_limit_w:.0f} W"
    if util is None:
        return f"{head}; no utilization reading, no verdict"
    if util < IDLE_UTILIZATION_PCT:
        return (
            f"{head} at {util:.0f}% utilization: GPU idle much of the time (input pipeline or host work); "
            "run `dlscale bench`"
        )
    if util >= HIGH_UTILIZATION_PCT and fraction is not None and fraction < LOW_POWER_FRACTION:
        return (
            f"{head} while reporting {util:.0f}% utilization: likely waiting on data (utilization counts a "
            "kernel running, not how busy the GPU is); run `dlscale bench`"
        )
    if fraction is not None and fraction >= BUSY_POWER_FRACTION:
        return f"{head} ({fraction:.0%}) at {util:.0f}% utilization: GPU busy"
    return f"{head} at {util:.0f}% utilization: moderately loaded; `dlscale bench` shows where time goes"


@dataclass
class EfficiencyReport:
    """Energy per unit of training, and a verdict per GPU. ``energy_j`` and ``samples_trained`` must cover the
    same GPUs (one rank's GPU and its share of samples, or the whole job and the global sample count)."""

    summary: MonitorSummary
    energy_j: float
    samples_trained: int
    samples_per_epoch: int | None  # a full epoch's global samples (partial epochs would skew J per epoch)
    verdicts: list[str] = field(default_factory=list)
    # The samples taken while training steps ran, after each start's first step (compilation, CUDA graph
    # capture) and without validation and checkpoints: what the verdicts judge when there are enough of them.
    steady: MonitorSummary | None = None
    # A CPU run that other processes left far fewer cores than its threads (``cpu_sharing_warning``); the
    # run logs it as a warning of its own, after the report.
    cpu_sharing: str | None = None

    @property
    def joules_per_sample(self) -> float | None:
        return self.energy_j / self.samples_trained if self.samples_trained else None

    @property
    def joules_per_epoch(self) -> float | None:
        per_sample = self.joules_per_sample
        return (
            per_sample * self.samples_per_epoch if per_sample is not None and self.samples_per_epoch else None
        )

    def lines(self) -> list[str]:
        if not self.summary.gpus:
            return [NO_GPU_MESSAGE, self._host_line()]
        lines = [
            f"GPU {g.index} ({g.name}): power mean {_fmt(g.mean_power_w)} W, peak {_fmt(g.peak_power_w)} W"
            + (f" of {g.power_limit_w:.0f} W limit" if g.power_limit_w else "")
            + f"; utilization {_fmt(g.mean_utilization_pct)}%; memory peak {_fmt(g.peak_memory_gb, 1)} GB"
            f"; energy {g.energy_j:.0f} J ({g.energy_source})"
            for g in self.summary.gpus
        ]
        lines.append(
            f"Energy {self.energy_j:.0f} J: {_fmt(self.joules_per_sample, 2)} J per training sample, "
            f"{_fmt(self.joules_per_epoch)} J per epoch"
        )
        if judges_steady_state(self.steady):
            lines += [
                f"While training steps ran ({self.steady.duration_s:.1f} s of {self.summary.duration_s:.1f} s: without"
                f" the first step, validation and checkpoints): GPU {g.index} power mean {_fmt(g.mean_power_w)} W,"
                f" utilization {_fmt(g.mean_utilization_pct)}%"
                for g in self.steady.gpus
            ]
        return [*lines, self._host_line(), *self.verdicts]

    def _host_line(self) -> str:
        summary = self.summary
        machine_total = summary.machine_memory_total_gb
        return (
            f"Host: process memory (with its loader workers) peak {_fmt(summary.process_peak_memory_gb, 2)} GB; "
            f"machine: CPU mean {_fmt(summary.host_mean_cpu_pct)}%, memory used peak "
            f"{_fmt(summary.machine_peak_memory_used_gb, 1)}"
            + (f" of {machine_total:.1f} GB" if machine_total else " GB")
        )

    def to_json(self) -> dict:
        per_unit = {"joules_per_sample": self.joules_per_sample, "joules_per_epoch": self.joules_per_epoch}
        return {**asdict(self), **per_unit}


def _fmt(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


# Samples (one a second by default) the steady part of a run needs before its verdict replaces the whole run's.
STEADY_SAMPLES_FOR_VERDICT = 3


def judges_steady_state(steady: MonitorSummary | None) -> bool:
    """Whether the steady part of a run has enough GPU samples to judge it by."""
    return steady is not None and bool(steady.gpus) and steady.sample_count >= STEADY_SAMPLES_FOR_VERDICT


def judged_host(summary: MonitorSummary, steady: MonitorSummary | None) -> MonitorSummary | None:
    """The part of a run its host use is judged by: the steps when they have enough samples, else the whole
    run when it has (None: too short a run to judge)."""
    for part in (steady, summary):
        if part is not None and part.sample_count >= STEADY_SAMPLES_FOR_VERDICT:
            return part
    return None


def build_report(
    summary: MonitorSummary,
    samples_trained: int,
    samples_per_epoch: int | None,
    energy_j: float | None = None,
    steady: MonitorSummary | None = None,
    cpu_threads: tuple[int, int] | None = None,
) -> EfficiencyReport:
    """The efficiency report of ``summary``; ``energy_j`` replaces its own energy (e.g. summed over ranks).

    The verdicts judge ``steady`` (the samples taken while training steps ran) when it has enough samples: a
    short run is mostly start-up (compilation, CUDA graph capture), validation and checkpoints, in which the GPU
    waits, and the whole run's means would blame the input pipeline for it. ``cpu_threads`` (a CPU run's
    torch threads and the CPUs it may use) asks for the CPU-sharing check, on the same part of the run."""
    energy = summary.energy_j if energy_j is None else energy_j
    judged = steady if judges_steady_state(steady) else summary
    verdicts = [verdict(gpu) for gpu in judged.gpus]
    host = judged_host(summary, steady)
    sharing = None
    if cpu_threads and host:
        used, busy = host.process_mean_cpu_cores, host.host_mean_cpu_pct
        sharing = cpu_sharing_warning(used, busy, host.machine_cpus, *cpu_threads)
    return EfficiencyReport(summary, energy, samples_trained, samples_per_epoch, verdicts, steady, sharing)
