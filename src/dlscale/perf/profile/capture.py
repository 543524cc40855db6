"""Profiling a run: the NVTX/nsys capture window, the nsys command line, and :func:`build_profiling`.

``profile.enable_manual_profiling`` marks the step's parts with NVTX ranges and starts the CUDA profiler over
one window of steps (as the NERSC tutorial does for its 4th epoch), so ``nsys profile -c cudaProfilerApi``
records only that window. The torch profiler and the line profiler live in :mod:`dlscale.perf.profile.profilers`.
"""

from __future__ import annotations

import logging
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dlscale.errors import ConfigError
from dlscale.perf.profile.config import ProfileConfig
from dlscale.perf.profile.profilers import LineProfileObserver, TorchProfilerObserver, require_line_profiler
from dlscale.runtime import nvtx
from dlscale.runtime.nvtx import StepMarkers, build_markers
from dlscale.training.observer import Observer

if TYPE_CHECKING:
    from dlscale.runtime.device import Device
    from dlscale.training.observer import TrainerView
    from dlscale.training.schedule import EpochPlan

__all__ = [
    "CudaProfilerWindow",
    "LineProfileObserver",
    "TorchProfilerObserver",
    "build_profiling",
    "nsys_command",
    "nsys_hint_lines",
]

log = logging.getLogger("dlscale.profile")

# What nsys traces: CUDA API and kernels, our NVTX ranges, OS runtime calls (data loading stalls show up as
# waits) and the cuDNN/cuBLAS calls behind the model's layers.
NSYS_TRACE = "cuda,nvtx,osrt,cudnn,cublas"


def typed_command(argv: Sequence[str] | None = None) -> list[str]:
    """The command line that started this process (``sys.argv`` by default), runnable again as it is.

    ``python -m dlscale`` leaves the path of ``dlscale/__main__.py`` in ``argv[0]``; running that file directly
    would not work, so it becomes ``<this python> -m dlscale`` again.
    """
    words = list(sys.argv if argv is None else argv)
    if words and Path(words[0]).name == "__main__.py":
        return [sys.executable, "-m", "dlscale", *words[1:]]
    return words


def nsys_profile_words(report: Path) -> list[str]:
    """``nsys profile`` and its options, writing ``<report>.nsys-rep``.

    ``-c cudaProfilerApi`` records only between the run's ``cudaProfilerStart``/``Stop`` calls, and
    ``--capture-range-end=stop`` lets training go on after the window (the default, ``stop-shutdown``, would
    end the program there).
    """
    return [
        "nsys",
        "profile",
        "-c",
        "cudaProfilerApi",
        "--capture-range-end=stop",
        "-t",
        NSYS_TRACE,
        "-o",
        str(report),
        "--force-overwrite",
        "true",
    ]


def fresh_run_num(run_dir: Path) -> str:
    """A run_num for the nsys run that no run of this config uses yet: ``<run_num>-nsys`` (``-nsys2``, ...).

    The run directory is ``<expdir>/<config>/<run_num>``, so its siblings are the config's other runs.
    """
    run_dir = Path(run_dir)
    candidate, number = f"{run_dir.name}-nsys", 1
    while (run_dir.parent / candidate).exists():
        number += 1
        candidate = f"{run_dir.name}-nsys{number}"
    return candidate


def _program_length(words: Sequence[str]) -> int | None:
    """How many words name the program when ``words`` is the ``dlscale`` command, else None."""
    if words and Path(words[0]).name == "dlscale":
        return 1
    if len(words) >= 3 and list(words[1:3]) == ["-m", "dlscale"]:
        return 3
    return None


def _is_run_num_override(text: str) -> bool:
    return text.partition("=")[0] in ("run_num", "log.run_num")


def _without_run_num(arguments: Sequence[str]) -> list[str]:
    """``arguments`` without ``--run_num X``, ``--run_num=X`` and ``--set (log.)run_num=X``."""
    kept: list[str] = []
    index = 0
    while index < len(arguments):
        word = arguments[index]
        value = arguments[index + 1] if index + 1 < len(arguments) else ""
        if word == "--run_num" or (word == "--set" and _is_run_num_override(value)):
            index += 2
        elif word.startswith("--run_num=") or (word.startswith("--set=") and _is_run_num_override(word[6:])):
            index += 1
        else:
            kept.append(word)
            index += 1
    return kept


def rerun_command(run_dir: Path, argv: Sequence[str] | None = None) -> tuple[list[str], str | None]:
    """This command line made to train a fresh run, and the run_num it trains into.

    A ``dlscale train`` command gets ``--run_num <run_num>-nsys`` (see :func:`fresh_run_num`) in place of its
    own run_num: run again in this run's directory, it would resume from its checkpoint, maybe past the
    window. Flags are applied after ``--set`` and the config, so the appended flag wins whatever set the old
    one. Any other command line (a script calling :func:`dlscale.train`) is returned as it is, with None: its
    run_num is the script's to change.
    """
    words = typed_command(argv)
    program = _program_length(words)
    if program is None or words[program : program + 1] != ["train"]:
        return words, None
    run_num = fresh_run_num(run_dir)
    return [*words[:program], *_without_run_num(words[program:]), "--run_num", run_num], run_num


def nsys_command(run_dir: Path, argv: Sequence[str] | None = None, rank_variable: str | None = None) -> str:
    """The shell command that runs this command line under ``nsys profile`` to record the capture window.

    The command trains a fresh run (:func:`rerun_command`); the report goes to this run's
    ``<run_dir>/nsys/rank0.nsys-rep``, and ``rank_variable`` (e.g. ``SLURM_PROCID``) names one report per rank
    instead, through nsys's ``%q{VARIABLE}`` substitution.
    """
    report = Path(run_dir) / "nsys" / (f"rank%q{{{rank_variable}}}" if rank_variable else "rank0")
    return shlex.join(nsys_profile_words(report) + rerun_command(run_dir, argv)[0])


def nsys_hint_lines(run_dir: Path, argv: Sequence[str] | None = None) -> list[str]:
    """How to run this command under nsys: as one process, under srun, under torchrun."""
    words, run_num = rerun_command(run_dir, argv)
    command = shlex.join(words)
    reports = Path(run_dir) / "nsys"
    per_slurm_task = shlex.join(nsys_profile_words(reports / "rank%q{SLURM_PROCID}"))
    per_torchrun_worker = shlex.join(nsys_profile_words(reports / "rank%q{RANK}"))
    why = "because a run in this run's directory would resume from its checkpoint, maybe past the window"
    if run_num is not None:
        fresh = f"  It trains a fresh run (--run_num {shlex.quote(run_num)}), {why}"
    else:
        fresh = (
            f"  with another log.run_num than {Path(run_dir).name!r} (e.g. {fresh_run_num(run_dir)!r}), {why}"
        )
    return [
        "To record the window with Nsight Systems (unless this process already runs under nsys), run",
        f"  {shlex.join(nsys_profile_words(reports / 'rank0'))} {command}",
        f"{fresh}; nsys writes the report {reports / 'rank0'}.nsys-rep when the program exits.",
        f"  Under srun, nsys goes after srun: srun ... {per_slurm_task} {command}",
        f"  Under torchrun, nsys runs inside each worker: torchrun ... --no-python {per_torchrun_worker} {command}",
    ]


class CudaProfilerWindow(Observer):
    """Starts the CUDA profiler at (``profile_epoch``, ``profile_start_step``) and stops it after step
    ``profile_end_step - 1`` (or at the end of that epoch), on the ranks of ``profile_ranks``.

    The window is also closed at the end of its epoch or of the run when a stop request cut it short, so
    nsys never waits for a stop that does not come. A run resumed past the window does not open it.
    """

    def __init__(self, cfg: ProfileConfig, plan: EpochPlan, rank: int, argv: Sequence[str] | None = None):
        epochs = plan.num_epochs
        profile_epoch = epochs if cfg.profile_epoch is None else cfg.profile_epoch
        if profile_epoch > epochs:
            raise ConfigError(
                f"profile.profile_epoch is {profile_epoch}, but this run trains {epochs} epoch(s): choose an "
                f"epoch from 1 to {epochs}, or null for the last one"
            )
        self.epoch = profile_epoch - 1  # 0-based, as trainer.progress counts
        steps = plan.steps_in_epoch(self.epoch)
        if cfg.profile_start_step >= steps:
            raise ConfigError(
                f"profile.profile_start_step is {cfg.profile_start_step}, but epoch {profile_epoch} has "
                f"{steps} step(s) (0 to {steps - 1})"
            )
        self.start_step = cfg.profile_start_step
        # A window reaching past the epoch simply ends with it.
        self.end_step = steps if cfg.profile_end_step is None else min(cfg.profile_end_step, steps)
        ranks = cfg.ranks()
        self.rank = rank
        self.ranks_text = cfg.profile_ranks
        self.enabled = ranks is None or rank in ranks
        self.argv = argv
        self.is_open = False
        self.done = False
        self._device = None
        self._first_global_step = 0

    def describe(self) -> str:
        """The window in words, with 1-based epochs as the logs print them."""
        return f"epoch {self.epoch + 1}, steps {self.start_step} to {self.end_step - 1}"

    def on_train_start(self, trainer: TrainerView) -> None:
        setup, progress = trainer.setup, trainer.progress
        self._device = setup.device
        log.info(
            "Manual profiling: NVTX ranges around each step; the CUDA profiler runs over %s on rank(s) %s",
            self.describe(),
            self.ranks_text,
        )
        if not setup.device.is_gpu:
            log.info("Manual profiling on the CPU: NVTX and the CUDA profiler do nothing here")
        past_window = (progress.epoch, progress.step_in_epoch) >= (self.epoch, self.end_step)
        if self.enabled and past_window:
            self.done = True
            log.info(
                "The run resumes past the profiling window (%s): nothing will be captured", self.describe()
            )
        if setup.process.is_main:
            # nsys does not promise to create the report's folder, so the printed command finds it ready.
            (Path(setup.run_dir) / "nsys").mkdir(parents=True, exist_ok=True)
            for line in nsys_hint_lines(setup.run_dir, self.argv):
                log.info("%s", line)

    def on_step_start(self, trainer: TrainerView) -> None:
        if not self.enabled or self.is_open or self.done:
            return
        progress = trainer.progress
        # A run resumed inside the window opens it at its first step there, capturing what is left.
        if progress.epoch == self.epoch and self.start_step <= progress.step_in_epoch < self.end_step:
            self._open(progress.step_in_epoch, progress.global_step)

    def on_step_end(self, trainer: TrainerView, loss: object) -> None:
        # step_in_epoch already counts the step just done, so it equals end_step after step end_step - 1.
        if self.is_open and trainer.progress.step_in_epoch >= self.end_step:
            self._close(trainer, "")

    def on_epoch_end(self, trainer: TrainerView, report: object) -> None:
        if self.is_open:  # the epoch had fewer batches than planned
            self._close(trainer, " (end of the epoch)")

    def on_train_end(self, trainer: TrainerView, outcome: str) -> None:
        if self.is_open:
            self._close(trainer, f" (the run {outcome} inside the window)")

    def _open(self, step_in_epoch: int, global_step: int) -> None:
        real = nvtx.cuda_profiler_start(self._device)
        self.is_open = True
        self._first_global_step = global_step
        log.info(
            "CUDA profiler window opened at epoch %d, step %d (global step %d)%s",
            self.epoch + 1,
            step_in_epoch,
            global_step,
            "" if real else " [no CUDA profiler on the CPU: nothing is recorded]",
        )

    def _close(self, trainer: TrainerView, why: str) -> None:
        nvtx.cuda_profiler_stop(self._device)
        self.is_open = False
        self.done = True
        last_global_step = trainer.progress.global_step - 1
        log.info(
            "CUDA profiler window closed%s: %d step(s) captured (global steps %d to %d)",
            why,
            last_global_step - self._first_global_step + 1,
            self._first_global_step,
            last_global_step,
        )


def build_profiling(
    cfg: ProfileConfig, rank: int, device: Device, plan: EpochPlan
) -> tuple[StepMarkers, list[Observer]]:
    """The markers the step and loop use, and the observers to attach, for the ``profile:`` section.

    - ``enable_manual_profiling``: NVTX markers (GPU only) and a :class:`CudaProfilerWindow`;
    - ``torch_profiler``: a :class:`TorchProfilerObserver`, and markers that also emit ``record_function``
      ranges, so step, data, forward, backward and optimizer show up in its trace;
    - ``line_profile``: a :class:`LineProfileObserver`.

    Trace-writing profilers run only on the ranks of ``profile_ranks``; the checks of the config (window
    inside the run, line_profiler installed) run on every rank, so all ranks fail alike.
    """
    ranks = cfg.ranks()
    profiled_rank = ranks is None or rank in ranks
    observers: list[Observer] = []
    if cfg.enable_manual_profiling:
        # Attached on every rank: it validates the window everywhere and stays idle off profile_ranks.
        observers.append(CudaProfilerWindow(cfg, plan, rank))
    if cfg.line_profile:
        require_line_profiler()
    with_torch_profiler = cfg.torch_profiler and profiled_rank
    if with_torch_profiler:
        observers.append(
            TorchProfilerObserver(
                wait=cfg.torch_profiler_wait,
                warmup=cfg.torch_profiler_warmup,
                active=cfg.torch_profiler_active,
            )
        )
    if cfg.line_profile and profiled_rank:
        observers.append(LineProfileObserver())
    markers = build_markers(device, nvtx=cfg.enable_manual_profiling, record_functions=with_torch_profiler)
    return markers, observers
