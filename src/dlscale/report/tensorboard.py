"""TensorBoard as a :class:`~dlscale.report.loggers.MetricLogger`: the tutorials' tags, plus an image each epoch.

Tags (made by :mod:`dlscale.report.metrics_observer`): ``Loss/train``, ``Loss/valid``, ``RMSE(u10m)/valid`` (the
workload's headline metric), ``Learning Rate``, ``Avg iters per sec``, ``Avg samples per sec``; and dlscale's
own: every channel's metric (``RMSE/<channel>/valid``) and the baseline's (``.../persistence``), drawn as a
reference line. The x-axis is the optimizer step, as in the tutorials. Performance: ``Performance/TFLOP/s per
device`` (a GPU, or a CPU process), ``Performance/MFU`` and ``Memory/peak <allocated|reserved|host_rss> GB`` per
epoch; every step's loss, LR, samples/s and peak memory under ``Step/``; the validation's figures
(:func:`dlscale.report.figures.validation_figures`) every ``log.image_every`` epochs and at the last: the
prediction-vs-target image ``Visualization, <channel>`` (in the channel's unit on degrees of longitude and
latitude, when the workload knows them), the skill per channel against the baseline ``Visualization, skill vs
persistence``, a classifier's ``Visualization, class accuracy`` and, for up to 20 classes, ``confusion matrix``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter

from dlscale.runtime.storage import ReportedWrites

# The thread that writes a SummaryWriter's events. Another tensorboard may lack it: then that thread's failures
# print as Python prints them, and are still reported as one line by the thread that logs.
try:
    from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread as _EventWriterThread
except ImportError:  # pragma: no cover
    _EventWriterThread = None


class TensorBoardLogger:
    """Writes event files into ``directory``; opened at ``start_step``, it hides the events after that step.

    A write that fails (a full disk, a quota) raises :class:`~dlscale.errors.StorageError` naming the event
    file, at the call that logged it: every call flushes, so the failure of TensorBoard's writer thread reaches
    the caller at once, and that thread's own traceback is not printed (see :func:`quiet_event_writer_threads`).
    """

    def __init__(self, directory: Path, start_step: int = 0):
        self.directory = directory
        self.writer: SummaryWriter | None = None
        self.event_file: Path | None = None  # the file this logger writes now (one per opening)
        self._writes = ReportedWrites(
            lambda: self.event_file or self.directory, "cannot write TensorBoard events"
        )
        self._open(start_step)

    def _open(self, start_step: int) -> None:
        quiet_event_writer_threads()  # before the writer's thread starts: its first write may fail too
        self._writes.failed = False  # a new writer and event file
        with self._writes():
            # purge_step hides the events that an earlier, interrupted attempt wrote after the step this run
            # continues from (all of them when it starts from scratch), so a curve never shows two points for
            # one step. Events *at* that step were written before its checkpoint (epoch-end scalars come before
            # the checkpoint is saved) and belong to the history this run continues.
            self.writer = SummaryWriter(str(self.directory), purge_step=start_step + 1)
            self.event_file = _event_file(self.writer)
            self.writer.flush()

    def log_scalars(self, step: int, values: Mapping[str, float], wall_time: float) -> None:
        writer = self._writer()
        with self._writes():
            for tag, value in values.items():
                writer.add_scalar(tag, value, step, walltime=wall_time)
            writer.flush()

    def log_image(self, tag: str, rgb: Any, step: int) -> None:
        """``rgb``: an (H, W, 3) uint8 array."""
        writer = self._writer()
        with self._writes():
            writer.add_image(tag, rgb, step, dataformats="HWC")
            writer.flush()

    def rewind(self, step: int) -> None:
        # The steps after ``step`` are trained again (a rollback): hide what the undone attempt wrote for them.
        self.close()
        self._open(step)

    def close(self) -> None:
        writer, self.writer = self.writer, None
        if writer is None:
            return
        self._writes.close(writer.close)

    def _writer(self) -> SummaryWriter:
        if self.writer is None:
            raise RuntimeError(f"the TensorBoard logger of {self.directory} is closed")
        return self.writer


def _event_file(writer: SummaryWriter) -> Path | None:
    """The event file ``writer`` appends to (None where this tensorboard does not say)."""
    event_writer = getattr(writer.file_writer, "event_writer", None)
    name = getattr(event_writer, "_file_name", None)
    return Path(name) if isinstance(name, str) else None


def quiet_event_writer_threads() -> None:
    """Keep Python from printing ``Exception in thread Thread-N: Traceback ...`` when a TensorBoard writer
    thread's write fails with an OSError (a full disk).

    That thread stores the exception and re-raises it; the SummaryWriter raises the same exception in the
    calling thread at its next write or flush, and :class:`TensorBoardLogger` flushes at every call and reports
    it there as one line naming the file. Any other exception, or one of any other thread, goes to the hook
    that was in place. Installed on top of the current ``threading.excepthook`` unless it is already there
    (a test harness may swap the hook between tests).
    """
    if _EventWriterThread is None or getattr(threading.excepthook, "_dlscale_quiet_event_writer", False):
        return
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        if isinstance(args.thread, _EventWriterThread) and isinstance(args.exc_value, OSError):
            return  # raised again, and reported, in the thread that logs
        previous(args)

    hook._dlscale_quiet_event_writer = True  # type: ignore[attr-defined]
    threading.excepthook = hook
