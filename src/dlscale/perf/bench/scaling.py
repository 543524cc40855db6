"""Weak and strong scaling from ``dlscale bench`` JSON records taken at several GPU counts.

One bench run per GPU count N (as a cluster user submits them) gives FULL trial throughputs in global
samples/s. Per N, with B the smallest N measured with gradient sync (or without it, if all runs are
``--noddp``) and T(N) the mean FULL throughput:

* ideal(N) = T(B) / B x N: the smallest run's throughput per GPU, multiplied out without any loss;
* efficiency(N) = T(N) / ideal(N); speed-up(N) = T(N) / T(B) (its ideal is N / B);
* communication overhead(N) = 1 - T_ddp(N) / T_noddp(N), from runs with and without ``--noddp`` at N:
  the share of throughput the gradient all-reduce costs.

Weak scaling keeps the local batch (the global batch grows with N); strong scaling keeps the global batch (the
local batch shrinks). The formulas are the same; the mode is read from the records' batch sizes, checked, and
named in the outputs. Several records for one (N, noddp) are pooled: mean, std and the 95 % interval of the
mean over all their trials (:mod:`dlscale.perf.bench.intervals`, as the bench and the tuner use); speed-up and
efficiency carry the interval of the ratio T(N) / T(B) (Welch's on the logarithms, so never negative; scaled by
B / N for the efficiency), so a "90 % efficient" that two noisy trials cannot support reads as such.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dlscale.errors import DlscaleError
from dlscale.perf.bench.intervals import compare_throughputs, mean_interval
from dlscale.runtime.atomic_files import write_text_atomically
from dlscale.runtime.strict_json import to_json

log = logging.getLogger("dlscale.scaling")

SCALING_KIND = "dlscale-scaling"  # marks our own scaling.json, so a rerun over the same folder skips it
if TYPE_CHECKING:
    from matplotlib.figure import Figure

# The --mode option takes these; matplotlib is imported only to draw, so `dlscale --help` can read them cheaply.
MODES = ("auto", "weak", "strong")


class ScalingInputError(DlscaleError):
    """A results file cannot be used, or the records do not form one scaling study."""


@dataclass(frozen=True)
class BenchRun:
    """What one bench record says about scaling."""

    path: Path
    world_size: int
    noddp: bool
    full_trials: tuple[float, ...]  # FULL trial throughputs, global samples/s
    local_batch: int | None  # None: a plain benchy record, without dlscale's batch fields
    global_batch: int | None
    setup: dict[str, Any]  # config, device and knobs (noddp aside): what must match across runs


def read_bench_run(path: Path) -> BenchRun | None:
    """The run in ``path``; None (with a warning) for JSON that is not a bench record."""
    try:
        document = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ScalingInputError(f"{path}: cannot read it as JSON ({exc})") from None
    if isinstance(document, dict) and document.get("kind") == SCALING_KIND:
        log.info("skipping %s: a scaling summary, not a bench record", path)
        return None
    if not isinstance(document, dict) or not ("nranks" in document or "FULL" in document):
        log.warning("skipping %s: not a bench record (no 'nranks' or 'FULL' key)", path)
        return None
    nranks = document.get("nranks")
    if not isinstance(nranks, int) or isinstance(nranks, bool) or nranks < 1:
        raise ScalingInputError(f"{path}: bench record with 'nranks' {nranks!r}, expected an integer >= 1")
    full = document.get("FULL")
    trials = full.get("trial_throughput") if isinstance(full, dict) else None
    if not trials:
        raise ScalingInputError(f"{path}: bench record without FULL results; rerun with bench.run_full=true")
    if not all(isinstance(x, int | float) and math.isfinite(x) and x > 0 for x in trials):
        raise ScalingInputError(f"{path}: FULL trial_throughput must hold positive numbers, got {trials!r}")
    trials = tuple(map(float, trials))
    batch = document.get("batch") or {}
    knobs = dict(document.get("knobs") or {})
    noddp = bool(knobs.pop("noddp", False))  # records from before the noddp knob all synced gradients
    config = document.get("config") or {}
    setup = {"config": config.get("name"), "device": document.get("device"), "knobs": knobs}
    return BenchRun(Path(path), nranks, noddp, trials, batch.get("local"), batch.get("global"), setup)


def find_result_files(paths: Iterable[Path]) -> list[Path]:
    """The files given, and every ``*.json`` under the directories given (each file once, in order)."""
    found: dict[Path, None] = {}
    for path in map(Path, paths):
        if path.is_dir():
            found.update(dict.fromkeys(sorted(path.rglob("*.json"))))
        elif path.is_file():
            found[path] = None
        else:
            raise ScalingInputError(f"{path}: no such file or directory")
    return list(found)


def load_bench_runs(paths: Iterable[Path]) -> list[BenchRun]:
    """The bench runs in the files and directories given; an error if there are none."""
    files = find_result_files(paths)
    runs = [run for run in map(read_bench_run, files) if run is not None]
    if not runs:
        raise ScalingInputError(f"no bench records among {len(files)} JSON file(s) in the paths given")
    return runs


def detect_mode(runs: Sequence[BenchRun], mode: str = "auto") -> tuple[str, list[str]]:
    """'weak' or 'strong' from the batch sizes (or ``mode`` when forced), and notes about the choice."""
    if mode not in MODES:
        raise ScalingInputError(f"--mode {mode!r}: expected one of {', '.join(MODES)}")
    listing = ", ".join(
        f"{r.path.name}: {r.world_size} GPU(s) local {r.local_batch} global {r.global_batch}" for r in runs
    )
    locals_, globals_ = {r.local_batch for r in runs}, {r.global_batch for r in runs}
    # Weak scaling holds the local batch constant, strong scaling the global one.
    fits = {kind: len(s) == 1 and None not in s for kind, s in (("weak", locals_), ("strong", globals_))}
    if mode != "auto":
        notes = [] if fits[mode] else [f"--mode {mode} forced, but the batch sizes do not fit it ({listing})"]
        return mode, notes
    if None in locals_ | globals_:
        raise ScalingInputError(f"records without batch sizes ({listing}): pass --mode weak or --mode strong")
    if fits["weak"] or len({r.world_size for r in runs}) == 1:  # at one GPU count, weak and strong coincide
        return "weak", []
    if fits["strong"]:
        return "strong", []
    raise ScalingInputError(
        f"neither the local batch (weak scaling) nor the global batch (strong scaling) is the same in all "
        f"records ({listing}): split the files by study, or pass --mode to force one"
    )


def check_same_setup(runs: Sequence[BenchRun], allow_mixed: bool = False) -> list[str]:
    """Refuse runs of different configs, devices or knobs (unless allowed: then a note says what differs)."""
    differences = []
    for key in ("config", "device", "knobs"):
        first_file: dict[str, Path] = {}
        for run in runs:
            first_file.setdefault(json.dumps(run.setup[key], sort_keys=True), run.path)
        if len(first_file) > 1:
            differences.append(f"{key}: " + "; ".join(f"{v} ({p})" for v, p in first_file.items()))
    if differences and not allow_mixed:
        differ = " | ".join(differences)
        raise ScalingInputError(
            f"records of different setups do not compare ({differ}); --allow-mixed combines them"
        )
    return [f"mixed setups allowed: {d}" for d in differences]


@dataclass
class Series:
    """Pooled FULL trials of the runs at one (GPU count, noddp)."""

    mean: float
    std: float  # population std over all trials of all runs: run-to-run spread included
    runs: int
    trials: list[float] = field(default_factory=list)  # every FULL trial's global samples/s
    low: float = -math.inf  # the 95 % interval of the mean (infinite with one trial)
    high: float = math.inf

    @classmethod
    def pool(cls, runs: Sequence[BenchRun]) -> Series | None:
        trials = [x for run in runs for x in run.full_trials]
        if not trials:
            return None
        interval = mean_interval(trials)
        return cls(
            statistics.fmean(trials),
            statistics.pstdev(trials),
            len(runs),
            trials,
            interval.low,
            interval.high,
        )

    def describe(self) -> str:
        """'1101.5 +- 383.7 (95% CI, 3 trials)' or '927.6 (1 trial: no interval)'."""
        return mean_interval(self.trials).describe(unit="")


@dataclass
class ScalingPoint:
    """One GPU count: measured and ideal throughput and what they imply."""

    gpus: int
    local_batch: int | None
    global_batch: int | None
    ddp: Series | None
    noddp: Series | None
    ideal: float
    speedup: float | None = None
    efficiency: float | None = None
    # 95 % intervals of speed-up and efficiency (of T(N) / T(B), on the logarithms); unbounded with single trials
    speedup_interval: tuple[float, float] | None = None
    efficiency_interval: tuple[float, float] | None = None
    noddp_efficiency: float | None = None
    comm_overhead: float | None = None  # 1 - ddp / noddp throughput


@dataclass
class ScalingStudy:
    """The points of one weak or strong scaling study, with its title and notes."""

    mode: str
    config: str
    device: str
    baseline_gpus: int
    points: list[ScalingPoint]
    notes: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    @property
    def title(self) -> str:
        return f"{self.mode} scaling: {self.config} on {self.device}"


def analyse_scaling(runs: Sequence[BenchRun], mode: str = "auto", allow_mixed: bool = False) -> ScalingStudy:
    """Group the runs by GPU count and compute ideal throughput, efficiency, speed-up and overhead."""
    notes = check_same_setup(runs, allow_mixed)
    mode, mode_notes = detect_mode(runs, mode)
    notes += mode_notes
    by_key: dict[tuple[int, bool], list[BenchRun]] = {}
    for run in runs:
        by_key.setdefault((run.world_size, run.noddp), []).append(run)
    for (gpus, noddp), group in sorted(by_key.items()):
        if len(group) > 1:
            files = ", ".join(str(r.path) for r in group)
            notes.append(f"{gpus} GPU(s) {'noddp' if noddp else 'ddp'}: averaged {len(group)} runs ({files})")
    counts = sorted({run.world_size for run in runs})
    if len(counts) == 1:
        notes.append(f"only {counts[0]} GPU(s) measured: scaling needs bench runs at several GPU counts")
    # The baseline is the synced series when there is one: the ideal line is what DDP could reach at best.
    baseline_noddp = all(run.noddp for run in runs)
    baseline_gpus = min(run.world_size for run in runs if run.noddp == baseline_noddp)
    baseline = Series.pool(by_key[(baseline_gpus, baseline_noddp)])
    if baseline_noddp:
        notes.append("only --noddp runs: the ideal line comes from compute-only throughput")
    per_gpu = baseline.mean / baseline_gpus
    points = []
    for gpus in counts:
        first = next(run for run in runs if run.world_size == gpus)
        ddp, noddp = (Series.pool(by_key.get((gpus, flag), [])) for flag in (False, True))
        point = ScalingPoint(gpus, first.local_batch, first.global_batch, ddp, noddp, per_gpu * gpus)
        if point.ddp is not None:
            point.speedup = point.ddp.mean / baseline.mean
            point.efficiency = point.ddp.mean / point.ideal
            ratio = compare_throughputs(point.ddp.trials, baseline.trials)
            point.speedup_interval = (ratio.low, ratio.high)
            point.efficiency_interval = (ratio.low * baseline_gpus / gpus, ratio.high * baseline_gpus / gpus)
        if point.noddp is not None:
            point.noddp_efficiency = point.noddp.mean / point.ideal
            # One rank has nothing to communicate: a difference there is noise, not an overhead.
            if point.ddp is not None and gpus > 1:
                point.comm_overhead = 1 - point.ddp.mean / point.noddp.mean
        points.append(point)
    # Named once each, in order of appearance: one name unless --allow-mixed let several in.
    config, device = (
        " / ".join(dict.fromkeys(str(r.setup[key]) for r in runs)) for key in ("config", "device")
    )
    return ScalingStudy(mode, config, device, baseline_gpus, points, notes, [str(r.path) for r in runs])


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def _rate(series: Series | None) -> str:
    return "-" if series is None else series.describe()


def _with_interval(value: float | None, interval: tuple[float, float] | None, pattern: str) -> str:
    """'59.4% (40.1% to 78.7%)'; the value alone where the interval is unknown or unbounded."""
    if value is None:
        return "-"
    if interval is None or not all(map(math.isfinite, interval)):
        return pattern.format(value)
    return f"{pattern.format(value)} ({pattern.format(interval[0])} to {pattern.format(interval[1])})"


def rank_word(device: str) -> str:
    """What one rank is on ``device`` ("cpu (2 threads)", "NVIDIA H100 ..."): a GPU, or a CPU process."""
    return "processes" if device.lower().startswith("cpu") else "GPUs"


def scaling_table(study: ScalingStudy) -> list[str]:
    """A Markdown table, one row per GPU count; the noddp columns only when noddp runs exist."""
    with_noddp = any(p.noddp is not None for p in study.points)
    header = [rank_word(study.device), "local batch", "global batch", "runs", "samples/s (95% CI)"]
    header += ["ideal samples/s", "speed-up (95% CI)", "efficiency (95% CI)"]
    if with_noddp:
        header += ["noddp samples/s", "noddp efficiency", "comm. overhead"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---:|" * len(header)]
    for p in study.points:
        runs = str(p.ddp.runs if p.ddp else 0) + (f" + {p.noddp.runs} noddp" if p.noddp else "")
        cells = [str(p.gpus), _fmt(p.local_batch, "{}"), _fmt(p.global_batch, "{}"), runs, _rate(p.ddp)]
        cells += [
            f"{p.ideal:.1f}",
            _with_interval(p.speedup, p.speedup_interval, "{:.2f}x"),
            _with_interval(p.efficiency, p.efficiency_interval, "{:.1%}"),
        ]
        if with_noddp:
            cells += [_rate(p.noddp), _fmt(p.noddp_efficiency, "{:.1%}"), _fmt(p.comm_overhead, "{:.1%}")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def log_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` ticks spread evenly on a log axis from ``low`` to ``high``, each rounded to 2 significant
    digits (so they read as numbers, not powers of two), in order and distinct."""
    if not 0 < low < high:
        return [high] if high > 0 else []
    ratio = (high / low) ** (1 / (count - 1))
    ticks = []
    for index in range(count):
        value = low * ratio**index
        step = 10 ** (math.floor(math.log10(value)) - 1)  # one unit of the second significant digit
        rounded = round(value / step) * step
        # The ends are rounded inwards, so that they stay on the axis.
        if rounded < low:
            rounded += step
        if rounded > high:
            rounded -= step
        rounded = float(f"{rounded:.2g}")
        if low <= rounded <= high and rounded not in ticks:
            ticks.append(rounded)
    return ticks


def scaling_figure(study: ScalingStudy) -> Figure:
    """Throughput vs GPUs (real, ideal, noddp) and efficiency vs GPUs, side by side on log2 x-axes."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter

    figure = Figure(figsize=(10, 4), layout="constrained")
    rate_axis, efficiency_axis = figure.add_subplot(1, 2, 1), figure.add_subplot(1, 2, 2)
    gpus = [p.gpus for p in study.points]
    rate_axis.plot(gpus, [p.ideal for p in study.points], "k--", label="ideal")
    for name, marker in (("ddp", "o-"), ("noddp", "s-")):
        shown = [p for p in study.points if getattr(p, name) is not None]
        xs, series = [p.gpus for p in shown], [getattr(p, name) for p in shown]
        efficiency = [p.efficiency if name == "ddp" else p.noddp_efficiency for p in shown]
        if shown:
            rate_axis.errorbar(
                xs, [s.mean for s in series], _error_bars(series), fmt=marker, capsize=3, label=name
            )
            if name == "ddp":
                bounds = [p.efficiency_interval for p in shown]
                efficiency_axis.errorbar(
                    xs,
                    [100 * e for e in efficiency],
                    _error_bars_of(efficiency, bounds, 100),
                    fmt=marker,
                    capsize=3,
                    label=name,
                )
            else:
                efficiency_axis.plot(xs, [100 * e for e in efficiency], marker, label=name)
    efficiency_axis.axhline(100, color="k", linestyle="--", label="ideal")
    for axis in (rate_axis, efficiency_axis):
        axis.set_xscale("log", base=2)
        # Margins in log space: with one GPU count the axis would otherwise collapse to a point.
        axis.set_xlim(min(gpus) / 1.4, max(gpus) * 1.4)
        axis.set_xticks(gpus, [str(n) for n in gpus])
        axis.set_xlabel(rank_word(study.device))
        axis.legend(fontsize=8)
    rate_axis.set_yscale("log", base=2)  # with both axes logarithmic, ideal scaling is a straight line
    low, high = rate_axis.get_ylim()
    # A study within one power of two would get a single power-of-two tick: place readable ones instead.
    rate_axis.set_yticks(log_ticks(low, high), [f"{t:,.4g}" for t in log_ticks(low, high)])
    rate_axis.yaxis.set_minor_formatter(NullFormatter())
    rate_axis.set_ylabel("FULL global samples/s (error bar: 95% CI)", fontsize=9)
    efficiency_axis.set_ylabel("scaling efficiency (%) (error bar: 95% CI)", fontsize=9)
    top = max([110.0] + [100 * (p.efficiency or p.noddp_efficiency or 0) + 5 for p in study.points])
    efficiency_axis.set_ylim(0, top)
    figure.suptitle(study.title, fontsize=10)
    return figure


def _error_bars(series: Sequence[Series]) -> list[list[float]]:
    """Below- and above-the-mean lengths of each series' 95 % interval (none with one trial), kept above 0 for
    the log axis."""
    return _error_bars_of([s.mean for s in series], [(s.low, s.high) for s in series], 1.0)


def _error_bars_of(
    values: Sequence[float | None], intervals: Sequence[tuple[float, float] | None], scale: float
) -> list[list[float]]:
    below, above = [], []
    for value, interval in zip(values, intervals, strict=True):
        finite = value is not None and interval is not None and all(map(math.isfinite, interval))
        low, high = interval if finite else (value, value)
        below.append(scale * (value - max(low, 0.02 * value)) if value else 0.0)
        above.append(scale * (high - value) if value else 0.0)
    return [below, above]


def write_scaling_outputs(study: ScalingStudy, out_dir: Path) -> dict[str, Path]:
    """``scaling.md`` (table and notes), ``scaling.json`` (all numbers) and ``scaling.png`` in ``out_dir``."""
    out_dir = Path(out_dir)
    paths = {name: out_dir / f"scaling.{name}" for name in ("md", "json", "png")}
    table = scaling_table(study)
    notes = "".join(f"- {note}\n" for note in study.notes)
    write_text_atomically(
        paths["md"], f"# {study.title}\n\n" + "\n".join(table) + "\n" + (notes and f"\n{notes}")
    )
    date = datetime.now().astimezone().isoformat(timespec="seconds")
    document = {"kind": SCALING_KIND, **asdict(study), "title": study.title, "table": table, "date": date}
    write_text_atomically(paths["json"], to_json(document))
    figure = scaling_figure(study)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)  # the Agg canvas draws without a display (and without pyplot's global state)
    figure.savefig(paths["png"], dpi=110, format="png")
    return paths
