"""An ensemble forecast's memory, checked before its first step: the estimate covers what a rollout of the ensemble
really holds (counted tensor by tensor), grows with the members as the sums, the scores and the model's batch do,
and an ensemble too large for the memory is one line naming what it needs, what is available and the largest
--members that fits."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import torch
from torch import nn

from dlscale.data.trajectories import ForecastStart
from dlscale.errors import ConfigError
from dlscale.perf.inference_memory import LiveTensorBytes, peak_step_bytes, step_bytes_per_sample
from dlscale.run.forecast_memory import (
    MEMORY_SHARE,
    NOISE_BYTES_PER_VALUE,
    AvailableMemory,
    EnsembleShape,
    check_ensemble_memory,
    ensemble_memory,
    largest_fitting_members,
)
from dlscale.scoring.perturbation_spec import GAUSSIAN, Perturbation
from dlscale.scoring.perturbations import ensemble_members
from dlscale.scoring.rollout import roll_out

CHANNELS, HEIGHT, WIDTH = 3, 16, 32
CPU = torch.device("cpu")


class GlobeTrajectories:
    """Three channels on a global 16 x 32 grid, one trajectory of 8 states: smooth waves."""

    channel_names = ("a", "b", "c")
    units = ("K", "m", "m/s")
    long_names = channel_names
    step_hours = 6.0
    hours_per_state = 6.0
    latitudes = np.linspace(84.375, -84.375, HEIGHT)
    longitudes = np.arange(WIDTH) * 360.0 / WIDTH

    def starts(self) -> list[ForecastStart]:
        return [ForecastStart(0, step) for step in range(4)]

    def states(self, starts: Sequence[ForecastStart], lead: int) -> torch.Tensor:
        time = torch.tensor([s.step + lead for s in starts], dtype=torch.float32).view(-1, 1, 1, 1)
        rows = torch.arange(HEIGHT, dtype=torch.float32).view(1, 1, -1, 1)
        columns = torch.arange(WIDTH, dtype=torch.float32).view(1, 1, 1, -1)
        channel = torch.arange(1, CHANNELS + 1, dtype=torch.float32).view(1, -1, 1, 1)
        return channel * torch.sin(columns / 3 - time / 2 + rows / 4)

    def normalize(self, states: torch.Tensor) -> torch.Tensor:
        return states / 2

    def to_physical(self, normalized: torch.Tensor) -> torch.Tensor:
        return normalized * 2


def small_model() -> nn.Module:
    """A model with activations of its own: 16 feature maps between two convolutions."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(CHANNELS, 16, 3, padding=1), nn.GELU(), nn.Conv2d(16, CHANNELS, 3, padding=1)
    ).eval()


def test_a_models_step_costs_the_same_bytes_for_every_sample_of_its_batch():
    model = small_model()
    per_sample = step_bytes_per_sample(model, (CHANNELS, HEIGHT, WIDTH), CPU)
    feature_maps = 16 * HEIGHT * WIDTH * 4
    assert per_sample >= feature_maps  # at least the hidden feature maps
    eight, one = (peak_step_bytes(model, (n, CHANNELS, HEIGHT, WIDTH), CPU) for n in (8, 1))
    assert eight - one == 7 * per_sample


def test_the_estimate_covers_what_a_rollout_of_the_ensemble_holds():
    model, trajectories, count, batch = small_model(), GlobeTrajectories(), 24, 2
    perturbation = Perturbation(GAUSSIAN, 0.1, 500.0)
    members = ensemble_members(
        perturbation, count, trajectories.latitudes, trajectories.longitudes, model, model, seed=0
    )
    shape = EnsembleShape(
        batch=lambda _: batch,
        leads=3,
        channels=CHANNELS,
        height=HEIGHT,
        width=WIDTH,
        histogram_leads=1,
        noise_bytes_per_value=NOISE_BYTES_PER_VALUE,
        model_bytes_per_sample=step_bytes_per_sample(members.predict, (CHANNELS, HEIGHT, WIDTH), CPU),
    )
    estimate = ensemble_memory(shape, count)
    with LiveTensorBytes() as held:
        rollout = roll_out(model, trajectories, trajectories.starts(), 2, batch, CPU, members=members)
    assert rollout.ensemble is not None and rollout.ensemble.members.rank_counts.shape == (
        3,
        CHANNELS,
        count + 1,
    )
    # The rollout's tensors (the sums are numpy arrays: the estimate's `sums`) at their peak, against a batch's
    # peak in the estimate; it may err on the safe side, not by much.
    assert held.peak <= estimate.host(on_gpu=False) - estimate.sums - estimate.document < 1.5 * held.peak
    assert estimate.sums == 8 * (3 * CHANNELS * (count + 1) + 3 * count)


def test_what_grows_with_the_members_grows_in_the_estimate():
    # the default batch: the run's 16 samples divided by the members, at least one initial time
    shape = EnsembleShape(
        lambda m: max(1, 16 // m), 41, 20, 32, 64, 3, NOISE_BYTES_PER_VALUE, 50_000, ranks=2
    )
    single, double = ensemble_memory(shape, 400), ensemble_memory(shape, 800)  # one initial time a batch
    for part in ("held", "model_step", "scoring", "noise"):
        assert getattr(double, part) == 2 * getattr(single, part), part
    assert 1.9 < double.sums / single.sums < 2.1 and 1.9 < double.document / single.document < 2.1
    assert ensemble_memory(shape, 2).model_step == ensemble_memory(shape, 16).model_step  # 16 samples each
    assert double.host(on_gpu=False) > double.host(on_gpu=True)  # on a GPU the batch is the device's


def test_an_ensemble_too_large_is_one_line_with_what_it_needs_and_the_largest_that_fits():
    shape = EnsembleShape(lambda m: max(1, 16 // m), 41, 20, 32, 64, 3, NOISE_BYTES_PER_VALUE, 50_000)
    available = AvailableMemory(host=8 * 10**9)
    with pytest.raises(ConfigError) as caught:
        check_ensemble_memory(shape, 100_000_000, available)
    message = str(caught.value)
    assert message.startswith("--members 100000000: the ensemble needs ") and "\n" not in message
    assert "of host memory before its first step" in message and "8 GB available" in message
    fitting = int(message.split("; --members ")[1].split(" fits")[0])
    assert ensemble_memory(shape, fitting).host(False) <= MEMORY_SHARE * available.host
    assert ensemble_memory(shape, fitting + 1).host(False) > MEMORY_SHARE * available.host
    assert largest_fitting_members(shape, available, 100_000_000) == fitting
    assert check_ensemble_memory(shape, fitting, available).members == fitting

    on_gpu = AvailableMemory(host=10**12, device=2 * 10**9, device_name="cuda:0")
    with pytest.raises(ConfigError, match=r"needs .* of GPU \(cuda:0\) memory .* of the 2 GB available"):
        check_ensemble_memory(shape, 100_000, on_gpu)
    with pytest.raises(ConfigError, match="not even --members 2 fits"):
        check_ensemble_memory(shape, 100, AvailableMemory(host=10**5))
