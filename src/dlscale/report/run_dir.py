"""The ``log:`` config section, the run directory and the log format.

A run writes everything under ``<expdir>/<config name>/<run_num>/``: ``out.log`` (the console log),
``config.yaml`` (the resolved config), ``checkpoints/``, ``tensorboard/``, ``figures/`` and ``summary.json``.
The directory does not depend on the number of ranks, so a requeued job finds its checkpoint whatever its size.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tqdm import tqdm

from dlscale.report.log_config import LogConfig

LOG_FORMAT = "%(asctime)s - %(name)s - %(levelname)s - %(message)s"
LOGGER_NAME = "dlscale"


def setup_rank_logging(cfg: LogConfig, run_dir: Path, process: Any) -> None:
    """Rank 0 logs to the console and ``out.log``; the other ranks stay quiet, or with ``rank_logs`` write
    their own lines to ``ranks/rank<N>.log`` (not the console, where N ranks' lines would interleave)."""
    if process.is_main:
        setup_logging(run_dir / "out.log")
    elif cfg.rank_logs:
        setup_logging(run_dir / "ranks" / f"rank{process.rank}.log", console=False)
    else:
        setup_logging(None, enabled=False)


def run_directory(cfg: LogConfig, config_name: str) -> Path:
    """``<expdir>/<config name>/<run_num>``."""
    return Path(cfg.expdir).expanduser() / config_name / cfg.run_num


class _TqdmAwareHandler(logging.StreamHandler):
    """Writes log lines through tqdm so that an active progress bar is redrawn below them, not torn."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # logging must never kill a run
            self.handleError(record)


class _LogFileHandler(logging.FileHandler):
    """A log file that, when it can no longer be written (full disk, quota), says so once and steps aside.

    logging's default prints a traceback to stderr for every record that fails, which on a full disk buries the
    one message that matters; the run itself then fails with a plain message at its next checkpoint.
    """

    def handleError(self, record: logging.LogRecord) -> None:
        exc = sys.exc_info()[1]
        reason = f"{os.strerror(exc.errno)}" if isinstance(exc, OSError) and exc.errno else str(exc)
        print(
            f"dlscale: cannot write the log file {self.baseFilename}: {reason}; logging goes on to the "
            "console only",
            file=sys.stderr,
        )
        logging.getLogger(LOGGER_NAME).removeHandler(self)
        with contextlib.suppress(Exception):
            self.close()


def _console_handler(level: int = logging.NOTSET) -> logging.Handler:
    handler = _TqdmAwareHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.setLevel(level)
    return handler


@contextlib.contextmanager
def early_logging(is_main: bool) -> Iterator[list[logging.LogRecord]]:
    """Logging before a run's log files may be opened (not before its run-directory lock is held): records go
    to the console at once (INFO on rank 0, warnings elsewhere) and are kept, for
    :func:`write_to_log_files` to add to the files once they exist. Handlers of an earlier run in this process
    (its out.log) are set aside meanwhile."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger(LOGGER_NAME)
    earlier, level, propagate = list(logger.handlers), logger.level, logger.propagate
    for handler in earlier:
        logger.removeHandler(handler)
    temporary = [Keep(logging.INFO), _console_handler(logging.INFO if is_main else logging.WARNING)]
    for handler in temporary:
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield records
    finally:
        for handler in temporary:
            logger.removeHandler(handler)
        for handler in earlier:
            logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def write_to_log_files(records: list[logging.LogRecord]) -> list[str]:
    """Add records kept by :func:`early_logging` (or any record the console must not show) to this process's
    log files; the paths of those files."""
    logger = logging.getLogger(LOGGER_NAME)
    files = [h for h in logger.handlers if isinstance(h, logging.FileHandler)]
    for record in records:
        if logging.getLogger(record.name).isEnabledFor(record.levelno):
            for handler in files:
                handler.handle(record)
    return [handler.baseFilename for handler in files]


def setup_logging(log_file: Path | None, enabled: bool = True, console: bool = True) -> logging.Logger:
    """Log to stdout (unless ``console`` is false) and ``log_file`` in the tutorials' format;
    ``enabled=False`` silences this process (warnings and errors still reach the console)."""
    logger = logging.getLogger(LOGGER_NAME)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    logger.setLevel(logging.INFO if enabled else logging.WARNING)
    logger.propagate = False
    formatter = logging.Formatter(LOG_FORMAT)
    if console or not enabled:
        logger.addHandler(_console_handler())
    if log_file is not None and enabled:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        file_handler = _LogFileHandler(log_file)
        file_handler.setFormatter(formatter)
        logger.addHandler(file_handler)
    return logger
