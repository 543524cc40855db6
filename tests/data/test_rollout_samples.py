"""Multi-step training samples: an initial state and the K states after it, never across a trajectory's end,
normalized as the model reads them; ERA5's year files give the states its own samples hold."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dlscale.data.era5.config import ERA5DataConfig
from dlscale.data.era5.dataset import ERA5Dataset
from dlscale.data.rollout_samples import RolloutSamples
from dlscale.data.trajectories import ForecastStart
from dlscale.errors import ConfigError
from dlscale.workloads.era5_vit import WORKLOAD as ERA5


class Counting:
    """Trajectories whose state t of trajectory j is the constant field 100 j + t (2 channels, 2 x 3 grid), so a
    sample's values say which states it holds; ``dt`` stored states per model step."""

    def __init__(self, lengths=(6, 4), dt=1, sample_limit=None):
        self.lengths, self.dt = lengths, dt
        if sample_limit is not None:
            self.sample_limit = sample_limit

    def starts(self):
        return [ForecastStart(j, t) for j, n in enumerate(self.lengths) for t in range(n)]

    def reach(self, start):
        return (self.lengths[start.trajectory] - 1 - start.step) // self.dt

    def states(self, starts, lead):
        values = [100.0 * s.trajectory + s.step + lead * self.dt for s in starts]
        assert all(s.step + lead * self.dt < self.lengths[s.trajectory] for s in starts)
        return torch.tensor(values).reshape(-1, 1, 1, 1).expand(-1, 2, 2, 3).clone()

    def normalize(self, states):
        return (states - 1.0) / 2.0

    def describe(self):
        return "counting trajectories"


def raw(tensor):
    return tensor[..., 0, 0, 0] * 2.0 + 1.0  # undo the normalization, one value per state


def test_a_sample_is_k_plus_one_consecutive_states_of_one_trajectory():
    samples = RolloutSamples(Counting(lengths=(6, 4)), steps=2, split="train")
    # trajectory 0 (6 states): starts 0..3; trajectory 1 (4 states): starts 0..1
    assert len(samples) == 6
    inputs, targets = samples[4]
    assert inputs.shape == (2, 2, 3) and targets.shape == (2, 2, 2, 3)
    assert float(raw(inputs[None])) == 100.0
    assert raw(targets[None])[0].tolist() == [101.0, 102.0]
    last_inputs, last_targets = samples[5]
    assert float(raw(last_inputs[None])) == 101.0 and raw(last_targets[None])[0].tolist() == [102.0, 103.0]


def test_model_steps_of_several_stored_states_reach_dt_states_per_step():
    samples = RolloutSamples(Counting(lengths=(7,), dt=2), steps=3, split="train")
    assert len(samples) == 1  # 7 states: only t = 0 has 3 steps of 2 states after it
    inputs, targets = samples.read_batch([0])
    assert raw(inputs).tolist() == [0.0] and raw(targets)[0].tolist() == [2.0, 4.0, 6.0]


def test_a_batch_read_is_the_stack_of_its_samples_and_fills_given_buffers():
    samples = RolloutSamples(Counting(), steps=2, split="train")
    indices = [5, 0, 3]
    inputs, targets = samples.read_batch(indices)
    torch.testing.assert_close(inputs, torch.stack([samples[i][0] for i in indices]))
    torch.testing.assert_close(targets, torch.stack([samples[i][1] for i in indices]))
    out = (torch.empty_like(inputs), torch.empty_like(targets))
    returned = samples.read_batch(indices, out)
    assert returned[0] is out[0] and returned[1] is out[1]
    torch.testing.assert_close(out[1], targets)
    with pytest.raises(IndexError):
        samples.read_batch([6])


def test_the_sample_limit_keeps_the_first_samples():
    samples = RolloutSamples(Counting(sample_limit=3), steps=1, split="train")
    assert len(samples) == 3 and [s.step for s in samples.starts] == [0, 1, 2]


def test_a_k_longer_than_every_trajectory_is_one_line_naming_k():
    with pytest.raises(
        ConfigError, match=r"train.rollout_steps 6: no trajectory of the valid split holds 7 "
    ):
        RolloutSamples(Counting(lengths=(6, 4)), steps=6, split="valid")


def test_era5_rollout_samples_hold_the_states_of_its_one_step_samples(tiny_era5):
    cfg = ERA5DataConfig(root=str(tiny_era5), img_size=(16, 32), dt=1)
    one_step = ERA5Dataset(cfg, "train")
    samples = RolloutSamples(ERA5.forecast_data(cfg, "train"), steps=3, split="train")
    per_file = [n - 2 for n in one_step.samples_per_file]  # T - 3 per file: a one-step file has T - 1
    assert len(samples) == sum(per_file)
    # Sample i of the second file: its input and targets are the one-step samples i, i+1, i+2 of that file.
    first_of_file = one_step.samples_per_file[0]
    inputs, targets = samples[per_file[0] + 4]
    np.testing.assert_allclose(inputs, one_step[first_of_file + 4][0], rtol=1e-6, atol=1e-6)
    for k in range(3):
        np.testing.assert_allclose(targets[k], one_step[first_of_file + 4 + k][1], rtol=1e-6, atol=1e-6)


def test_era5_rollout_samples_keep_the_runs_sample_limit(tiny_era5):
    cfg = ERA5DataConfig(root=str(tiny_era5), img_size=(16, 32), limit_nsamples=5, limit_nsamples_val=3)
    assert len(RolloutSamples(ERA5.forecast_data(cfg, "train"), 2, "train")) == 5
    assert len(RolloutSamples(ERA5.forecast_data(cfg, "valid"), 2, "valid")) == 3
