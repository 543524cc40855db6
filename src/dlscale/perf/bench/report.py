"""What the throughput trials mean: the bottleneck verdict, benchy's summary lines, and the JSON record.

The verdict compares the mean global samples/s of the three tests:

* IO: the loader alone. SYNTHETIC: the training step alone, on one cached device batch. FULL: both, as in
  training.
* ``IO < (1 - BOUND_MARGIN) x SYNTHETIC``: **IO-bound**, the loader cannot feed the model.
* ``SYNTHETIC < (1 - BOUND_MARGIN) x IO``: **compute-bound**, the training step is the limit.
* otherwise **balanced**: both limits are within BOUND_MARGIN of each other, so speeding up only one gains
  little.
* but first, ``FULL < (1 - OVERHEAD_MARGIN) x min(IO, SYNTHETIC)``: **overhead**. Each part alone is fast
  enough, yet together they are much slower: reading and computing do not overlap (a loader without workers
  reads while the GPU idles), or something per step (host-to-device copies, synchronizations) costs time.

BOUND_MARGIN is 10 %: trial-to-trial noise on a shared node is a few percent, so a smaller gap is not a
reliable ranking. OVERHEAD_MARGIN is 20 %: FULL always pays a little for running both (the copy of each batch
to the device, which SYNTHETIC skips), and a gap under a fifth is rarely worth restructuring the input
pipeline.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from dlscale.perf.bench.intervals import RatioInterval, mean_interval, ratio_interval

BOUND_MARGIN = 0.10
OVERHEAD_MARGIN = 0.20
TEST_NAMES = ("IO", "SYNTHETIC", "FULL")

IO_KNOBS = (
    "--num_data_workers N (more loader processes)",
    "--data_loader_config gpu (threaded reads, copies ahead)",
    "--set loader.pin_memory=true",
    "--set loader.prefetch_factor=N (pytorch loader) or loader.prefetch_depth=N (gpu loader)",
)
COMPUTE_KNOBS = (
    "--amp_mode bf16",
    "--enable_fused",
    "--enable_jit",
    "--cuda_graphs",
    "--tf32 on",
    "a larger --local_batch_size",
)
OVERHEAD_KNOBS = (
    "--data_loader_config gpu (overlaps reading and the device copy with compute)",
    "more --num_data_workers with --set loader.persistent_workers=true",
    "--set loader.device_prefetch=true",
)

# Knobs (by their leading text) that only help on a GPU. A CPU has no bf16/fp16 units: autocast there emulates
# them and made a step slower (0.12x the fp32 speed in `dlscale tune` on 2 cores).
GPU_ONLY_KNOBS = (
    "--amp_mode",
    "--cuda_graphs",
    "--tf32 on",
    "--set loader.pin_memory",
    "--set loader.device_prefetch",
)

VerdictKind = Literal[
    "IO-bound", "compute-bound", "balanced", "overhead", "inconclusive", "within noise", "needs more trials"
]


@dataclass(frozen=True)
class Verdict:
    """The bottleneck the trials point to, why, and the knobs worth trying for it."""

    kind: VerdictKind
    reason: str
    knobs: tuple[str, ...] = ()

    def line(self) -> str:
        """The ``BENCHY::VERDICT::`` console line."""
        tried = f" Try: {'; '.join(self.knobs)}." if self.knobs else ""
        return f"BENCHY::VERDICT::{self.kind}: {self.reason}.{tried}"

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "reason": self.reason, "knobs": list(self.knobs), "line": self.line()}

    def for_run(self, switched_on: set[str], on_gpu: bool) -> Verdict:
        """The same verdict without the knobs this run already uses or that need a GPU it does not have."""
        dropped = {knob for flag in switched_on for knob in self.knobs if knob.startswith(flag)}
        if not on_gpu:
            dropped |= {knob for knob in self.knobs if knob.startswith(GPU_ONLY_KNOBS)}
        return replace(self, knobs=tuple(k for k in self.knobs if k not in dropped))


def _rate(value: float) -> str:
    return f"{value:.1f} samples/s"


def decide_bottleneck(io: float | None, synthetic: float | None, full: float | None) -> Verdict:
    """Name the bottleneck from the mean global samples/s of IO, SYNTHETIC and FULL (None: not measured)."""
    if io is not None and synthetic is not None:
        if full is not None and full < (1 - OVERHEAD_MARGIN) * min(io, synthetic):
            slower = "IO" if io <= synthetic else "SYNTHETIC"
            return Verdict(
                "overhead",
                f"FULL {_rate(full)} is {full / min(io, synthetic):.0%} of the slower part alone "
                f"({slower}; IO {_rate(io)}, SYNTHETIC {_rate(synthetic)}): reading and computing do not "
                "overlap, or each step pays a fixed cost (device copies, synchronizations)",
                OVERHEAD_KNOBS,
            )
        full_note = f"; FULL {_rate(full)}" if full is not None else "; FULL not measured, overhead unknown"
        return _bound_verdict(io, synthetic, full_note)
    return _partial_verdict(io, synthetic, full)


def _bound_verdict(io: float, synthetic: float, full_note: str) -> Verdict:
    """IO-bound, compute-bound or balanced, from IO's and SYNTHETIC's means; ``full_note`` ends the reason."""
    if io < (1 - BOUND_MARGIN) * synthetic:
        return Verdict(
            "IO-bound",
            f"IO {_rate(io)} is {io / synthetic:.0%} of SYNTHETIC {_rate(synthetic)}: the loader cannot "
            f"feed the model{full_note}",
            IO_KNOBS,
        )
    if synthetic < (1 - BOUND_MARGIN) * io:
        return Verdict(
            "compute-bound",
            f"SYNTHETIC {_rate(synthetic)} is {synthetic / io:.0%} of IO {_rate(io)}: the training step "
            f"is the limit, the loader keeps up{full_note}",
            COMPUTE_KNOBS,
        )
    return Verdict(
        "balanced",
        f"IO {_rate(io)} and SYNTHETIC {_rate(synthetic)} are within {BOUND_MARGIN:.0%} of each other "
        f"and overlap{full_note}: to go faster, speed up both",
        COMPUTE_KNOBS + IO_KNOBS,
    )


def _partial_verdict(io: float | None, synthetic: float | None, full: float | None) -> Verdict:
    """What can (and cannot) be concluded when IO or SYNTHETIC did not run."""
    if full is not None and io is not None:
        if full >= (1 - BOUND_MARGIN) * io:
            return Verdict(
                "IO-bound",
                f"FULL {_rate(full)} runs at the loader's rate (IO {_rate(io)}); without SYNTHETIC the "
                "model's own headroom is unknown (set bench.run_synthetic=true)",
                IO_KNOBS,
            )
        return Verdict(
            "inconclusive",
            f"FULL {_rate(full)} is well below IO {_rate(io)}, so the loader is not the limit; compute or "
            "overhead: run SYNTHETIC too (bench.run_synthetic=true) to tell them apart",
        )
    if full is not None and synthetic is not None:
        if full >= (1 - BOUND_MARGIN) * synthetic:
            return Verdict(
                "compute-bound",
                f"FULL {_rate(full)} runs at the model's rate (SYNTHETIC {_rate(synthetic)}); without IO "
                "the loader's headroom is unknown (set bench.run_io=true)",
                COMPUTE_KNOBS,
            )
        return Verdict(
            "inconclusive",
            f"FULL {_rate(full)} is well below SYNTHETIC {_rate(synthetic)}, so the model step is not the "
            "limit; IO or overhead: run IO too (bench.run_io=true) to tell them apart",
        )
    measured = [
        f"{name} {_rate(v)}"
        for name, v in zip(TEST_NAMES, (io, synthetic, full), strict=True)
        if v is not None
    ]
    return Verdict(
        "inconclusive",
        f"only {' and '.join(measured) or 'nothing'} measured: naming a bottleneck needs IO and SYNTHETIC "
        "(and FULL to see overhead); set bench.run_io, run_synthetic and run_full to true",
    )


def decide_from_trials(tests: Mapping[str, TrialSeries]) -> Verdict:
    """The verdict of :func:`decide_bottleneck` on the means, kept only when the comparison that names it holds
    beyond the trials' noise: the 95 % interval of the ratio of the two tests it compares
    (:func:`~dlscale.perf.bench.intervals.ratio_interval`, on the logarithms: the loader and the model step may
    run at rates a hundred times apart, and their noise is a fraction of each).

    IO-bound needs IO / SYNTHETIC below ``1 - BOUND_MARGIN`` over its whole interval (compute-bound SYNTHETIC /
    IO), overhead FULL / (the slower part) below ``1 - OVERHEAD_MARGIN``; otherwise the verdict is **within
    noise**, and with a single trial of a test it is **needs more trials** (one trial has no interval). FULL
    faster than SYNTHETIC beyond the noise is impossible for the same step, so it is said to be a disturbed
    measurement.
    """
    verdict = decide_bottleneck(*mean_throughputs(tests))
    measured = {name: t for name, t in tests.items() if t.trial_throughput}
    disturbed = _impossible_ordering(measured)
    if (
        verdict.kind in ("IO-bound", "compute-bound", "overhead")
        and "IO" in measured
        and "SYNTHETIC" in measured
    ):
        single = [name for name, t in measured.items() if len(t.trial_throughput) < 2]
        if single:
            return Verdict(
                "needs more trials",
                f"the means say {verdict.kind} ({verdict.reason}), but {' and '.join(single)} ran one trial, "
                "which gives no interval to tell a bottleneck from noise: set --ntrials 2 or more"
                + disturbed,
            )
        compared, interval, limit = _deciding_ratio(verdict.kind, measured)
        if verdict.kind == "overhead" and not interval.high < limit:
            # FULL's trials cannot tell whether reading and computing overlap; IO against SYNTHETIC may still
            # name the limit (a disturbed FULL trial must not hide a clear compute-bound step)
            io, synthetic = measured["IO"].mean, measured["SYNTHETIC"].mean
            uncertain = (
                f"; FULL {_rate(measured['FULL'].mean)} scatters too much to tell whether reading and "
                f"computing overlap ({compared} = {interval.describe()})"
            )
            bound = _bound_verdict(io, synthetic, uncertain)
            if bound.kind != "balanced":
                verdict = bound
                compared, interval, limit = _deciding_ratio(verdict.kind, measured)
        if not interval.high < limit:
            return Verdict(
                "within noise",
                f"the means say {verdict.kind}, but {compared} = {interval.describe()} is not below {limit:.2f} "
                f"beyond the noise ({_intervals(measured)}): run more trials (--ntrials) of more batches (--nbatches), with no "
                "other work on the node" + disturbed,
            )
    return replace(verdict, reason=verdict.reason + disturbed) if disturbed else verdict


def _deciding_ratio(kind: str, tests: Mapping[str, TrialSeries]) -> tuple[str, RatioInterval, float]:
    """The ratio that names verdict ``kind`` ("IO / SYNTHETIC", ...), its interval, and the bound it must stay
    under."""
    io, synthetic = tests["IO"].trial_throughput, tests["SYNTHETIC"].trial_throughput
    if kind == "IO-bound":
        return "IO / SYNTHETIC", ratio_interval(io, synthetic), 1 - BOUND_MARGIN
    if kind == "compute-bound":
        return "SYNTHETIC / IO", ratio_interval(synthetic, io), 1 - BOUND_MARGIN
    slower = "IO" if tests["IO"].mean <= tests["SYNTHETIC"].mean else "SYNTHETIC"
    full = tests.get("FULL")
    if full is None:  # overhead is only named with FULL measured; never stands without it
        return f"FULL / {slower}", RatioInterval(math.nan, math.nan, math.inf), 1 - OVERHEAD_MARGIN
    return (
        f"FULL / {slower}",
        ratio_interval(full.trial_throughput, tests[slower].trial_throughput),
        1 - OVERHEAD_MARGIN,
    )


def _impossible_ordering(tests: Mapping[str, TrialSeries]) -> str:
    """A note when FULL beat SYNTHETIC beyond the noise ("" otherwise): FULL does all SYNTHETIC does, and more."""
    full, synthetic = tests.get("FULL"), tests.get("SYNTHETIC")
    if full is None or synthetic is None:
        return ""
    if not ratio_interval(full.trial_throughput, synthetic.trial_throughput).low > 1:
        return ""
    return (
        f". Note: FULL ({_rate(full.mean)}) is faster than SYNTHETIC ({_rate(synthetic.mean)}) beyond the "
        "noise, which the same training step cannot be: the trials were disturbed (other processes on the "
        "node, too few batches per trial, clocks ramping up); re-run them alone with more --nbatches"
    )


def _interval_ends(series: TrialSeries) -> list[float]:
    interval = mean_interval(series.trial_throughput)
    return [interval.low, interval.high]


def interval_line(tests: Mapping[str, TrialSeries]) -> str:
    """``BENCHY::INTERVAL::`` with each test's mean and 95% interval (benchy's own lines keep its std)."""
    return "BENCHY::INTERVAL::" + _intervals(tests)


def _intervals(tests: Mapping[str, TrialSeries]) -> str:
    """'IO 12.0 +- 5.0 samples/s (95% CI, 3 trials); FULL ...' for the tests that ran."""
    return "; ".join(
        f"{name} {mean_interval(t.trial_throughput).describe()}"
        for name, t in tests.items()
        if t.trial_throughput
    )


@dataclass
class TrialSeries:
    """The recorded trials of one test (IO, SYNTHETIC or FULL), in benchy's JSON fields."""

    name: str
    rates: list[list[float]] = field(default_factory=list)  # per trial: samples/s of each iteration
    avg_iter_throughput: list[float] = field(default_factory=list)
    trial_throughput: list[float] = field(default_factory=list)  # global samples/s of each trial
    trial_time: list[float] = field(default_factory=list)  # seconds of each trial
    peak_memory_gb: float | None = None  # device memory peak over the test (None on the CPU)
    energy: dict[str, float | None] | None = None  # this rank's GPU energy and power over the test (GPU only)

    @property
    def mean(self) -> float:
        """Mean trial throughput (global samples/s)."""
        return statistics.fmean(self.trial_throughput)

    @property
    def std(self) -> float:
        """Population standard deviation of the trial throughputs, as benchy's np.std."""
        # Not statistics.pstdev: it raises AttributeError on a NaN or inf (Python 3.10, 3.11).
        mean = self.mean
        return math.sqrt(sum((x - mean) ** 2 for x in self.trial_throughput) / len(self.trial_throughput))

    def benchy_json(self) -> dict[str, list]:
        return {
            "rates": self.rates,
            "avg_iter_throughput": self.avg_iter_throughput,
            "trial_throughput": self.trial_throughput,
            "trial_time": self.trial_time,
        }


def summary_lines(tests: Mapping[str, TrialSeries]) -> list[str]:
    """benchy's summary lines, byte for byte (the space before SYNTHETIC included: users grep for it)."""
    prefixes = {"IO": "IO", "SYNTHETIC": " SYNTHETIC", "FULL": "FULL"}
    return [
        f"BENCHY::SUMMARY::{prefixes[name]} average trial throughput: {tests[name].mean:.3f} +/- "
        f"{tests[name].std:.3f}"
        for name in TEST_NAMES
        if name in tests
    ]


def utilization_numbers(
    tests: Mapping[str, TrialSeries], utilization: Any, world_size: int
) -> dict[str, dict[str, float | None]]:
    """TFLOP/s and MFU per GPU of SYNTHETIC and FULL (empty without a FLOP count)."""
    if utilization is None:
        return {}
    numbers = {}
    for name in ("SYNTHETIC", "FULL"):
        if name in tests:
            per_gpu = tests[name].mean / world_size
            numbers[name] = {"tflops_per_gpu": utilization.tflops(per_gpu), "mfu": utilization.mfu(per_gpu)}
    return numbers


def utilization_line(
    numbers: Mapping[str, Mapping[str, float | None]], described: str, on_gpu: bool | None = None
) -> str:
    """One line after benchy's summary: achieved TFLOP/s and MFU per GPU (``on_gpu``), per CPU process (not
    ``on_gpu``) or per device (None: the caller does not say). The numbers keep their key
    ``tflops_per_gpu`` on every device, so records stay comparable."""
    unit = "device" if on_gpu is None else "GPU" if on_gpu else "CPU process"
    parts = []
    for name, values in numbers.items():
        mfu = values["mfu"]
        mfu_text = f", MFU {mfu:.1%}" if mfu is not None else ""
        parts.append(f"{name} {values['tflops_per_gpu']:.3f} TFLOP/s per {unit}{mfu_text}")
    return f"BENCHY::UTILIZATION::{'; '.join(parts)} ({described})"


def benchy_record(nranks: int, tests: Mapping[str, TrialSeries]) -> dict[str, object]:
    """benchy's JSON structure; a test that did not run has empty lists, as in benchy."""
    record: dict[str, object] = {"nranks": nranks}
    for name in TEST_NAMES:
        record[name] = (tests[name] if name in tests else TrialSeries(name)).benchy_json()
    return record


def summary_record(tests: Mapping[str, TrialSeries]) -> dict[str, dict[str, object]]:
    """dlscale's per-test summary: mean, std, number of trials, peak memory, and GPU energy and power."""
    return {
        name: {
            "mean": t.mean,
            "std": t.std,
            "ci95": _interval_ends(t),
            "ntrials": len(t.trial_throughput),
            "peak_memory_gb": t.peak_memory_gb,
            "energy": t.energy,
        }
        for name, t in tests.items()
    }


def energy_line(tests: Mapping[str, TrialSeries]) -> str | None:
    """``BENCHY::ENERGY::`` with J/sample, power and utilization per test (rank 0's GPU), if measured."""
    parts = []
    for name, t in tests.items():
        e = t.energy
        if not e or e.get("joules_per_sample") is None:
            continue
        power = f"{e['mean_power_w']:.0f} W" if e.get("mean_power_w") is not None else "? W"
        if e.get("power_limit_w"):
            power += f" of {e['power_limit_w']:.0f} W"
        util = e.get("mean_utilization_pct")
        parts.append(
            f"{name} {e['joules_per_sample']:.3g} J/sample ({e['samples_per_joule']:.3g} samples/J), {power}"
            + (f", {util:.0f}% utilization" if util is not None else "")
        )
    return "BENCHY::ENERGY::" + "; ".join(parts) if parts else None


def mean_throughputs(tests: Mapping[str, TrialSeries]) -> Sequence[float | None]:
    """(IO, SYNTHETIC, FULL) means, None for a test that did not run."""
    return tuple(tests[name].mean if name in tests else None for name in TEST_NAMES)
