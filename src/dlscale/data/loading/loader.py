"""DataLoader options (the ``loader:`` config section) and the loaders built from them."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler, default_convert

from dlscale.data.loading.batch_reads import BatchesAsItems, SupportsBatchReads
from dlscale.data.loading.loader_config import LoaderConfig


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
