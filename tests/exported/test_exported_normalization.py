"""``ExportedModel.normalize`` and ``denormalize``: inputs with the input statistics, predictions with the output
statistics. ERA5's inputs and outputs share their statistics, so only statistics that differ tell them apart."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from dlscale.exported.loader import ExportedModel


def exported_with(stats: dict[str, np.ndarray]) -> ExportedModel:
    return ExportedModel(torch.nn.Identity(), {}, "test", stats, {}, Path("export"))


def channel_stat(*values: float) -> np.ndarray:
    """A (C, 1, 1) float32 statistic, one value per channel."""
    return np.array(values, dtype=np.float32).reshape(-1, 1, 1)


DIFFERENT_STATS = {
    "input_mean": channel_stat(10.0, 20.0),
    "input_std": channel_stat(2.0, 4.0),
    "output_mean": channel_stat(100.0, 200.0),
    "output_std": channel_stat(5.0, 10.0),
}


def test_normalize_uses_the_input_statistics():
    raw = torch.tensor([14.0, 28.0]).reshape(1, 2, 1, 1)  # 2 input stds above each channel's input mean
    normalized = exported_with(DIFFERENT_STATS).normalize(raw)
    assert torch.equal(normalized, torch.full((1, 2, 1, 1), 2.0))


def test_denormalize_uses_the_output_statistics():
    predicted = torch.tensor([1.0, -1.0]).reshape(1, 2, 1, 1)
    physical = exported_with(DIFFERENT_STATS).denormalize(predicted)
    assert torch.equal(physical, torch.tensor([105.0, 190.0]).reshape(1, 2, 1, 1))


def test_without_statistics_values_pass_through_as_floats():
    exported = exported_with({})
    pixels = exported.normalize(np.array([[3, 4]]))  # integers, e.g. raw image bytes
    assert pixels.dtype == torch.float32 and torch.equal(pixels, torch.tensor([[3.0, 4.0]]))
    assert torch.equal(exported.denormalize(torch.tensor([0.5])), torch.tensor([0.5]))
