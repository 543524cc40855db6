"""When each state of a year file is: its ``time`` dataset (seconds since 1970, as ``dlscale data import-era5``
writes it), else 1 January 00 UTC of the year the file is named after (``2018.h5``, the tutorial's) plus the
hours between time indices (the ``hours_per_step`` attribute of ``fields``, else 6). Shared by the forecast's
trajectories (:mod:`dlscale.data.era5.trajectories`) and the climatology (:mod:`dlscale.data.era5.climatology`);
h5py and numpy only, so a data command that needs dates does not import torch."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from dlscale.data.era5.layout import FIELDS_KEY, TIME_KEY
from dlscale.errors import DataError

DEFAULT_HOURS_PER_STEP = 6.0
HOURS_ATTRIBUTE = "hours_per_step"


def minute_text(value: np.datetime64) -> str:
    """A date to the minute, for messages: ``2018-01-01T06:00``."""
    return str(np.datetime64(value, "m"))


def year_of_name(stem: str) -> int | None:
    """The year a file is named after (``2018``), else None."""
    return int(stem) if stem.isdigit() and 1 <= int(stem) <= 9999 else None


def file_dates(path: Path, steps: int, hours_per_state: float) -> np.ndarray | None:
    """The date of each of a file's ``steps`` states (minutes): its ``time`` dataset where it has one (as
    ``dlscale data import-era5`` writes, seconds since 1970), else counted from 1 January 00 UTC of the year the
    file is named after; None for neither."""
    with h5py.File(path, "r") as handle:
        times = handle.get(TIME_KEY)
        if isinstance(times, h5py.Dataset) and times.shape == (steps,):
            seconds = np.asarray(times[()], dtype=np.int64)
            return (seconds // 60).astype("datetime64[m]")
    year = year_of_name(path.stem)
    if year is None:
        return None
    minutes = np.round(np.arange(steps) * hours_per_state * 60).astype(np.int64)
    return np.datetime64(f"{year:04d}-01-01T00:00", "m") + minutes.astype("timedelta64[m]")


def hours_per_step(path) -> float:
    """The hours between a file's time indices: its ``hours_per_step`` attribute, else 6."""
    with h5py.File(path, "r") as handle:
        fields = handle[FIELDS_KEY]
        hours = fields.attrs.get(HOURS_ATTRIBUTE, DEFAULT_HOURS_PER_STEP)
        try:
            hours = float(np.asarray(hours).reshape(-1)[0])
        except (TypeError, ValueError, IndexError):
            hours = -1.0
        if not np.isfinite(hours) or hours <= 0:
            raise DataError(
                f"{path}: the attribute {HOURS_ATTRIBUTE!r} of '{FIELDS_KEY}' is {fields.attrs[HOURS_ATTRIBUTE]!r}; "
                "expected the hours between time indices (> 0)"
            )
        return hours
