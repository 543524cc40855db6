"""Normalization that a data pipeline can move onto the device: the protocol a data set implements, and the
per-channel normalizer of gridded fields. Also the keys of data sets whose samples change every epoch.

The data set stays the one definition of its samples: the device path must reproduce them exactly (bitwise on
the CPU), which the gpu pipeline's tests check against the pytorch loader.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch
from torch.utils.data import Dataset


class EpochIndex(NamedTuple):
    """The key of sample ``index`` read in epoch ``epoch``, for data sets whose samples change every epoch.

    A data set with ``samples_depend_on_epoch = True`` (random crops, augmentation) is indexed with these
    instead of plain indices by both pipelines (see :func:`dlscale.data.loading.pipeline.build_batch_source`), so its
    randomness can be a function of (seed, epoch, index): independent of workers, threads, ranks and resumes,
    which a data set told the epoch by a call could not be (persistent workers never hear of it).
    """

    epoch: int
    index: int


def split_key(key: EpochIndex | int) -> tuple[int, int]:
    """(epoch, index) of a sample key; a plain index is read as epoch 0."""
    if isinstance(key, tuple):
        return int(key[0]), int(key[1])
    return 0, int(key)


def samples_depend_on_epoch(dataset: Any) -> bool:
    """Whether ``dataset`` wants :class:`EpochIndex` keys (its attribute ``samples_depend_on_epoch`` is true)."""
    return getattr(dataset, "samples_depend_on_epoch", False) is True


class BatchNormalizer(Protocol):
    """Turns a batch of raw (inputs, targets) device tensors into what the data set's ``__getitem__`` gives.

    A normalizer whose attribute ``needs_sample_keys`` is true is called as ``normalizer(inputs, targets,
    keys=keys)`` with the keys the batch's samples were read with (indices or :class:`EpochIndex`), for work
    that differs per sample (a random rotation); it may return new tensors, of other shapes than the raw ones.
    """

    def to(self, device: torch.device) -> BatchNormalizer:
        """This normalizer with its statistics on ``device``."""
        ...

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalize a batch; may work in place (the pipeline passes tensors it owns)."""
        ...


@runtime_checkable
class SupportsDeviceNormalization(Protocol):
    """A data set whose normalization the gpu pipeline can move onto the device.

    ``device_normalization()`` returns ``(raw, normalizer)``: ``raw`` is a data set with the same indices whose
    samples are not normalized, and ``normalizer(inputs, targets)`` applied to stacked batches of ``raw``'s
    samples gives exactly the stacked samples of the data set itself. ``normalizer`` is None when the data
    set does not normalize (``raw`` is then read as it is). Data sets without the method are read through
    their own ``__getitem__``, normalized on the host by the reader threads. More generally the "normalizer"
    is any device-side batch transform: with ``needs_sample_keys`` it also gets the batch's keys, so ``raw``
    may hand over partial samples (unrotated crops) or none at all (volumes kept on the device).
    """

    def device_normalization(self) -> tuple[Dataset, BatchNormalizer | None]: ...


class ChannelNormalizer:
    """Per-channel ``(x - mean) / std`` of (batch, channel, ...) tensors, in float32, in place.

    Statistics are float32 tensors shaped (C, 1, 1). Subtraction then division, each rounded to float32, is
    exactly what numpy computes for float32 arrays, so the result is bitwise equal to host normalization.
    """

    def __init__(
        self,
        input_means: np.ndarray | torch.Tensor,
        input_stds: np.ndarray | torch.Tensor,
        target_means: np.ndarray | torch.Tensor,
        target_stds: np.ndarray | torch.Tensor,
    ):
        self.input_means = _channel_stat(input_means)
        self.input_stds = _channel_stat(input_stds)
        self.target_means = _channel_stat(target_means)
        self.target_stds = _channel_stat(target_stds)

    def to(self, device: torch.device) -> ChannelNormalizer:
        """A copy with its statistics on ``device``."""
        stats = (self.input_means, self.input_stds, self.target_means, self.target_stds)
        return ChannelNormalizer(*(stat.to(device) for stat in stats))

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalize the batch in place and return it."""
        self.normalize_as_inputs_(inputs)
        targets.sub_(self.target_means).div_(self.target_stds)
        return inputs, targets

    def normalize_as_inputs_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Normalize ``tensor`` (..., C, H, W) in place with the input statistics: e.g. inputs and targets of
        the same channels stacked in one buffer, in one pass each for the subtraction and the division."""
        return tensor.sub_(self.input_means).div_(self.input_stds)

    def __repr__(self) -> str:
        return (
            f"ChannelNormalizer(inputs={self.input_means.shape[0]} channels, "
            f"targets={self.target_means.shape[0]} channels, device={self.input_means.device})"
        )


def _channel_stat(values: np.ndarray | torch.Tensor) -> torch.Tensor:
    """1-D statistics as a float32 (C, 1, 1) tensor that broadcasts over (batch, C, H, W)."""
    tensor = torch.as_tensor(values, dtype=torch.float32).detach().clone()
    return tensor.reshape(-1, 1, 1)
