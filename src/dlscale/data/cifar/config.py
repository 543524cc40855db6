"""The CIFAR workload's ``data:`` config section and the fixed facts of the format (no torch)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

from dlscale.errors import InvalidValue

IMAGE_SIDE = 32


NUM_CLASSES = {"fine": 100, "coarse": 20}


@dataclass
class CIFARDataConfig:
    """The ``data:`` section: where the binary files are, which labels, and how images are converted."""

    root: str = "data/cifar100"  # directory holding cifar-100-binary/ (or that directory itself)
    label: Literal["fine", "coarse"] = "fine"  # fine: 100 classes (the demo's), coarse: the 20 superclasses
    mean: tuple[float, float, float] = (0.5071, 0.4865, 0.4409)  # per-channel (R, G, B) mean on [0, 1]
    std: tuple[float, float, float] = (0.2673, 0.2564, 0.2762)  # per-channel standard deviation on [0, 1]
    resize: int | None = None  # bilinear resize to resize x resize (the demo: 224); null keeps 32x32
    limit_nsamples: int | None = None  # keep only the first N training samples
    limit_nsamples_val: int | None = None  # keep only the first N validation samples
    check_finite: bool = (
        False  # stop at the first batch holding NaN/inf, naming its file and sample (a sync per batch)
    )

    # Fine and coarse labels give the classifier's outputs another meaning (see resume.py).
    WEIGHT_DEFINING_KEYS: ClassVar[tuple[str, ...]] = ("label",)

    def __post_init__(self) -> None:
        if not all(s > 0 for s in self.std):
            raise InvalidValue("std", f"every value must be > 0, got {list(self.std)}")
        if self.resize is not None and self.resize < 1:
            raise InvalidValue(
                "resize", f"must be a side in pixels >= 1 or null (keep 32), got {self.resize}"
            )
        for name in ("limit_nsamples", "limit_nsamples_val"):
            limit = getattr(self, name)
            if limit is not None and limit < 1:
                raise InvalidValue(name, f"expected a number of samples >= 1 or null (no limit), got {limit}")

    @property
    def num_classes(self) -> int:
        """Classes of the chosen labels."""
        return NUM_CLASSES[self.label]

    @property
    def image_size(self) -> tuple[int, int]:
        """(H, W) of the images the model receives."""
        side = self.resize or IMAGE_SIDE
        return side, side

    def root_path(self) -> Path:
        """``root`` with ``~`` and ``$VARS`` expanded."""
        return Path(os.path.expandvars(os.path.expanduser(self.root)))
