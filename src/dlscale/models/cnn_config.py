"""The MNIST CNN's ``model:`` config section (no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dlscale.errors import InvalidValue


@dataclass
class CNNConfig:
    """The ``model:`` section: the dropout rates of the workshop's network (its shape is fixed)."""

    dropout1: float = 0.25  # after the max-pool, on the convolutional features
    dropout2: float = 0.5  # after fc1, on the 128 hidden features

    # Keys a resumed run may change: they do not change what the saved weights mean (see resume.py).
    RESUME_SAFE_KEYS: ClassVar[tuple[str, ...]] = ("dropout1", "dropout2")

    def __post_init__(self) -> None:
        for name in ("dropout1", "dropout2"):
            rate = getattr(self, name)
            if not 0.0 <= rate < 1.0:
                raise InvalidValue(name, f"must be a dropout probability in [0, 1), got {rate}")
