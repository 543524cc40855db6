"""The climb: measure, read the verdict, try the knobs it names, keep what is faster beyond the noise.

Starting from the config as it is:

1. measure the current settings (IO, SYNTHETIC and FULL trials) and read the verdict;
2. take the first knob of the verdict's group (:mod:`dlscale.tuning.knobs`) that was not decided yet, and measure
   the settings with its change;
3. keep it only when FULL's speed-up over the current settings is faster beyond the noise
   (:func:`dlscale.perf.bench.intervals.compare_throughputs`); a change that looks worthwhile but is within the
   noise is measured once more and decided on the pooled trials. A knob that changes the numerics must also
   pass the numerics check: a short training run from the same seed over the same number of samples whose loss
   stays within ``loss_tolerance`` (relative) of the *starting* settings' loss;
4. after a kept change, read the verdict of the new measurement and go on from 2; stop when the verdict's
   group has no undecided knob left, or when the next trial would not finish within the budget.

A larger batch that runs out of memory (or that the memory planner says cannot fit) is not the end of the
batch knob: the next proposal backs off halfway between the largest batch that fit and the one that did not.

The climb itself neither builds nor times anything: a :class:`TuneBackend` measures and checks (the real one
runs dlscale's bench and short training runs; tests give a fake), and every result goes through the cache
first, so a resumed tune replays its decisions from it. Under torchrun every rank climbs; ``agree`` makes rank
0's cache lookups and budget decisions everyone's, and the backend returns rank 0's measurements, so all ranks
take the same path.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from dlscale.perf.bench.intervals import SpeedComparison, compare_throughputs, mean_interval
from dlscale.tuning.cache import TuneCache, settings_key
from dlscale.tuning.knobs import BATCH_KEY, Candidate, TuneContext, apply_changes, candidates_for
from dlscale.tuning.records import Measurement, NumericsCheck

log = logging.getLogger("dlscale.tune")


class TuneBackend(Protocol):
    """Measures settings and checks their numerics (the real one: :mod:`dlscale.tuning.run_backend`)."""

    def measure(self, settings: dict[str, Any]) -> Measurement:
        """Throughput trials of ``settings``; an out-of-memory or a failed build is a status, not a raise."""
        ...

    def check_numerics(self, settings: dict[str, Any]) -> NumericsCheck:
        """A short training run of ``settings`` from the config's seed; its final validation loss."""
        ...

    def memory_problem(self, settings: dict[str, Any]) -> str | None:
        """Why ``settings`` would not fit in the device's memory by the planner's estimate (None: fits)."""
        ...


@dataclass(frozen=True)
class TuneOptions:
    """How the climb decides and how long it may take."""

    budget_s: float = 30 * 60.0  # no trial starts that would end after this (a started trial is never cut)
    loss_tolerance: float = 0.05  # a numerics-changing knob keeps the check's loss within this of the start's
    min_gain: float = 0.02  # a faster-beyond-noise change must also gain this much to be kept
    confirm: bool = True  # at the end, measure the start and the result once more and compare them pooled
    max_noise: float = (
        0.10  # a start whose 95% interval is wider than this (relative half-width) is measured again
    )
    leave_alone: tuple[str, ...] = ()  # dotted setting keys no knob may change (the user's --skip)


@dataclass
class TrialRecord:
    """One candidate and what became of it."""

    number: int
    candidate: Candidate
    settings: dict[str, Any]
    decision: str  # kept, slower, within noise, out of memory, failed, numerics, needs a GPU
    reason: str
    measurement: Measurement | None = None
    comparison: SpeedComparison | None = None
    numerics: NumericsCheck | None = None
    lr_note: str = ""

    @property
    def kept(self) -> bool:
        return self.decision == "kept"


@dataclass
class PathPoint:
    """One rung of the climb: the settings in force and their measured speed and verdict."""

    label: str  # "start" or the kept change
    settings: dict[str, Any]
    measurement: Measurement


@dataclass
class TuneResult:
    """The climb: its path, every trial, why it stopped, and the final speed-up over the start."""

    context: TuneContext
    options: TuneOptions
    path: list[PathPoint]
    trials: list[TrialRecord]
    stop_reason: str
    speedup: SpeedComparison | None = None  # the final settings over the start (pooled when confirmed)
    start_check: NumericsCheck | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def start(self) -> dict[str, Any]:
        return self.path[0].settings

    @property
    def final(self) -> dict[str, Any]:
        return self.path[-1].settings

    @property
    def changes(self) -> dict[str, Any]:
        """The settings that differ from the start's: what the tuned config writes."""
        return {k: v for k, v in self.final.items() if self.start.get(k) != v}


class BudgetSpent(Exception):
    """The next trial would end after the budget."""


class TuneFailed(Exception):
    """The starting settings cannot be measured: there is nothing to climb from."""


class Climb:
    """One tune's state; :meth:`run` climbs and returns the :class:`TuneResult`."""

    def __init__(
        self,
        backend: TuneBackend,
        context: TuneContext,
        options: TuneOptions,
        cache: TuneCache,
        clock: Callable[[], float] = time.monotonic,
        agree: Callable[[Any], Any] = lambda value: value,
        lr_note: Callable[[dict[str, Any], dict[str, Any]], str] = lambda before, after: "",
    ):
        self.backend = backend
        self.context = context
        self.options = options
        self.cache = cache
        self.clock = clock
        self.agree = agree
        self.lr_note = lr_note
        self.deadline = clock() + options.budget_s
        self.seconds_per_measure = 0.0
        self.seconds_per_check = 0.0
        self.trials: list[TrialRecord] = []
        self.start: dict[str, Any] = {}
        self.start_check: NumericsCheck | None = None

    # ------------------------------------------------------------------ cached backend calls
    def _cached(self, kind: str, settings: dict[str, Any], repeat: int, run: Callable[[], Any], record_type):
        key = settings_key(kind, settings, repeat)
        found = self.agree(self.cache.get(key))
        if found is not None:
            result = record_type.from_json(found)
        else:
            estimate = (
                self.seconds_per_measure
                if kind == "measure"
                else self.seconds_per_check or self.seconds_per_measure
            )
            if self.agree(self.clock() + estimate > self.deadline):
                raise BudgetSpent
            result = run()
            self.cache.put(key, result.to_json())
        if kind == "measure":
            self.seconds_per_measure = max(self.seconds_per_measure, result.seconds)
        else:
            self.seconds_per_check = max(self.seconds_per_check, result.seconds)
        return result

    def measure(self, settings: dict[str, Any], repeat: int = 0) -> Measurement:
        return self._cached("measure", settings, repeat, lambda: self.backend.measure(settings), Measurement)

    def check(self, settings: dict[str, Any]) -> NumericsCheck:
        return self._cached(
            "check", settings, 0, lambda: self.backend.check_numerics(settings), NumericsCheck
        )

    # ------------------------------------------------------------------ the climb
    def run(self, start: dict[str, Any]) -> TuneResult:
        """Climb from ``start``; raises TuneFailed when the start itself cannot be measured."""
        self.deadline = self.clock() + self.options.budget_s
        self.start = start
        log.info("TUNE::measuring the starting config")
        try:
            first = self.measure(start)
        except BudgetSpent:  # the start is always measured, whatever the budget says
            first = self.backend.measure(start)
            self.cache.put(settings_key("measure", start, 0), first.to_json())
            self.seconds_per_measure = max(self.seconds_per_measure, first.seconds)
        if first.status != "ok" or not first.full:
            raise TuneFailed(f"the starting config could not be measured ({first.status}): {first.message}")
        if _relative_half_width(first.full) > self.options.max_noise:
            # Every later comparison is against this one: a noisy start would make every knob "within noise".
            log.info(
                "TUNE::the start's trials scatter by more than %.0f%%; measuring it once more",
                self.options.max_noise * 100,
            )
            try:
                again = self.measure(start, repeat=1)
                if again.status == "ok" and again.full:
                    first = _pooled(first, again)
            except BudgetSpent:
                pass
        path = [PathPoint("start", start, first)]
        log.info("TUNE::start: FULL %s; %s", mean_interval(first.full).describe(), first.verdict)
        decided: set[tuple] = set()
        stop_reason = ""
        try:
            while not stop_reason:
                stop_reason = self._next_trial(path, decided)
        except BudgetSpent:
            stop_reason = (
                f"the budget ({self.options.budget_s / 60:.3g} min) would be spent by the next trial"
            )
        log.info("TUNE::stopped: %s", stop_reason)
        result = TuneResult(
            self.context, self.options, path, self.trials, stop_reason, start_check=self.start_check
        )
        result.speedup = self._final_speedup(path)
        return result

    def _next_trial(self, path: list[PathPoint], decided: set[tuple]) -> str:
        """Decide one candidate; the stop reason when none is left ("" to go on)."""
        current = path[-1]
        context = replace(self.context, batch_ceiling=self._batch_ceiling(current.settings))
        pending = [
            c
            for c in candidates_for(current.measurement.verdict, current.settings, context)
            if c.changes not in decided and not any(key in self.options.leave_alone for key, _ in c.changes)
        ]
        if not pending:
            return f"no knob for '{current.measurement.verdict}' is left to try"
        candidate = pending[0]
        decided.add(candidate.changes)
        settings = apply_changes(current.settings, candidate.changes)
        number = len(self.trials) + 1
        spent = (self.clock() - self.deadline + self.options.budget_s) / 60
        log.info(
            "TUNE::trial %d (%.1f of %.3g min spent): %s (%s; %s)",
            number,
            spent,
            self.options.budget_s / 60,
            candidate.label,
            candidate.knob,
            candidate.why,
        )
        record = self._decide(number, candidate, settings, current)
        self.trials.append(record)
        log.info("TUNE::trial %d: %s: %s", number, record.decision, record.reason)
        if record.kept:
            path.append(PathPoint(candidate.label, settings, record.measurement))
        return ""

    def _batch_ceiling(self, settings: dict[str, Any]) -> int | None:
        """The smallest local batch that did not fit, among the trials so far (None: none failed)."""
        failed = [
            t.settings[BATCH_KEY]
            for t in self.trials
            if t.decision == "out of memory" and t.settings[BATCH_KEY] > settings[BATCH_KEY]
        ]
        return min(failed) if failed else None

    def _decide(
        self, number: int, candidate: Candidate, settings: dict[str, Any], current: PathPoint
    ) -> TrialRecord:
        def record(decision: str, reason: str, **found: Any) -> TrialRecord:
            return TrialRecord(number, candidate, settings, decision, reason, **found)

        if candidate.skip:
            return record(
                candidate.skip,
                f"{candidate.skip} (this run is on {'a GPU' if self.context.on_gpu else 'the CPU'})",
            )
        lr_note = self.lr_note(current.settings, settings) if BATCH_KEY in dict(candidate.changes) else ""
        if BATCH_KEY in dict(candidate.changes):
            problem = self.agree(self.backend.memory_problem(settings))
            if problem:
                return record(
                    "out of memory", f"by the memory planner's estimate: {problem}", lr_note=lr_note
                )
        measurement = self.measure(settings)
        if measurement.status != "ok" or not measurement.full:
            # An "ok" measurement without FULL trials cannot be compared: a failure, not a decision named "ok".
            decision = measurement.status if measurement.status != "ok" else "failed"
            return record(decision, measurement.message or "no FULL trials", measurement=measurement)
        comparison = compare_throughputs(measurement.full, current.measurement.full, self.options.min_gain)
        if comparison.could_gain:
            log.info("TUNE::trial %d: %s; measuring once more", number, comparison.describe())
            again = self.measure(settings, repeat=1)
            if again.status == "ok" and again.full:
                measurement = _pooled(measurement, again)
                comparison = compare_throughputs(
                    measurement.full, current.measurement.full, self.options.min_gain
                )
        found = {"measurement": measurement, "comparison": comparison, "lr_note": lr_note}
        if comparison.outcome != "faster":
            return record(comparison.outcome, f"FULL {comparison.describe()}", **found)
        if candidate.numerics:
            verdict = self._numerics_verdict(settings)
            found["numerics"] = verdict[1]
            if verdict[0]:
                return record(verdict[0], verdict[2], **found)
        note = f"; {lr_note}" if lr_note else ""
        return record("kept", f"FULL {comparison.describe()}{note}", **found)

    def _numerics_verdict(self, settings: dict[str, Any]) -> tuple[str, NumericsCheck, str]:
        """("", check, "") when the check's loss is within the tolerance of the start's, else the rejection."""
        if self.start_check is None:
            self.start_check = self.check(self.start)
        start = self.start_check
        check = self.check(settings)
        if start.status != "ok" or start.loss is None:
            return "failed", check, f"the starting config's numerics check failed: {start.message}"
        if check.status != "ok" or check.loss is None or not math.isfinite(check.loss):
            return "numerics", check, f"the numerics check failed: {check.message or f'loss {check.loss}'}"
        if start.loss:
            change = (check.loss - start.loss) / abs(start.loss)
        else:  # a loss of exactly 0 at the start: only another 0 is the same
            change = 0.0 if check.loss == 0 else math.inf
        text = (
            f"validation loss after {check.steps} steps {check.loss:.5g} vs {start.loss:.5g} at the start "
            f"({change:+.1%}; tolerance {self.options.loss_tolerance:.0%})"
        )
        if abs(change) > self.options.loss_tolerance:
            return "numerics", check, text
        return "", check, text

    def _final_speedup(self, path: list[PathPoint]) -> SpeedComparison | None:
        first, last = path[0], path[-1]
        if len(path) == 1:
            return None
        start_trials, final_trials = list(first.measurement.full), list(last.measurement.full)
        if self.options.confirm:
            # Fresh builds of both, after the climb: drift over the climb (a node warming up, a neighbour's job)
            # would otherwise count as speed-up.
            try:
                again_start = self.measure(first.settings, repeat=2)
                again_final = self.measure(last.settings, repeat=2)
                if again_start.status == "ok" and again_final.status == "ok":
                    start_trials += again_start.full
                    final_trials += again_final.full
            except BudgetSpent:
                log.info("TUNE::no budget left to confirm the speed-up with fresh trials")
        return compare_throughputs(final_trials, start_trials, self.options.min_gain)


def _relative_half_width(trials: list[float]) -> float:
    interval = mean_interval(trials)
    return interval.half_width / interval.mean if interval.mean > 0 else math.inf


def _pooled(first: Measurement, second: Measurement) -> Measurement:
    """Both measurements' trials together (the verdict and memory of the first)."""
    throughputs = {
        name: first.throughputs.get(name, []) + second.throughputs.get(name, []) for name in first.throughputs
    }
    return replace(first, throughputs=throughputs, seconds=first.seconds + second.seconds)
