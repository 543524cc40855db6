"""How a progress display shows itself, for every layer that has one (training's steps, an evaluation's
batches, an import's bytes): ``auto`` resolved to a bar on a terminal or plain lines in a batch log (a bar's
carriage returns would fill a log file), and a duration as a clock reads it."""

from __future__ import annotations

import math
from typing import TextIO

PROGRESS_MODES = ("auto", "bar", "lines", "none")


def choose_progress_mode(mode: str, stream: TextIO) -> str:
    """``auto`` -> ``bar`` when ``stream`` is a terminal, ``lines`` otherwise; ``bar``, ``lines`` and ``none``
    as they are (ValueError for any other mode)."""
    if mode not in PROGRESS_MODES:
        raise ValueError(f"progress mode must be auto, bar, lines or none, got {mode!r}")
    if mode != "auto":
        return mode
    return "bar" if stream.isatty() else "lines"


def format_duration(seconds: float) -> str:
    """1h02m03s / 4m05s / 6s; ``?`` for a duration that is not known (NaN or infinite), 0s below zero."""
    if not math.isfinite(seconds):
        return "?"
    minutes, secs = divmod(int(round(max(seconds, 0.0))), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
