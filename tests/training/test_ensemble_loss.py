"""The CRPS training loss (dlscale.training.ensemble_loss): the scoring module's estimator, a case by hand, the
members' noise (seeded per sample, so a batch split over ranks draws what one rank does), and rollouts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from dlscale.errors import InvalidValue
from dlscale.scoring.ensemble_scores import EnsembleScores
from dlscale.scoring.metrics import latitude_weights
from dlscale.training.ensemble_loss import EnsembleCrpsLoss, MemberNoise, ensemble_crps
from dlscale.training.rollout_curriculum import RolloutCurriculum
from dlscale.training.train_config import TrainConfig

LATITUDES = np.array([60.0, 20.0, -20.0, -60.0])


def test_the_loss_is_the_scoring_modules_crps_averaged_over_channels():
    generator = torch.Generator().manual_seed(0)
    members = torch.randn(3, 5, 2, 4, 6, generator=generator, dtype=torch.float64)
    truth = torch.randn(3, 2, 4, 6, generator=generator, dtype=torch.float64)
    scores = EnsembleScores(1, 2, 5, LATITUDES)
    scores.add(0, members, truth)
    loss = ensemble_crps(members, truth, latitude_weights(LATITUDES, torch.float64))
    assert loss.item() == pytest.approx(scores.crps()[0].mean(), rel=1e-12)


def test_two_members_by_hand():
    # one point, one channel: members 0 and 4, truth 5
    # E|X - y| = (5 + 1) / 2 = 3; E|X - X'| over the M (M - 1) = 2 ordered pairs = (4 + 4) / 2 = 4; CRPS = 3 - 2
    members = torch.tensor([0.0, 4.0]).view(1, 2, 1, 1, 1)
    truth = torch.tensor([5.0]).view(1, 1, 1, 1)
    assert ensemble_crps(members, truth, torch.ones(1)).item() == pytest.approx(1.0)
    # the truth between them: 2 - 0.5 * 4 = 0 (a spread as wide as the error costs nothing)
    assert ensemble_crps(
        members, torch.tensor([2.0]).view(1, 1, 1, 1), torch.ones(1)
    ).item() == pytest.approx(0.0)


def test_one_member_is_refused():
    with pytest.raises(InvalidValue, match="ensemble_members: 1 with train.loss crps"):
        TrainConfig(loss="crps", ensemble_members=1)
    with pytest.raises(ValueError, match="at least 2 members"):
        EnsembleCrpsLoss(1, MemberNoise(0, 2, (4, 6)), LATITUDES, RolloutCurriculum.constant(1), 0)
    with pytest.raises(InvalidValue, match="only train.loss crps trains an ensemble"):
        TrainConfig(ensemble_members=4)
    with pytest.raises(InvalidValue, match="2 to 64 members"):
        TrainConfig(loss="crps", ensemble_members=65)


def test_member_noise_is_seeded_per_sample_so_a_split_batch_draws_the_same():
    noise = MemberNoise(seed=3, channels=2, grid=(4, 6))
    whole = noise.draw(7, 0, 0, 4, 3, torch.device("cpu"))
    halves = torch.cat(
        [noise.draw(7, 0, 0, 2, 3, torch.device("cpu")), noise.draw(7, 0, 2, 2, 3, torch.device("cpu"))]
    )
    assert whole.shape == (12, 2, 4, 6) and torch.equal(whole, halves)
    assert torch.equal(whole, noise.draw(7, 0, 0, 4, 3, torch.device("cpu")))  # reproducible
    members = whole.view(4, 3, 2, 4, 6)
    assert not torch.equal(members[0, 0], members[0, 1])  # members differ
    for other in (noise.draw(8, 0, 0, 4, 3, torch.device("cpu")), noise.draw(7, 1, 0, 4, 3, torch.device("cpu")),
                  MemberNoise(4, 2, (4, 6)).draw(7, 0, 0, 4, 3, torch.device("cpu"))):  # fmt: skip
        assert not torch.equal(whole, other)  # a new step, rollout step or seed draws anew


class NoisyConv(nn.Module):
    """A state of 2 channels and its 1 noise channel in, the next state out."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 2, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.shape[1] == 3, "the loss appends the noise channel"
        return self.conv(x)


def crps_loss(first_position: int = 0, steps: int = 1, checkpointing: bool = False) -> EnsembleCrpsLoss:
    curriculum = RolloutCurriculum.constant(steps)
    return EnsembleCrpsLoss(
        4, MemberNoise(0, 1, (4, 6)), LATITUDES, curriculum, first_position, checkpointing
    )


def test_the_loss_of_a_batch_split_over_two_ranks_is_the_loss_of_the_whole_batch():
    model = NoisyConv()
    generator = torch.Generator().manual_seed(1)
    inputs, targets = (
        torch.randn(4, 2, 4, 6, generator=generator),
        torch.randn(4, 2, 4, 6, generator=generator),
    )
    whole = crps_loss()(model, (inputs, targets), 5)
    halves = [crps_loss(2 * rank)(model, (inputs[2 * rank : 2 * rank + 2], targets[2 * rank : 2 * rank + 2]), 5)
              for rank in range(2)]  # fmt: skip
    torch.testing.assert_close(whole, (halves[0] + halves[1]) / 2, rtol=1e-6, atol=0)
    # the noise matters: another step draws other noise and gives another loss
    assert crps_loss()(model, (inputs, targets), 6).item() != whole.item()
    whole.backward()
    assert (
        model.conv.weight.grad is not None and model.conv.weight.grad[:, 2].abs().sum() > 0
    )  # noise weights learn


def test_rollouts_roll_each_member_on_its_own_noise_and_checkpointing_changes_nothing():
    model = NoisyConv()
    generator = torch.Generator().manual_seed(2)
    inputs, targets = (
        torch.randn(2, 2, 4, 6, generator=generator),
        torch.randn(2, 3, 2, 4, 6, generator=generator),
    )
    plain = crps_loss(steps=3)(model, (inputs, targets), 0)
    plain.backward()
    grad = model.conv.weight.grad.clone()
    model.zero_grad()
    recomputed = crps_loss(steps=3, checkpointing=True)(model, (inputs, targets), 0)
    recomputed.backward()
    assert recomputed.item() == plain.item()
    torch.testing.assert_close(model.conv.weight.grad, grad, rtol=0, atol=0)
    # by hand: three steps, each member's state fed back with the next step's noise
    noise = MemberNoise(0, 1, (4, 6))
    state, total = inputs.repeat_interleave(4, dim=0), 0.0
    weights = torch.tensor(
        np.cos(np.deg2rad(LATITUDES)), dtype=torch.float32
    )  # by hand, not latitude_weights
    for k in range(3):
        state = model(torch.cat([state, noise.draw(0, k, 0, 2, 4, torch.device("cpu"))], dim=1))
        total += ensemble_crps(state.view(2, 4, 2, 4, 6), targets[:, k], weights / weights.mean())
    torch.testing.assert_close(plain, total / 3)
