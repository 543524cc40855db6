"""The ResNet's ``model:`` config section and its depth table (no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from dlscale.errors import InvalidValue

# depth -> (block kind, blocks per stage), as in the ResNet paper (table 1) and torchvision.
STAGES: dict[int, tuple[str, tuple[int, int, int, int]]] = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
    152: ("bottleneck", (3, 8, 36, 3)),
}


EXPANSION = {"basic": 1, "bottleneck": 4}


@dataclass
class ResNetConfig:
    """The ``model:`` section of the ResNet workloads."""

    depth: int = 152  # 18, 34 (BasicBlock), 50, 101, 152 (Bottleneck)
    num_classes: int = 100  # outputs of the final linear layer; must match the data's labels
    width: int = 64  # channels of the first stage (torchvision: 64); smaller values make CPU-sized models
    small_input_stem: bool = False  # 3x3 stride-1 stem, no max-pool (for 32x32 inputs) instead of ImageNet's

    def __post_init__(self) -> None:
        if self.depth not in STAGES:
            raise InvalidValue("depth", f"must be one of {', '.join(map(str, STAGES))}, got {self.depth}")
        if self.num_classes < 2:
            raise InvalidValue("num_classes", f"must be >= 2, got {self.num_classes}")
        if self.width < 1:
            raise InvalidValue("width", f"must be >= 1, got {self.width}")

    @property
    def block_kind(self) -> str:
        """``basic`` or ``bottleneck``."""
        return STAGES[self.depth][0]
