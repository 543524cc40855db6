"""Progress of long work: a bar on a terminal, periodic plain lines in batch logs (no bar spam in files)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from typing import Any, TextIO

from tqdm import tqdm

from dlscale.runtime.progress_text import choose_progress_mode, format_duration
from dlscale.training.observer import EpochReport, Observer

log = logging.getLogger("dlscale.train")


class ProgressReporter(Observer):
    """Shows step progress within the run: a tqdm bar (``bar``) or a plain line every ``interval`` s (``lines``)."""

    def __init__(self, mode: str, interval_s: float = 30.0, stream: TextIO = sys.stderr):
        self.mode = choose_progress_mode(mode, stream)
        self.interval_s = interval_s
        self.stream = stream
        self.bar: tqdm | None = None
        self._last_line = 0.0
        self._started = 0.0
        self._start_step = 0

    def on_train_start(self, trainer) -> None:
        self._started = time.perf_counter()
        self._last_line = self._started
        self._start_step = trainer.progress.global_step

    def on_epoch_start(self, trainer) -> None:
        if self.mode != "bar":
            return
        p, plan = trainer.progress, trainer.setup.plan
        self.bar = tqdm(
            total=plan.steps_in_epoch(p.epoch),
            initial=p.step_in_epoch,
            desc=f"epoch {p.epoch + 1}/{plan.num_epochs}",
            unit="step",
            file=self.stream,
            leave=False,
            dynamic_ncols=True,
        )

    def on_step_end(self, trainer, loss) -> None:
        if self.mode == "bar" and self.bar is not None:
            self.bar.update(1)
            if self.bar.n % 10 == 0 or self.bar.n == self.bar.total:
                self.bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
        elif self.mode == "lines":
            now = time.perf_counter()
            if now - self._last_line >= self.interval_s:
                self._last_line = now
                log.info("%s", self.status_line(trainer, loss.item(), now))

    def status_line(self, trainer, loss: float, now: float) -> str:
        """e.g. ``epoch 2/10, step 120/256 (47%), loss 0.4123, 12.3 samples/s overall, run 31% done, ETA 4m10s``.

        The rate and the ETA use wall time since this process started training, validation included.
        """
        p, plan = trainer.progress, trainer.setup.plan
        done = p.global_step - self._start_step
        elapsed = now - self._started
        rate = done / elapsed if elapsed > 0 else 0.0
        remaining = (plan.total_steps - p.global_step) / rate if rate > 0 else float("nan")
        in_epoch = plan.steps_in_epoch(p.epoch)
        return (
            f"epoch {p.epoch + 1}/{plan.num_epochs}, step {p.step_in_epoch}/{in_epoch} "
            f"({100 * p.step_in_epoch / max(in_epoch, 1):.0f}%), loss {loss:.4f}, "
            f"{rate * trainer.setup.global_batch_size:.3g} samples/s overall, "
            f"run {100 * p.global_step / plan.total_steps:.0f}% done, ETA {format_duration(remaining)}"
        )

    def on_epoch_end(self, trainer, report: EpochReport) -> None:
        self._close_bar()

    def on_rollback(self, trainer, divergence) -> None:
        self._close_bar()  # the next epoch start opens one at the restored position
        self.on_train_start(trainer)  # the rate and ETA count from the restored step

    def on_train_end(self, trainer, outcome: str) -> None:
        self._close_bar()

    def _close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class PassProgress:
    """One pass over ``batches`` (an evaluation) with its progress: on a terminal a bar that appears once the
    pass has taken ``delay_s`` (a pass of a few seconds shows none), in a batch log a plain line every
    ``interval_s`` seconds (``mode`` as ``log.progress``: auto, bar, lines or none) through ``logger`` (default
    ``dlscale.train``'s; a command with a logger of its own passes it)."""

    def __init__(
        self,
        batches: Any,
        what: str,
        mode: str = "auto",
        interval_s: float = 30.0,
        stream: TextIO = sys.stderr,
        delay_s: float = 3.0,
        logger: logging.Logger = log,
    ):
        self.batches = batches
        self.what = what
        self.mode = choose_progress_mode(mode, stream)
        self.interval_s = interval_s
        self.stream = stream
        self.delay_s = delay_s
        self.logger = logger

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Any]:
        total = len(self.batches) if hasattr(self.batches, "__len__") else None
        bar = None
        if self.mode == "bar":
            bar = tqdm(
                total=total,
                desc=self.what,
                unit="batch",
                file=self.stream,
                leave=False,
                dynamic_ncols=True,
                delay=self.delay_s,
            )
        started = last_line = time.perf_counter()
        try:
            for done, batch in enumerate(self.batches, 1):
                yield batch  # counted once the consumer asks for the next one: this one is done
                if bar is not None:
                    bar.update(1)
                elif self.mode == "lines" and time.perf_counter() - last_line >= self.interval_s:
                    last_line = time.perf_counter()
                    self.logger.info("%s", self.status_line(done, total, last_line - started))
        finally:
            if bar is not None:
                bar.close()

    def status_line(self, done: int, total: int | None, elapsed: float) -> str:
        """e.g. ``test split: batch 120/256 (47%), 4.1 batches/s, ETA 33s``."""
        rate = done / elapsed if elapsed > 0 else 0.0
        if total is None:
            return f"{self.what}: batch {done}, {rate:.3g} batches/s"
        eta = format_duration((total - done) / rate) if rate > 0 else "?"
        return (
            f"{self.what}: batch {done}/{total} ({100 * done / max(total, 1):.0f}%), {rate:.3g} batches/s, "
            f"ETA {eta}"
        )
