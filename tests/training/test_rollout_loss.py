"""The multi-step loss: the model fed its own predictions, each against the right target, averaged over K, with
the gradient through every step, and the same numbers with activation checkpointing."""

from __future__ import annotations

import logging

import pytest
import torch

from dlscale.training.rollout_curriculum import RolloutCurriculum
from dlscale.training.rollout_loss import RolloutLoss, rollout_loss


def mse(prediction, target):
    return ((prediction - target) ** 2).mean()


def linear_model(seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(3, 3, bias=False)


def batch(k_max: int = 4):
    generator = torch.Generator().manual_seed(1)
    return torch.randn(5, 3, generator=generator), torch.randn(5, k_max, 3, generator=generator)


def test_the_loss_is_the_mean_over_k_steps_of_the_model_fed_its_own_output():
    model = linear_model()
    inputs, targets = batch()
    weight = model.weight.detach()
    # By hand: x_k = x_{k-1} W^T, the k-th against targets[:, k-1], averaged over the 3 steps.
    states, expected = inputs, 0.0
    for k in range(3):
        states = states @ weight.T
        expected += float(((states - targets[:, k]) ** 2).mean())
    with torch.no_grad():
        got = rollout_loss(model, inputs, targets, 3, mse)
    assert float(got) == pytest.approx(expected / 3, rel=1e-6)


def test_the_gradient_flows_through_every_step():
    model = linear_model()
    inputs, targets = batch()
    rollout_loss(model, inputs, targets, 2, mse).backward()
    got = model.weight.grad.clone()
    # The same loss with the first step's output detached: its gradient misses the path through step 1.
    model.zero_grad()
    first = model(inputs)
    second = model(first.detach())
    ((mse(first, targets[:, 0]) + mse(second, targets[:, 1])) / 2).backward()
    assert not torch.allclose(got, model.weight.grad)
    # ... and the full unrolled graph by hand gives it exactly.
    model.zero_grad()
    first = model(inputs)
    ((mse(first, targets[:, 0]) + mse(model(first), targets[:, 1])) / 2).backward()
    torch.testing.assert_close(got, model.weight.grad)


@pytest.mark.parametrize("steps", [1, 3])
def test_checkpointing_gives_the_same_loss_and_gradients_with_dropout(steps):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 3))
    inputs, targets = batch()
    results = []
    for checkpointing in (False, True):
        model.zero_grad()
        torch.manual_seed(7)  # the same dropout masks in both runs; recomputation must replay them
        loss = rollout_loss(model, inputs, targets, steps, mse, checkpointing)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (plain_loss, plain_grads), (ckpt_loss, ckpt_grads) = results
    torch.testing.assert_close(ckpt_loss, plain_loss, rtol=0, atol=0)
    for plain, ckpt in zip(plain_grads, ckpt_grads, strict=True):
        torch.testing.assert_close(ckpt, plain, rtol=1e-6, atol=1e-7)


def test_checkpointing_keeps_fewer_tensors_for_backward():
    model = torch.nn.Sequential(torch.nn.Linear(3, 64), torch.nn.GELU(), torch.nn.Linear(64, 3))
    inputs, targets = batch()
    saved = {}
    for checkpointing in (False, True):
        count = [0]

        def pack(tensor, count=count):
            count[0] += tensor.numel()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            rollout_loss(model, inputs, targets, 4, mse, checkpointing)
        saved[checkpointing] = count[0]
    assert saved[True] < saved[False] / 2


def test_the_hook_takes_k_from_the_curriculum_at_each_global_step(caplog):
    calls = []

    def model(x):
        calls.append(1)
        return x

    hook = RolloutLoss(mse, RolloutCurriculum((0, 10), (1, 3)))
    inputs, targets = batch()
    with caplog.at_level(logging.INFO, "dlscale.train"):
        hook(model, (inputs, targets), 9)
        assert len(calls) == 1
        hook(model, (inputs, targets), 10)
        assert len(calls) == 4
        hook(model, (inputs, targets), 11)
    said = [r.getMessage() for r in caplog.records if "Multi-step training" in r.getMessage()]
    assert said == [
        "Multi-step training: 1-step rollouts from global step 9 on",
        "Multi-step training: 3-step rollouts from global step 10 on",
    ]


def test_targets_shorter_than_k_are_refused():
    inputs, targets = batch(k_max=2)
    with pytest.raises(ValueError, match=r"a 3-step rollout needs targets of shape \(B, >= 3"):
        rollout_loss(lambda x: x, inputs, targets, 3, mse)
