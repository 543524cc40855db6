"""One training step: the LR comes from the schedule at the given step; clipping bounds the update."""

from __future__ import annotations

import pytest
import torch

from dlscale.scoring.metrics import relative_l2_loss
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


def test_a_training_loss_hook_gets_the_model_the_batch_and_the_global_step():
    seen = []

    def two_step_rollout(model, batch, step):  # the model applied to its own output, against two targets
        inputs, targets = batch
        first = model(inputs)
        second = model(first)
        seen.append((step, first.dtype))
        return relative_l2_loss(first, targets[0]) + relative_l2_loss(second, targets[1])

    step, model = make_step()
    inputs, targets = torch.randn(3, 4), torch.randn(2, 3, 4)
    with torch.no_grad():
        expected = relative_l2_loss(model(inputs), targets[0]) + relative_l2_loss(
            model(model(inputs)), targets[1]
        )
    step.training_loss = two_step_rollout
    loss = step(inputs, targets, global_step=7)
    assert seen == [(7, torch.float32)] and float(loss) == float(expected)


def test_a_hook_that_computes_the_default_loss_trains_bit_for_bit_like_the_default():
    inputs, targets = torch.randn(3, 4), torch.randn(3, 4)
    weights = []
    for hook in (None, lambda model, batch, step: relative_l2_loss(model(batch[0]), batch[1])):
        step, model = make_step()
        step.training_loss = hook
        for global_step in range(3):
            step(inputs, targets, global_step)
        weights.append(model.weight.detach().clone())
    assert torch.equal(weights[0], weights[1])


def test_the_hooks_model_runs_under_the_runs_autocast_and_returns_float32():
    from dlscale.runtime.device import Device
    from dlscale.training.precision import Precision
    from dlscale.training.training_loss import ModelForLoss

    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    inputs = torch.randn(8, 64)
    eager = ModelForLoss(model, Precision("none", Device("cpu")))(inputs)
    bf16 = ModelForLoss(model, Precision("bf16", Device("cpu")))(inputs)
    assert bf16.dtype == eager.dtype == torch.float32
    assert not torch.equal(bf16, eager)  # the matmul ran in bf16
    torch.testing.assert_close(bf16, eager, rtol=0.05, atol=0.05)


def test_the_hooks_model_is_the_steps_forward_the_compiled_or_data_parallel_one():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    calls = []

    def forward(inputs):  # stands for torch.compile(model) or the DDP wrapper: what the step must call
        calls.append(inputs.shape)
        return model(inputs)

    step = TrainStep(
        model, relative_l2_loss, torch.optim.SGD(model.parameters(), lr=0.1), LRSchedule(0.1, 10, 0),
        forward=forward, training_loss=lambda m, batch, step: relative_l2_loss(m(m(batch[0])), batch[1]),
    )  # fmt: skip
    step(torch.randn(3, 4), torch.randn(3, 4), global_step=0)
    assert calls == [torch.Size([3, 4])] * 2
