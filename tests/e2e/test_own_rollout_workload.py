"""A workload of one's own trains on its rollouts with no code beyond ``forecast_data``: a linear decay process,
x(t+1) = 0.9 x(t), learnt by a 1x1 convolution from 3-step rollouts, through the public API."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

import dlscale
from dlscale.checkpoint.files import load_checkpoint
from dlscale.data.trajectories import ForecastStart
from dlscale.workloads.protocol import Workload

DECAY, LENGTH, CHANNELS = 0.9, 12, 2


@dataclass
class DecayData:
    trajectories: int = 6


@dataclass
class DecayModel:
    bias: bool = False


def trajectory(seed: int) -> np.ndarray:
    """(LENGTH, CHANNELS, 1, 4) float32 states of one decaying trajectory."""
    start = np.random.default_rng(seed).normal(size=(CHANNELS, 1, 4))
    return np.stack([start * DECAY**t for t in range(LENGTH)]).astype(np.float32)


class DecayTrajectories:
    step_hours = hours_per_state = 1.0
    channel_names, units, long_names = ("a", "b"), ("", ""), ("a", "b")
    latitudes, longitudes = np.zeros(1), np.arange(4.0)

    def __init__(self, seeds):
        self.states_of = [torch.from_numpy(trajectory(seed)) for seed in seeds]

    def starts(self):
        return [ForecastStart(j, t) for j in range(len(self.states_of)) for t in range(LENGTH)]

    def reach(self, start):
        return LENGTH - 1 - start.step

    def states(self, starts, lead):
        return torch.stack([self.states_of[s.trajectory][s.step + lead] for s in starts])

    def normalize(self, states):
        return states.clone()

    def to_physical(self, normalized):
        return normalized.clone()

    def climatology(self):
        return None

    def describe(self):
        return f"{len(self.states_of)} decaying trajectories"


class OneStepPairs(torch.utils.data.Dataset):
    def __init__(self, seeds):
        self.pairs = [(x[t], x[t + 1]) for x in map(trajectory, seeds) for t in range(LENGTH - 1)]

    def __len__(self):
        return len(self.pairs)

    def __getitem__(self, index):
        inputs, targets = self.pairs[index]
        return torch.from_numpy(inputs), torch.from_numpy(targets)


class Decay(Workload):
    name = "decay"
    data_config = DecayData
    model_config = DecayModel

    def seeds(self, cfg, split):
        return {"train": range(cfg.trajectories), "valid": range(100, 102)}[split]

    def build_datasets(self, data_cfg):
        return {split: OneStepPairs(self.seeds(data_cfg, split)) for split in ("train", "valid")}

    def build_model(self, model_cfg, data_cfg):
        return torch.nn.Conv2d(CHANNELS, CHANNELS, 1, bias=model_cfg.bias)

    def loss(self, prediction, target):
        return torch.nn.functional.mse_loss(prediction, target)

    def forecast_data(self, data_cfg, split):
        return DecayTrajectories(self.seeds(data_cfg, split))


def test_an_own_workload_learns_its_dynamics_from_3_step_rollouts(tmp_path):
    config = tmp_path / "decay.yaml"
    config.write_text(
        "base:\n  workload: test_own_rollout_workload:Decay\n"
        "  train: {global_batch_size: 6, num_epochs: 30, rollout_steps: 3}\n"
        "  optim: {lr: 0.05, warmup: 0}\n"
    )
    summary = dlscale.train(
        config, "base", [f"log.expdir={tmp_path}", "log.progress=none", "log.tensorboard=false"]
    )
    assert summary["final"]["metrics"]["loss(3-step rollout)"] < 1e-3
    log_text = (tmp_path / "base" / "00" / "out.log").read_text()
    assert "54 samples of 4 consecutive states from the train split (6 decaying trajectories)" in log_text
    saved = load_checkpoint(tmp_path / "base" / "00" / "checkpoints" / "ckpt_latest.pt")["model"]["weight"]
    expected = DECAY * torch.eye(CHANNELS).reshape(CHANNELS, CHANNELS, 1, 1)
    torch.testing.assert_close(saved, expected, atol=0.02, rtol=0)


@pytest.mark.parametrize("steps", [1, 3])
def test_the_rollout_loss_of_the_true_dynamics_is_zero(steps):
    from dlscale.data.rollout_samples import RolloutSamples
    from dlscale.training.rollout_loss import rollout_loss

    samples = RolloutSamples(Decay().forecast_data(DecayData(), "train"), steps, "train")
    inputs, targets = samples.read_batch(list(range(len(samples))))
    model = torch.nn.Conv2d(CHANNELS, CHANNELS, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(DECAY * torch.eye(CHANNELS).reshape(CHANNELS, CHANNELS, 1, 1))
        assert float(rollout_loss(model, inputs, targets, steps, Decay().loss)) < 1e-12
        model.weight.mul_(1.05)
        assert float(rollout_loss(model, inputs, targets, steps, Decay().loss)) > 1e-6
