"""The torch profiler over a window of steps, and per-line timings of the training step and loop.

Both read where to write (run directory, rank) and what to profile from the trainer at ``on_train_start``, so
they can be built before the run is.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
from torch.profiler import ProfilerActivity

from dlscale.errors import ConfigError
from dlscale.perf.profile.trace_summary import TraceSummary, summarize_trace
from dlscale.runtime.atomic_files import write_text_atomically
from dlscale.runtime.strict_json import to_json
from dlscale.training.observer import Observer

if TYPE_CHECKING:
    from dlscale.training.observer import TrainerView

log = logging.getLogger("dlscale.profile")


class TorchProfilerObserver(Observer):
    """Records ``active`` steps with ``torch.profiler`` after skipping ``wait`` and warming up over ``warmup``
    steps (counted from where this process starts training), then writes
    ``<run_dir>/profiler/rank<R>.<unix ms>.pt.trace.json`` and logs the top operators.

    The trace opens in https://ui.perfetto.dev, chrome://tracing, or TensorBoard's profile plugin with
    ``--logdir <run_dir>/profiler``. Profiler steps are named ``ProfilerStep#<n>``: ``n`` counts steps from
    this process's first one, so the recorded steps are ``wait + warmup`` to ``wait + warmup + active - 1``;
    each runs from the start of its training step to the start of the next one. The profiler is stopped as
    soon as its window is written, so the rest of the run pays nothing for it. Beside the trace goes its
    summary (:mod:`dlscale.perf.profile.trace_summary`): GPU time by kind of kernel, the idle share, the top
    kernels and the host syncs of each recorded step, also logged.
    """

    def __init__(self, wait: int = 1, warmup: int = 1, active: int = 3, top_operators: int = 15):
        if wait < 0 or warmup < 0 or active < 1:
            raise ValueError(f"need wait >= 0, warmup >= 0, active >= 1; got {wait}, {warmup}, {active}")
        self.wait, self.warmup, self.active = wait, warmup, active
        self.top_operators = top_operators
        self.trace_path: Path | None = None  # set once the trace is written
        self.top_table: str | None = None
        self.summary: TraceSummary | None = None  # GPU time shares and host syncs of the window
        self.summary_path: Path | None = None
        self._profiler: torch.profiler.profile | None = None
        self._session = contextlib.ExitStack()
        self._directory = Path()
        self._rank = 0
        self._on_gpu = False
        self._first_global_step = 0

    def on_train_start(self, trainer: TrainerView) -> None:
        setup, progress = trainer.setup, trainer.progress
        self._directory = Path(setup.run_dir) / "profiler"
        self._rank = setup.process.rank
        self._on_gpu = setup.device.is_gpu
        self._first_global_step = progress.global_step
        activities = [ProfilerActivity.CPU]
        if self._on_gpu:
            activities.append(ProfilerActivity.CUDA)
        self._profiler = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(
                wait=self.wait, warmup=self.warmup, active=self.active, repeat=1
            ),
            on_trace_ready=self._write_trace,
            record_shapes=True,
            profile_memory=True,  # allocation events: cheap next to the tracing itself, and shows peaks
        )
        # Entered as a context (not just start()), so leaving it also runs the profiler's own cleanup.
        self._session.enter_context(self._profiler)
        first = self._first_global_step + self.wait + self.warmup
        log.info(
            "Torch profiler: records global steps %d to %d (wait %d, warm-up %d, active %d) into %s",
            first,
            first + self.active - 1,
            self.wait,
            self.warmup,
            self.active,
            self._directory,
        )
        steps_left = setup.plan.total_steps - progress.global_step
        if steps_left < self.wait + self.warmup + self.active:
            log.warning(
                "Torch profiler: only %d step(s) left to train, fewer than wait + warm-up + active = %d; "
                "the trace will be short or missing (lower profile.torch_profiler_wait/warmup)",
                steps_left,
                self.wait + self.warmup + self.active,
            )

    def on_step_start(self, trainer: TrainerView) -> None:
        # A profiler step runs from the start of one training step to the start of the next, so it holds all the
        # host work the loop does for that step after its observers ran (the divergence guard's check, logging;
        # validation and the checkpoint after an epoch's last step): the host syncs it counts are that step's.
        if self._profiler is None or trainer.progress.global_step == self._first_global_step:
            return
        self._profiler.step()  # writes the trace (via _write_trace) once the window's last step is over
        if self.trace_path is not None:
            self._stop()  # frees the recorded events; the rest of the run is not profiled

    def on_train_end(self, trainer: TrainerView, outcome: str) -> None:
        if self._profiler is not None:
            self._stop()  # a run stopped inside the window still writes the steps it recorded
        if self.trace_path is None:
            log.warning("Torch profiler: the run ended before the profiler recorded a step; no trace written")

    def _stop(self) -> None:
        self._session.close()
        self._profiler = None

    def _write_trace(self, profiler: torch.profiler.profile) -> None:
        """``on_trace_ready``: export the Chrome/Perfetto trace and log the busiest operators."""
        self._directory.mkdir(parents=True, exist_ok=True)
        # <worker>.<timestamp>.pt.trace.json is what tensorboard_trace_handler writes and TensorBoard's
        # profile plugin expects; the rank as worker name keeps the files of several ranks apart.
        path = self._directory / f"rank{self._rank}.{time.time_ns() // 1_000_000}.pt.trace.json"
        profiler.export_chrome_trace(str(path))
        self.trace_path = path
        # Recorded steps: from the end of warm-up to the last completed one (step_num counts them all).
        first = self.wait + self.warmup
        recorded = max(profiler.step_num - first, 0)
        sort_by = "self_device_time_total" if self._on_gpu else "self_cpu_time_total"
        self.top_table = profiler.key_averages().table(sort_by=sort_by, row_limit=self.top_operators)
        self.summary = self._summarize(path)
        log.info(
            "Torch profiler trace of %d step(s) (global steps %d to %d): %s\n"
            "  open it in https://ui.perfetto.dev or with tensorboard --logdir %s\n"
            "Top operators (at most %d) by self %s time:\n%s",
            recorded,
            self._first_global_step + first,
            self._first_global_step + first + recorded - 1,
            path,
            self._directory,
            self.top_operators,
            "GPU" if self._on_gpu else "CPU",
            self.top_table,
        )
        if self.summary is not None:
            for line in self.summary.lines():
                log.info("%s", line)

    def _summarize(self, trace: Path) -> TraceSummary | None:
        """The trace's GPU time shares, top kernels and host syncs per step, also written beside it as
        ``<trace>.summary.json`` (a few kB to keep or send where the trace, tens of MB, is too big)."""
        try:
            summary = summarize_trace(json.loads(trace.read_text()), first_step=self._first_global_step)
        except (OSError, ValueError, KeyError, TypeError) as exc:  # a summary must never fail the run
            log.warning("Torch profiler: could not summarize the trace %s: %s", trace, exc)
            return None
        self.summary_path = trace.with_name(trace.name.removesuffix(".json") + ".summary.json")
        write_text_atomically(self.summary_path, to_json(summary.to_json()))
        return summary


def require_line_profiler() -> ModuleType:
    """The ``line_profiler`` module, or a ConfigError saying how to install it."""
    try:
        import line_profiler
    except ImportError:
        raise ConfigError(
            "profile.line_profile needs the line_profiler package: pip install line_profiler "
            "(or pip install 'dlscale[profile]')"
        ) from None
    return line_profiler


def _python_function(candidate: Any) -> Callable[..., Any] | None:
    """The Python function behind ``candidate`` (a function, or an object whose class defines ``__call__``),
    or None when there is no Python source to time line by line (e.g. a builtin)."""
    if inspect.isfunction(candidate):
        return candidate
    call = getattr(type(candidate), "__call__", None)  # noqa: B004 - the class's method, not callable()
    return call if inspect.isfunction(call) else None


class LineProfileObserver(Observer):
    """Per-line timings of the training step (``TrainStep.__call__``) and of the epoch loop
    (``Trainer._train_epoch``: its ``for`` line is the wait for data), from train start to train end.

    At the end the table (time and % time per line, as ``python -m line_profiler -rmt`` prints it) goes to
    the log and to ``<run_dir>/line_profile.txt`` (``line_profile_rank<R>.txt`` on other ranks), and the raw
    timings to ``line_profile.lprof`` next to it, for ``python -m line_profiler -rmt``.
    """

    def __init__(self, extra_functions: Sequence[Callable[..., Any]] = (), output_unit: float = 1e-6):
        self._module = require_line_profiler()
        self.extra_functions = tuple(extra_functions)
        self.output_unit = output_unit  # seconds per printed time unit (kernprof's default: microseconds)
        self.table_path: Path | None = None
        self.table: str | None = None
        self._profiler: Any = None

    def on_train_start(self, trainer: TrainerView) -> None:
        setup = trainer.setup
        name = "line_profile" if setup.process.rank == 0 else f"line_profile_rank{setup.process.rank}"
        self.table_path = Path(setup.run_dir) / f"{name}.txt"
        profiler = self._module.LineProfiler()
        functions = [_python_function(setup.step), type(trainer)._train_epoch, *self.extra_functions]
        for function in functions:
            if function is not None:
                profiler.add_function(function)
        # Timing every line is slow (microseconds per line), so the run's speed numbers are not comparable
        # with unprofiled runs; the shares between lines are what this table is for.
        profiler.enable_by_count()
        self._profiler = profiler
        log.info("Line profiler on: the per-line table is written to %s at the end", self.table_path)

    def on_train_end(self, trainer: TrainerView, outcome: str) -> None:
        if self._profiler is None or self.table_path is None:
            return
        self._profiler.disable_by_count()
        buffer = io.StringIO()
        self._profiler.print_stats(stream=buffer, output_unit=self.output_unit, summarize=True, sort=True)
        self.table = buffer.getvalue()
        write_text_atomically(self.table_path, self.table)
        self._profiler.dump_stats(str(self.table_path.with_suffix(".lprof")))
        self._profiler = None
        log.info("Line profile (%s; also in %s):\n%s", outcome, self.table_path, self.table)
