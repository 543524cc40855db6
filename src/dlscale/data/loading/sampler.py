"""Which samples each rank reads at each step: reproducible, resumable, independent of the number of ranks.

Training: every rank draws the same permutation of the whole data set for an epoch (seeded by the run seed and
the epoch number). Step ``s`` of the epoch uses positions ``[s*G, (s+1)*G)`` of that permutation, where ``G``
is the global batch size, and rank ``r`` of ``R`` reads its slice ``[s*G + r*b, s*G + (r+1)*b)`` with
``b = G / R``. Consequences:

* the samples of a global batch do not depend on how many ranks share it, so 2 ranks x batch b see exactly
  what 1 rank x batch 2b sees, and a run can resume on a different number of ranks;
* a run can start at any step of an epoch (resume) without reading the skipped samples;
* the last ``N mod G`` samples of each (shuffled) epoch are left out, so every step has a full batch.

Validation: each rank reads every R-th sample in order, nothing dropped and nothing padded, so metrics summed
over ranks equal the single-rank metrics exactly.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of epoch ``epoch``'s shuffle: distinct per epoch, identical on every rank."""
    return (seed * 1_000_003 + epoch) % (2**63)


class TrainingSampler(Sampler[int]):
    """Yields the sample indices one rank reads during one epoch, from a chosen step on."""

    def __init__(
        self,
        num_samples: int,
        global_batch_size: int,
        num_shards: int = 1,
        shard_id: int = 0,
        shuffle: bool = True,
        seed: int = 0,
    ):
        if num_shards < 1 or global_batch_size < 1:
            raise ValueError(
                f"need num_shards >= 1 and global_batch_size >= 1, got {num_shards}, {global_batch_size}"
            )
        if global_batch_size % num_shards:
            raise ValueError(f"global batch {global_batch_size} is not divisible by {num_shards} ranks")
        if not 0 <= shard_id < num_shards:
            raise ValueError(f"shard_id {shard_id} is outside [0, {num_shards})")
        self.num_samples = num_samples
        self.global_batch_size = global_batch_size
        self.local_batch_size = global_batch_size // num_shards
        self.num_shards = num_shards
        self.shard_id = shard_id
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.start_step = 0

    @property
    def steps_per_epoch(self) -> int:
        return self.num_samples // self.global_batch_size

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        """Choose the epoch (for the shuffle) and the step to start from (non-zero when resuming)."""
        if not 0 <= start_step <= self.steps_per_epoch:
            raise ValueError(f"start_step {start_step} is outside [0, {self.steps_per_epoch}]")
        self.epoch = epoch
        self.start_step = start_step

    def epoch_order(self) -> torch.Tensor:
        """The order of all samples in the current epoch (the same on every rank)."""
        if not self.shuffle:
            return torch.arange(self.num_samples)
        generator = torch.Generator().manual_seed(epoch_seed(self.seed, self.epoch))
        return torch.randperm(self.num_samples, generator=generator)

    def __iter__(self) -> Iterator[int]:
        order = self.epoch_order()
        offset = self.shard_id * self.local_batch_size
        for step in range(self.start_step, self.steps_per_epoch):
            first = step * self.global_batch_size + offset
            yield from order[first : first + self.local_batch_size].tolist()

    def __len__(self) -> int:
        return (self.steps_per_epoch - self.start_step) * self.local_batch_size


class EvaluationSampler(Sampler[int]):
    """Every sample once, in order; rank ``r`` of ``R`` reads samples r, r+R, r+2R, ..."""

    def __init__(self, num_samples: int, num_shards: int = 1, shard_id: int = 0):
        if not 0 <= shard_id < num_shards:
            raise ValueError(f"shard_id {shard_id} is outside [0, {num_shards})")
        self.num_samples = num_samples
        self.num_shards = num_shards
        self.shard_id = shard_id

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.shard_id, self.num_samples, self.num_shards))

    def __len__(self) -> int:
        return len(range(self.shard_id, self.num_samples, self.num_shards))
