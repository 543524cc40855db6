"""Normalization that a data pipeline can move onto the device: the protocol a data set implements, and the
per-channel normalizer of gridded fields.

The data set stays the one definition of its samples: the device path must reproduce them exactly (bitwise on
the CPU), which the gpu pipeline's tests check against the pytorch loader.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import torch
from torch.utils.data import Dataset


class BatchNormalizer(Protocol):
    """Turns a batch of raw (inputs, targets) device tensors into what the data set's ``__getitem__`` gives."""

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
    their own ``__getitem__``, normalized on the host by the reader threads.
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
        inputs.sub_(self.input_means).div_(self.input_stds)
        targets.sub_(self.target_means).div_(self.target_stds)
        return inputs, targets

    def __repr__(self) -> str:
        return (
            f"ChannelNormalizer(inputs={self.input_means.shape[0]} channels, "
            f"targets={self.target_means.shape[0]} channels, device={self.input_means.device})"
        )


def _channel_stat(values: np.ndarray | torch.Tensor) -> torch.Tensor:
    """1-D statistics as a float32 (C, 1, 1) tensor that broadcasts over (batch, C, H, W)."""
    tensor = torch.as_tensor(values, dtype=torch.float32).detach().clone()
    return tensor.reshape(-1, 1, 1)
