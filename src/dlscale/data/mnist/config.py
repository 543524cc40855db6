"""The MNIST workload's ``data:`` config section and the fixed facts of the format (no torch)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dlscale.errors import InvalidValue

IMAGE_SIDE = 28


NUM_CLASSES = 10


@dataclass
class MNISTDataConfig:
    """The ``data:`` section: where the idx files are, the normalization, and optional sample limits."""

    root: str = "data/mnist"  # directory of the four idx files (or of torchvision's MNIST/raw)
    mean: float = 0.1307  # pixel mean of MNIST's training images, on the [0, 1] scale
    std: float = 0.3081  # pixel standard deviation, on the [0, 1] scale
    limit_nsamples: int | None = None  # keep only the first N training samples
    limit_nsamples_val: int | None = None  # keep only the first N validation samples
    check_finite: bool = (
        False  # stop at the first batch holding NaN/inf, naming its file and sample (a sync per batch)
    )

    def __post_init__(self) -> None:
        if not self.std > 0:
            raise InvalidValue("std", f"must be > 0, got {self.std}")
        for name in ("limit_nsamples", "limit_nsamples_val"):
            limit = getattr(self, name)
            if limit is not None and limit < 1:
                raise InvalidValue(name, f"expected a number of samples >= 1 or null (no limit), got {limit}")

    def root_path(self) -> Path:
        """``root`` with ``~`` and ``$VARS`` expanded."""
        return Path(os.path.expandvars(os.path.expanduser(self.root)))
