"""A copy of the tiny ERA5 data set with NaN at one time step of its first training file (divergence tests)."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py

NAN_TIME = 3  # the time index made NaN in the first training file: samples 2 (its target) and 3 (its input)


def copy_with_nan(tiny_era5: Path, root: Path) -> Path:
    """``tiny_era5`` copied to ``root``, with NaN at time NAN_TIME, channel 0, of the first training file."""
    shutil.copytree(tiny_era5, root)
    first = sorted((root / "train").glob("*.h5"))[0]
    with h5py.File(first, "r+") as f:
        f["fields"][NAN_TIME, 0, 0, 0] = float("nan")
    return root
