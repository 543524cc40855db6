"""One training step: the LR comes from the schedule at the given step; clipping bounds the update."""

from __future__ import annotations

import pytest
import torch

from dlscale.training.metrics import relative_l2_loss
from dlscale.training.schedule import LRSchedule
from dlscale.training.step import TrainStep


def make_step(max_grad_norm=None, lr=0.1) -> tuple[TrainStep, torch.nn.Linear]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=123.0)  # overwritten by the schedule every step
    schedule = LRSchedule(peak_lr=lr, total_steps=10, warmup=4)
    return TrainStep(model, relative_l2_loss, optimizer, schedule, max_grad_norm), model


def test_each_step_uses_the_schedule_lr_of_its_global_step():
    step, _ = make_step()
    inputs, targets = torch.randn(3, 4), torch.randn(3, 4)
    for global_step in (0, 3, 7):
        step(inputs, targets, global_step)
        assert step.optimizer.param_groups[0]["lr"] == pytest.approx(step.schedule.lr_at(global_step))


def test_the_returned_loss_is_detached_and_the_weights_move():
    step, model = make_step()
    before = model.weight.detach().clone()
    loss = step(torch.randn(3, 4), torch.randn(3, 4), global_step=5)
    assert not loss.requires_grad and loss.ndim == 0
    assert not torch.equal(before, model.weight)


def test_gradient_clipping_bounds_the_update():
    inputs, targets = torch.randn(3, 4) * 100, torch.randn(3, 4)
    updates = {}
    for clip in (None, 1e-3):
        step, model = make_step(max_grad_norm=clip, lr=1.0)
        before = [p.detach().clone() for p in model.parameters()]
        step(inputs, targets, global_step=9)  # after the warm-up: LR = cosine value at step 9
        lr = step.schedule.lr_at(9)
        updates[clip] = torch.cat(
            [(b - p.detach()).flatten() for b, p in zip(before, model.parameters(), strict=True)]
        ).norm()
        if clip is not None:
            assert updates[clip] <= lr * clip * (1 + 1e-4)
    assert updates[None] > 10 * updates[1e-3]


def test_adadelta_is_built_with_its_own_settings_and_refuses_fused():
    from dlscale.errors import InvalidValue
    from dlscale.training.optim import build_optimizer
    from dlscale.training.optim_config import OptimConfig

    optimizer = build_optimizer(
        OptimConfig(optimizer="Adadelta", lr=1.0, rho=0.8), [torch.nn.Parameter(torch.ones(2))], 1.0
    )
    assert isinstance(optimizer, torch.optim.Adadelta) and optimizer.param_groups[0]["rho"] == 0.8
    with pytest.raises(InvalidValue, match="Adadelta has no fused"):
        OptimConfig(optimizer="Adadelta", enable_fused=True)
