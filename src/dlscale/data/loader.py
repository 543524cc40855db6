"""DataLoader options (the ``loader:`` config section) and the loaders built from them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler, default_convert

from dlscale.data.batch_reads import BatchesAsItems, SupportsBatchReads
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


def _seed_worker(worker_id: int) -> None:
    """Give numpy in each worker its own seed, derived from the loader's seed (torch seeds itself)."""
    np.random.seed(torch.initial_seed() % 2**32)


def build_loader(
    dataset: Dataset,
    cfg: LoaderConfig,
    batch_size: int,
    sampler: Sampler[int],
    pin_memory_default: bool,
    seed: int,
) -> DataLoader:
    """A DataLoader over ``sampler``'s indices in batches of ``batch_size`` (the last batch may be short).

    The loader gets its own random generator, so creating its iterator never draws from the global torch
    RNG: the model's random state (dropout) then does not depend on when epochs start, which exact resume needs.
    """
    workers = cfg.num_data_workers
    if isinstance(dataset, SupportsBatchReads):
        # The loader's sampler yields whole batches of keys (as its batch sampler would) and the data set
        # reads each one at once; default_convert leaves the batch as it is, as collation would return it.
        dataset, sampler = BatchesAsItems(dataset), BatchSampler(sampler, batch_size, drop_last=False)
        batch_size, collate_fn = None, default_convert
    else:
        collate_fn = None  # torch's default_collate
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        collate_fn=collate_fn,
        num_workers=workers,
        pin_memory=pin_memory_default if cfg.pin_memory is None else cfg.pin_memory,
        persistent_workers=cfg.persistent_workers and workers > 0,
        prefetch_factor=cfg.prefetch_factor if workers > 0 else None,
        worker_init_fn=_seed_worker if workers > 0 else None,
        generator=torch.Generator().manual_seed(seed),
        drop_last=False,
    )
