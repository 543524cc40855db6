"""The one entry point that turns a data set and the ``loader:`` config into batches for training.

``loader.data_loader_config`` picks the pipeline:

``pytorch``
    torch's DataLoader. ``num_data_workers`` worker processes (0 reads in the training process), each reading
    ``prefetch_factor`` batches ahead (``persistent_workers`` keeps them between epochs); ``pin_memory``
    (null = on with a GPU) makes the batches page-locked. With ``device_prefetch`` (and a GPU) a
    :class:`~dlscale.data.loading.prefetch.DevicePrefetcher` copies the next batch on a side stream while the
    current one computes; without it, host batches are yielded and the trainer's ``device.move`` copies them
    on the compute stream. ``prefetch_depth`` does not apply. A data set with ``read_batch``
    (:class:`~dlscale.data.loading.batch_reads.SupportsBatchReads`, e.g. ERA5) is handed whole batches of keys and
    reads each with one call instead of being read sample by sample and collated.

``gpu`` (``dali`` is an alias: dlscale's own gpu pipeline plays DALI's role; NVIDIA DALI is not used)
    :class:`~dlscale.data.loading.gpu_pipeline.GpuPipeline`: ``max(1, num_data_workers)`` reader threads fill a ring
    of ``prefetch_depth`` host batches, page-locked per ``pin_memory`` (null = on with a GPU); each batch is
    copied on a side stream and normalized on the device. ``prefetch_factor``, ``persistent_workers`` and
    ``device_prefetch`` do not apply (threads start per pass; device prefetching is built in).

Both deliver identical batches for the same sampler and batch size (bitwise on the CPU), on the device.

A data set whose samples change every epoch (``samples_depend_on_epoch``, e.g. random crops) is read with
:class:`~dlscale.data.values.normalization.EpochIndex` keys, (the sampler's epoch, index), by both pipelines.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from torch.utils.data import DataLoader, Dataset, Sampler

from dlscale.data.loading.gpu_pipeline import GpuPipeline
from dlscale.data.loading.loader import build_loader
from dlscale.data.loading.loader_config import LoaderConfig
from dlscale.data.loading.prefetch import DevicePrefetcher
from dlscale.data.values.normalization import EpochIndex, samples_depend_on_epoch
from dlscale.runtime.device import Device

logger = logging.getLogger("dlscale.data")

BatchSource = DataLoader | DevicePrefetcher | GpuPipeline


class EpochKeyedSampler(Sampler[EpochIndex]):
    """``sampler``'s indices as (epoch, index) keys, the epoch read from ``sampler.epoch`` when a pass starts
    (0 for samplers without epochs), so a ``set_epoch`` on the wrapped sampler applies to the next pass."""

    def __init__(self, sampler: Sampler[int]):
        self.sampler = sampler

    def __iter__(self) -> Iterator[EpochIndex]:
        epoch = int(getattr(self.sampler, "epoch", 0))
        return (EpochIndex(epoch, index) for index in self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)  # type: ignore[arg-type]


def build_batch_source(
    dataset: Dataset,
    cfg: LoaderConfig,
    batch_size: int,
    sampler: Sampler[int],
    device: Device,
    seed: int,
) -> BatchSource:
    """An iterable of (inputs, targets) batches of ``dataset`` in ``sampler`` order, per ``cfg.pipeline``.

    Each ``iter()`` is one pass from the sampler's current state (call ``set_epoch`` first); ``len()`` is the
    number of batches of that pass, the last of which may be short. ``seed`` seeds the pytorch loader's own
    generator (the gpu pipeline draws no random numbers). See the module docstring for how the ``loader:``
    options apply to each pipeline.
    """
    if samples_depend_on_epoch(dataset):
        sampler = EpochKeyedSampler(sampler)
    if cfg.pipeline == "gpu":
        if cfg.data_loader_config.startswith("dali"):
            logger.info(
                "data_loader_config %r: dlscale's own gpu pipeline plays DALI's role "
                "(threaded reads, pinned buffers, side-stream copies, normalization on the device); "
                "NVIDIA DALI itself is not used",
                cfg.data_loader_config,
            )
        return GpuPipeline(
            dataset,
            sampler,
            batch_size,
            device,
            num_threads=max(1, cfg.num_data_workers),
            prefetch_depth=cfg.prefetch_depth,
            pin_memory=cfg.pin_memory,
        )
    loader = build_loader(dataset, cfg, batch_size, sampler, device.pin_memory_default, seed)
    if cfg.device_prefetch and device.is_gpu:
        return DevicePrefetcher(loader, device)
    return loader
