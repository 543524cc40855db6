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

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter


class TensorBoardLogger:
    """Writes event files into ``directory``; opened at ``start_step``, it hides the events after that step."""

    def __init__(self, directory: Path, start_step: int = 0):
        self.directory = directory
        self.writer: SummaryWriter | None = None
        self._open(start_step)

    def _open(self, start_step: int) -> None:
        # purge_step hides the events that an earlier, interrupted attempt wrote after the step this run
        # continues from (all of them when it starts from scratch), so a curve never shows two points for one
        # step. Events *at* that step were written before its checkpoint (epoch-end scalars come before the
        # checkpoint is saved) and belong to the history this run continues.
        self.writer = SummaryWriter(str(self.directory), purge_step=start_step + 1)

    def log_scalars(self, step: int, values: Mapping[str, float], wall_time: float) -> None:
        writer = self._writer()
        for tag, value in values.items():
            writer.add_scalar(tag, value, step, walltime=wall_time)
        writer.flush()

    def log_image(self, tag: str, rgb: Any, step: int) -> None:
        """``rgb``: an (H, W, 3) uint8 array."""
        writer = self._writer()
        writer.add_image(tag, rgb, step, dataformats="HWC")
        writer.flush()

    def rewind(self, step: int) -> None:
        # The steps after ``step`` are trained again (a rollback): hide what the undone attempt wrote for them.
        self.close()
        self._open(step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def _writer(self) -> SummaryWriter:
        if self.writer is None:
            raise RuntimeError(f"the TensorBoard logger of {self.directory} is closed")
        return self.writer
