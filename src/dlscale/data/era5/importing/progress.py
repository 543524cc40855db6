"""The progress of a long import in bytes written: a tqdm bar with its GB/s on a terminal, a plain line every
``interval_s`` seconds in a batch log (a bar's carriage returns would fill a log file), as training's progress
display does (both word themselves with :mod:`dlscale.runtime.progress_text`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from dlscale.runtime.progress_text import choose_progress_mode, format_duration


class ByteProgress:
    """Counts the bytes written against ``total_bytes`` and shows the rate in GB/s."""

    def __init__(
        self,
        total_bytes: int,
        report: Callable[[str], None],
        mode: str = "auto",
        interval_s: float = 10.0,
        stream: TextIO | None = None,
    ):
        self.stream = stream or sys.stderr
        self.mode = choose_progress_mode(mode, self.stream)
        self.total_bytes = total_bytes
        self.report = report
        self.interval_s = interval_s
        self.done_bytes = 0
        self.started = time.perf_counter()
        self._last_line = self.started
        self._bar = None
        if self.mode == "bar":
            from tqdm import tqdm

            self._bar = tqdm(
                total=total_bytes,
                unit="B",
                unit_scale=True,
                unit_divisor=1000,  # decimal GB/s, the unit disks are rated in
                desc="import-era5",
                file=self.stream,
                dynamic_ncols=True,
            )

    def advance(self, written_bytes: int, where: str) -> None:
        """``written_bytes`` more are on disk; ``where`` says what is being written (e.g. ``train/1980.h5``)."""
        self.done_bytes += written_bytes
        if self._bar is not None:
            self._bar.set_postfix_str(where, refresh=False)
            self._bar.update(written_bytes)
        elif self.mode == "lines":
            now = time.perf_counter()
            if now - self._last_line >= self.interval_s:
                self._last_line = now
                self.report(self.line(now, where))

    def rate_gb_per_s(self, now: float | None = None) -> float:
        elapsed = (now or time.perf_counter()) - self.started
        return self.done_bytes / 1e9 / elapsed if elapsed > 0 else 0.0

    def line(self, now: float, where: str) -> str:
        """e.g. ``import-era5: 12.41/96.00 GB (13%), 0.84 GB/s, train/1981.h5, ETA 1m40s``."""
        rate = self.rate_gb_per_s(now)
        left = (self.total_bytes - self.done_bytes) / 1e9 / rate if rate > 0 else float("nan")
        percent = 100 * self.done_bytes / max(self.total_bytes, 1)
        return (
            f"import-era5: {self.done_bytes / 1e9:.2f}/{self.total_bytes / 1e9:.2f} GB ({percent:.0f}%), "
            f"{rate:.2f} GB/s, {where}, ETA {format_duration(left)}"
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
