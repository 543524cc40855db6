"""The ``loader:`` config section: how batches are read (workers, pinned memory, prefetching, pipeline; no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dlscale.errors import InvalidValue


@dataclass
class LoaderConfig:
    """How batches are read: worker processes, pinned memory, prefetching, and which pipeline."""

    num_data_workers: int = 0  # DataLoader worker processes (0 reads in the training process)
    pin_memory: bool | None = (
        None  # page-locked host batches for faster copies; null = on when training on a GPU
    )
    persistent_workers: bool = True  # keep workers alive between epochs (only with workers > 0)
    prefetch_factor: int | None = None  # batches each worker reads ahead; null = torch's default (2)
    # pipeline; dali (and the U-Net tutorial's dali-lowmem) = dlscale's gpu one
    data_loader_config: Literal["pytorch", "gpu", "dali", "dali-lowmem"] = "pytorch"
    prefetch_depth: int = 2  # gpu pipeline: batches read and copied ahead of the one being trained on
    device_prefetch: bool = True  # pytorch pipeline: copy the next batch to the GPU while this one computes
    shuffle: bool = True  # shuffle the training samples each epoch (validation is read in order)

    def __post_init__(self) -> None:
        if self.num_data_workers < 0:
            raise InvalidValue("num_data_workers", f"must be >= 0, got {self.num_data_workers}")
        if self.prefetch_factor is not None and self.prefetch_factor < 1:
            raise InvalidValue("prefetch_factor", f"must be >= 1 or null, got {self.prefetch_factor}")
        if self.prefetch_depth < 1:
            raise InvalidValue("prefetch_depth", f"must be >= 1, got {self.prefetch_depth}")

    @property
    def pipeline(self) -> str:
        """The pipeline to build: "pytorch" or "gpu" ("dali" names the role dlscale's gpu pipeline plays)."""
        return "gpu" if self.data_loader_config in ("gpu", "dali", "dali-lowmem") else "pytorch"
