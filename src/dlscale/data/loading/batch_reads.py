"""Data sets that read a whole batch at once, and how a DataLoader hands them whole batches of keys.

Reading sample by sample and stacking costs a per-sample allocation, a collation copy and per-sample
normalization; a data set that knows its storage can do better (ERA5: HDF5 writes each sample straight into
its row of the batch, normalized at once). Both pipelines use ``read_batch`` when a data set has it: the
pytorch loader reads each batch with one call, the gpu pipeline's reader threads read into the ring's slots.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from torch.utils.data import Dataset


@runtime_checkable
class SupportsBatchReads(Protocol):
    """A data set of (inputs, targets) samples that reads a batch faster than sample by sample.

    ``read_batch(indices, out=None)`` returns ``(inputs, targets)``: exactly ``torch.stack`` of the samples'
    inputs and of their targets. ``out`` optionally gives the two contiguous tensors to fill (rows of a ring
    buffer), which are then returned.
    """

    def read_batch(
        self, indices: Sequence[Any], out: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class BatchesAsItems(Dataset):
    """Item ``indices`` is ``dataset.read_batch(indices)``: with a batch sampler as a DataLoader's sampler (and
    ``batch_size=None``), its workers then read whole batches, each with one call. No ``__len__``: the loader's
    length is its batch sampler's, and the number of samples would misstate the number of items."""

    def __init__(self, dataset: SupportsBatchReads):
        self.dataset = dataset

    def __getitem__(self, indices: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.dataset.read_batch(indices)
