"""One interface for every place a run's scalars go: the CSV files (always), TensorBoard, wandb, MLflow.

A :class:`MetricLogger` takes rows of scalars at an optimizer step; :class:`~dlscale.report.metrics_observer.
MetricsReporter` makes the rows (one per step, one per epoch) and hands them to the backends ``log.loggers``
names. ``<run>/metrics/steps.csv`` and ``<run>/metrics/epochs.csv`` are always written: plain files any tool
reads, which survive a resume exactly as TensorBoard's curves do (rows after the checkpoint's step are dropped).

wandb and MLflow are optional packages (``pip install 'dlscale[wandb]'``, ``'dlscale[mlflow]'``; for MLflow
``mlflow-skinny`` is enough), imported only when named; wandb runs offline unless ``WANDB_MODE`` says otherwise
(``wandb sync <run>/wandb/offline-run-*`` uploads later), MLflow writes a file store under the run unless
``MLFLOW_TRACKING_URI`` names a server or a database.

A resumed or requeued run continues the same wandb and MLflow runs: their ids are in the run's
:class:`~dlscale.training.training_setup.RunRecord` (``logger_runs``), which every checkpoint saves and a
resume from this run's own checkpoint restores; :func:`open_loggers` reopens them (a checkpoint without them
starts new runs, with one log line; a run that cannot be reopened, deleted say, is replaced by a new one, with
one warning). Neither backend can take back points: the steps trained again (after a rollback, or the steps a
killed attempt logged after its last checkpoint) are logged again, so those steps show twice there (see
:class:`~dlscale.report.trackers.WandbLogger` and :class:`~dlscale.report.trackers.MlflowLogger`); the CSV
files and TensorBoard drop the undone steps.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import logging
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from dlscale.errors import ConfigError
from dlscale.runtime.atomic_files import write_text_atomically
from dlscale.runtime.storage import ReportedWrites

STEPS_CSV = Path("metrics") / "steps.csv"  # relative to the run directory
EPOCHS_CSV = Path("metrics") / "epochs.csv"
# Backends that need a package of their own: logger name -> (module, pyproject extra).
OPTIONAL_BACKENDS = {"wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}

log = logging.getLogger(__name__)


@runtime_checkable
class MetricLogger(Protocol):
    """Where scalars go. ``step`` is the optimizer step (the count of steps done, as in TensorBoard's x-axis),
    ``wall_time`` seconds since the epoch (``time.time()``) when the values were measured."""

    def log_scalars(self, step: int, values: Mapping[str, float], wall_time: float) -> None:
        """Record ``values`` (name -> number; NaN and inf allowed) at ``step``."""
        ...

    def close(self) -> None:
        """Write out what is buffered and release the files or the run."""
        ...


@runtime_checkable
class RewindableLogger(MetricLogger, Protocol):
    """A logger that can take back what it recorded (files it owns): the CSV files and TensorBoard."""

    def rewind(self, step: int) -> None:
        """Drop every value recorded after ``step`` (steps that a rollback trains again)."""
        ...


@runtime_checkable
class ImageLogger(Protocol):
    """A logger that also shows images (TensorBoard: the prediction-vs-target figure each epoch)."""

    def log_image(self, tag: str, rgb: Any, step: int) -> None:
        """``rgb``: an (H, W, 3) uint8 array."""
        ...


class Prefixed:
    """A view of a logger that puts ``prefix`` before every name (per-step rows next to per-epoch ones in one
    TensorBoard, wandb or MLflow run). Closing the view leaves the logger open: its owner closes it."""

    def __init__(self, logger: MetricLogger, prefix: str):
        self.logger, self.prefix = logger, prefix

    def log_scalars(self, step: int, values: Mapping[str, float], wall_time: float) -> None:
        self.logger.log_scalars(step, {self.prefix + k: v for k, v in values.items()}, wall_time)

    def close(self) -> None:
        pass


# ----------------------------------------------------------------------------------------------------- CSV


class CsvLogger:
    """One CSV file, one row per :meth:`log_scalars` call: ``step``, ``epoch`` (when given), ``wall_time``, then
    the values' names in the order first seen. Safe to append to across attempts of a run:

    * opening it with ``start_step`` keeps only the rows up to that step (a resumed run drops what an
      interrupted attempt wrote after its checkpoint, as TensorBoard's ``purge_step`` does);
    * the header is one line at the top; a name not in it yet rewrites the file with a wider header (once);
    * every row is one ``write`` of a whole line, flushed at once, so a killed run leaves at worst one torn last
      line, which the next opening drops. Rewrites go through a temporary file and a rename.
    """

    def __init__(self, path: Path, start_step: int | None = None):
        self.path = path
        self.columns: list[str] | None = None
        self._file: io.TextIOWrapper | None = None
        # the directory is named if creating it fails
        self._writes = ReportedWrites(lambda: self.path)
        with self._writes():
            self._open(start_step)

    def log_scalars(self, step: int, values: Mapping[str, float], wall_time: float) -> None:
        row = {"step": step, **values, "wall_time": wall_time}
        with self._writes():
            if self.columns is None:
                self.columns = _column_order(row)
                self._write(_line(self.columns) + _line([row.get(c) for c in self.columns]))
                return
            new = [name for name in _column_order(row) if name not in self.columns]
            if new:
                self._widen(new)
            self._write(_line([row.get(c) for c in self.columns]))

    def rewind(self, step: int) -> None:
        self.close()
        with self._writes():
            self._open(step)

    def close(self) -> None:
        file, self._file = self._file, None
        if file is None:
            return
        self._writes.close(file.close)

    def _open(self, start_step: int | None) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        header, rows, dropped = read_csv_lines(self.path, start_step)
        if dropped:
            write_text_atomically(self.path, _line(header) + "".join(rows) if header else "")
        self.columns = header
        self._file = self.path.open("a", newline="", encoding="utf-8")

    def _widen(self, new: list[str]) -> None:
        """Rewrite the file with ``new`` columns added to the header (empty in the rows written so far)."""
        assert self.columns is not None
        self.close()
        header, rows, _ = read_csv_lines(self.path, None)
        columns = (header or self.columns) + new
        old = header or self.columns
        padded = [_line(list(csv_row) + [None] * (len(columns) - len(old))) for csv_row in _parse(rows)]
        write_text_atomically(self.path, _line(columns) + "".join(padded))
        self.columns = columns
        self._file = self.path.open("a", newline="", encoding="utf-8")

    def _write(self, text: str) -> None:
        assert self._file is not None
        self._file.write(text)
        self._file.flush()


def read_csv_lines(path: Path, up_to_step: int | None) -> tuple[list[str] | None, list[str], bool]:
    """(header, the data lines to keep, whether anything was left out) of a CSV file this module wrote.

    Kept: whole lines (ending in a newline) whose ``step`` is an integer <= ``up_to_step`` (all when None).
    Left out: a torn last line, lines that do not parse (a power loss can leave zeros), later steps.
    """
    if not path.is_file():
        return None, [], False
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines(keepends=True)
    if not lines or not lines[0].endswith("\n"):
        return None, [], bool(text)
    header = next(csv.reader([lines[0]]))
    kept = []
    for line in lines[1:]:
        step = _leading_step(line)
        if line.endswith("\n") and step is not None and (up_to_step is None or step <= up_to_step):
            kept.append(line)
    return header, kept, len(kept) != len(lines) - 1


def read_csv_columns(path: Path) -> dict[str, list[float]]:
    """The numeric columns of a metrics CSV file (empty cells and text become NaN); {} when there is none."""
    header, lines, _ = read_csv_lines(path, None)
    if header is None:
        return {}
    columns: dict[str, list[float]] = {name: [] for name in header}
    for row in _parse(lines):
        for name, cell in zip(header, list(row) + [""] * (len(header) - len(row)), strict=False):
            columns[name].append(_number(cell))
    return columns


def _leading_step(line: str) -> int | None:
    head = line.split(",", 1)[0].strip()
    return int(head) if re.fullmatch(r"-?\d+", head) else None


def _number(cell: str) -> float:
    try:
        return float(cell)
    except ValueError:
        return math.nan


def _parse(lines: Iterable[str]) -> Iterable[list[str]]:
    return csv.reader(lines)


def _column_order(row: Mapping[str, Any]) -> list[str]:
    leading = [name for name in ("step", "epoch", "wall_time") if name in row]
    return leading + [name for name in row if name not in leading]


def _line(cells: Iterable[Any]) -> str:
    """One CSV line: floats as Python writes them (shortest exact form; nan, inf), None as an empty cell."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(["" if cell is None else cell for cell in cells])
    return buffer.getvalue()


# ----------------------------------------------------------------------------------------------- choosing


def missing_logger_package(loggers: Iterable[str]) -> ConfigError | None:
    """The error to stop a run with before it starts when ``log.loggers`` names a backend whose package is not
    installed (None when all are there)."""
    for name in loggers:
        if name not in OPTIONAL_BACKENDS:
            continue
        module, extra = OPTIONAL_BACKENDS[name]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return ConfigError(
                f"log.loggers names {name!r}, but the {module} package is not installed: "
                f"pip install 'dlscale[{extra}]' (or remove {name!r} from log.loggers)"
            )
    return None


class Loggers:
    """The backends of one run, open: ``steps`` take the per-step rows, ``epochs`` the per-epoch rows, and
    ``owned`` lists each backend once (to rewind and close)."""

    def __init__(self) -> None:
        self.steps: list[MetricLogger] = []
        self.epochs: list[MetricLogger] = []
        self.owned: list[MetricLogger] = []

    def add(self, logger: MetricLogger, steps: MetricLogger | None, epochs: MetricLogger | None) -> None:
        self.owned.append(logger)
        if steps is not None:
            self.steps.append(steps)
        if epochs is not None:
            self.epochs.append(epochs)

    def rewind(self, step: int) -> None:
        """Take back what was logged after ``step``, where the backend can."""
        for logger in self.owned:
            if isinstance(logger, RewindableLogger):
                logger.rewind(step)

    def close(self) -> None:
        for logger in self.owned:
            logger.close()
        self.owned, self.steps, self.epochs = [], [], []


def open_loggers(
    names: Iterable[str],
    run_dir: Path,
    record: Any,
    start_step: int,
    tensorboard: bool = True,
    runs: dict[str, str] | None = None,
) -> Loggers:
    """The CSV files and the backends ``names`` asks for (TensorBoard only when ``tensorboard`` too), opened at
    ``start_step`` (the step the run continues from; what was logged after it is dropped where possible).

    ``runs`` (the record's ``logger_runs``: logger name -> run id) names the wandb and MLflow runs to
    continue; the ids of the runs opened are written into it, for the checkpoints to save.

    Per-step rows reach TensorBoard, wandb and MLflow under ``step/`` (TensorBoard: ``Step/``), next to the
    per-epoch scalars under their TensorBoard tags.
    """
    loggers = Loggers()
    try:
        steps_csv = CsvLogger(run_dir / STEPS_CSV, start_step)
        loggers.add(steps_csv, steps_csv, None)
        epochs_csv = CsvLogger(run_dir / EPOCHS_CSV, start_step)
        loggers.add(epochs_csv, None, epochs_csv)
        for name in names:
            backend: MetricLogger
            if name == "tensorboard" and tensorboard:
                from dlscale.report.tensorboard import TensorBoardLogger

                backend = TensorBoardLogger(run_dir / "tensorboard", start_step)
                loggers.add(backend, Prefixed(backend, "Step/"), backend)
            elif name in ("wandb", "mlflow"):
                from dlscale.report.trackers import MlflowLogger, WandbLogger

                kind = WandbLogger if name == "wandb" else MlflowLogger
                run = kind(run_dir, record, start_step, _run_to_continue(runs, name, start_step))
                loggers.add(run, Prefixed(run, "step/"), run)
                if runs is not None:
                    runs[name] = run.run_id
    except BaseException:
        loggers.close()  # the files opened so far
        raise
    return loggers


def _run_to_continue(runs: dict[str, str] | None, name: str, start_step: int) -> str | None:
    """The id of the ``name`` run a resumed run continues; None, said in one line, when its checkpoint has
    none."""
    run_id = (runs or {}).get(name)
    if run_id is None and start_step > 0:
        log.info(
            "%s: the checkpoint names no %s run (saved before dlscale kept the id, by a run without %s, or "
            "by another run directory): a new %s run starts at step %d",
            name,
            name,
            name,
            name,
            start_step,
        )
    return run_id
