"""LR scaling rules, the warm-up + cosine schedule, epoch planning and the optimizer factory."""

from __future__ import annotations

import math

import pytest
import torch

from dlscale.training.optim import build_optimizer
from dlscale.training.optim_config import OptimConfig
from dlscale.training.schedule import EpochPlan, LRSchedule, plan_epochs, scaled_lr

# ---- scaled_lr -------------------------------------------------------------------------------------------


def test_scaled_lr_rules() -> None:
    assert scaled_lr(1e-3, "none", 64, 16) == 1e-3
    assert scaled_lr(1e-3, "sqrt", 64, 16) == pytest.approx(2e-3)  # sqrt(4) = 2
    assert scaled_lr(1e-3, "sqrt", 16, 64) == pytest.approx(0.5e-3)
    assert scaled_lr(1e-3, "sqrt", 32, 16) == pytest.approx(math.sqrt(2) * 1e-3)
    assert scaled_lr(1e-3, "linear", 64, 16) == pytest.approx(4e-3)
    assert scaled_lr(1e-3, "linear", 8, 16) == pytest.approx(0.5e-3)
    for rule in ("none", "sqrt", "linear"):
        assert scaled_lr(3e-4, rule, 16, 16) == pytest.approx(3e-4)  # at the base batch nothing changes


def test_scaled_lr_without_base_batch_keeps_lr_and_unknown_rule_raises() -> None:
    assert scaled_lr(1e-3, "sqrt", 64, None) == 1e-3
    with pytest.raises(ValueError, match="cubic"):
        scaled_lr(1e-3, "cubic", 64, 16)


# ---- LRSchedule ------------------------------------------------------------------------------------------

PEAK, END, TOTAL, WARMUP = 1e-3, 1e-5, 50, 5


def test_warmup_is_linear_from_peak_over_warmup_to_peak() -> None:
    schedule = LRSchedule(PEAK, TOTAL, WARMUP, END)
    assert schedule.lr_at(0) == pytest.approx(PEAK / WARMUP)  # the first step already trains
    warm = [schedule.lr_at(s) for s in range(WARMUP)]
    assert warm == pytest.approx([PEAK * (s + 1) / WARMUP for s in range(WARMUP)])
    assert schedule.lr_at(WARMUP - 1) == pytest.approx(PEAK)
    assert schedule.lr_at(WARMUP) == pytest.approx(PEAK)  # the cosine starts at the peak


def test_cosine_decays_monotonically_towards_end_lr() -> None:
    schedule = LRSchedule(PEAK, TOTAL, WARMUP, END)
    lrs = [schedule.lr_at(s) for s in range(WARMUP, TOTAL + 5)]
    assert all(b <= a for a, b in zip(lrs, lrs[1:], strict=False)), "not monotone after the warm-up"
    assert all(END <= lr <= PEAK for lr in lrs)
    middle = WARMUP + (TOTAL - WARMUP) / 2
    assert schedule.lr_at(int(middle)) == pytest.approx((PEAK + END) / 2, rel=0.1)
    # At total_steps (one past the last trained step) and beyond, the LR is end_lr.
    assert schedule.lr_at(TOTAL) == pytest.approx(END)
    assert schedule.lr_at(TOTAL + 10) == pytest.approx(END)


@pytest.mark.parametrize("warmup", [0, WARMUP])
def test_cosine_reaches_end_lr_right_after_the_last_trained_step(warmup: int) -> None:
    # As torch's CosineAnnealingLR with T_max = total steps: the last trained step (0-based TOTAL - 1) still
    # learns a little, and the LR would be exactly end_lr at step TOTAL, which is not trained.
    schedule = LRSchedule(PEAK, TOTAL, warmup, END)
    assert schedule.lr_at(TOTAL) == pytest.approx(END, rel=1e-9)
    assert END < schedule.lr_at(TOTAL - 1) < END + 0.01 * (PEAK - END)


def test_schedule_without_warmup_starts_at_peak() -> None:
    schedule = LRSchedule(PEAK, TOTAL, 0, END)
    assert schedule.lr_at(0) == pytest.approx(PEAK)
    assert schedule.lr_at(1) < PEAK


def test_constant_kind_stays_at_peak_after_warmup() -> None:
    schedule = LRSchedule(PEAK, TOTAL, WARMUP, END, kind="constant")
    assert schedule.lr_at(0) == pytest.approx(PEAK / WARMUP)
    assert [schedule.lr_at(s) for s in range(WARMUP, TOTAL + 3)] == [PEAK] * (TOTAL + 3 - WARMUP)


def test_state_dict_holds_every_parameter() -> None:
    schedule = LRSchedule(PEAK, TOTAL, WARMUP, END, kind="constant")
    state = schedule.state_dict()
    assert state == {
        "peak_lr": PEAK,
        "total_steps": TOTAL,
        "warmup": WARMUP,
        "end_lr": END,
        "kind": "constant",
    }
    assert LRSchedule(**state) == schedule  # it is enough to rebuild the schedule
    assert (
        LRSchedule(PEAK, TOTAL + 1, WARMUP, END).state_dict()
        != LRSchedule(PEAK, TOTAL, WARMUP, END).state_dict()
    )


# ---- plan_epochs -----------------------------------------------------------------------------------------


def test_num_epochs_wins_over_num_iters() -> None:
    plan = plan_epochs(num_samples=100, global_batch_size=8, num_iters=1000, num_epochs=3)
    assert plan.steps_per_epoch == 12
    assert plan.num_epochs == 3
    assert plan.total_steps == 36


def test_num_iters_rounds_down_to_whole_epochs_and_reports_the_remainder() -> None:
    plan = plan_epochs(100, 8, num_iters=40, num_epochs=None)  # 12 steps per epoch
    assert (plan.num_epochs, plan.total_steps) == (3, 36)
    assert "4 steps not trained" in plan.explanation
    exact = plan_epochs(100, 8, num_iters=36, num_epochs=None)
    assert (exact.num_epochs, exact.total_steps) == (3, 36)
    assert "not trained" not in exact.explanation


def test_num_iters_below_one_epoch_gives_one_partial_epoch() -> None:
    plan = plan_epochs(100, 8, num_iters=5, num_epochs=None)
    assert (plan.num_epochs, plan.total_steps, plan.steps_per_epoch) == (1, 5, 12)
    assert "partial" in plan.explanation
    assert plan.steps_in_epoch(0) == 5
    assert plan.steps_in_epoch(1) == 0


def test_batch_larger_than_data_raises() -> None:
    with pytest.raises(ValueError, match="larger than the 7"):
        plan_epochs(7, 8, num_iters=10, num_epochs=None)


def test_neither_iters_nor_epochs_raises() -> None:
    with pytest.raises(ValueError, match="num_iters or train.num_epochs"):
        plan_epochs(100, 8, num_iters=None, num_epochs=None)


def test_steps_in_epoch() -> None:
    full = plan_epochs(100, 8, num_iters=None, num_epochs=3)
    assert [full.steps_in_epoch(e) for e in range(4)] == [12, 12, 12, 0]
    partial_last = EpochPlan(steps_per_epoch=12, num_epochs=3, total_steps=30, explanation="")
    assert [partial_last.steps_in_epoch(e) for e in range(4)] == [12, 12, 6, 0]
    assert sum(full.steps_in_epoch(e) for e in range(full.num_epochs)) == full.total_steps


# ---- build_optimizer -------------------------------------------------------------------------------------


def params() -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    return list(torch.nn.Linear(3, 2).parameters())


def test_adam_gets_the_configured_hyperparameters() -> None:
    cfg = OptimConfig(optimizer="Adam", betas=(0.8, 0.9), eps=1e-6, weight_decay=0.01)
    optimizer = build_optimizer(cfg, params(), lr=2e-3)
    assert type(optimizer) is torch.optim.Adam
    group = optimizer.param_groups[0]
    assert group["lr"] == 2e-3
    assert tuple(group["betas"]) == (0.8, 0.9)
    assert group["eps"] == 1e-6
    assert group["weight_decay"] == 0.01
    assert len(group["params"]) == 2


def test_adamw_gets_the_configured_hyperparameters() -> None:
    cfg = OptimConfig(optimizer="AdamW", betas=(0.85, 0.99), eps=1e-7, weight_decay=0.1)
    optimizer = build_optimizer(cfg, params(), lr=1e-4)
    assert type(optimizer) is torch.optim.AdamW
    group = optimizer.param_groups[0]
    assert (group["lr"], tuple(group["betas"]), group["eps"], group["weight_decay"]) == (
        1e-4,
        (0.85, 0.99),
        1e-7,
        0.1,
    )


def test_sgd_gets_momentum_and_weight_decay() -> None:
    cfg = OptimConfig(optimizer="SGD", momentum=0.7, weight_decay=0.02)
    optimizer = build_optimizer(cfg, params(), lr=0.1)
    assert type(optimizer) is torch.optim.SGD
    group = optimizer.param_groups[0]
    assert (group["lr"], group["momentum"], group["weight_decay"]) == (0.1, 0.7, 0.02)


@pytest.mark.parametrize("name", ["Adam", "AdamW", "SGD"])
def test_fused_optimizer_steps_on_cpu(name: str) -> None:
    def trained(enable_fused: bool) -> list[torch.Tensor]:
        parameters = params()
        optimizer = build_optimizer(
            OptimConfig(optimizer=name, enable_fused=enable_fused), parameters, lr=1e-2
        )
        assert bool(optimizer.param_groups[0].get("fused")) is enable_fused
        for _ in range(3):
            optimizer.zero_grad()
            sum(p.square().sum() for p in parameters).backward()
            optimizer.step()
        return [p.detach().clone() for p in parameters]

    fused, plain = trained(True), trained(False)
    assert any(not torch.equal(a, b) for a, b in zip(fused, params(), strict=True)), "fused step did nothing"
    for a, b in zip(fused, plain, strict=True):
        torch.testing.assert_close(a, b)


def test_step_schedule_multiplies_by_gamma_every_step_size_steps_like_torch_steplr():
    import torch

    schedule = LRSchedule(1.0, total_steps=40, kind="step", step_size=10, gamma=0.7)
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=1.0)
    reference = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.7)
    for step in range(40):
        assert schedule.lr_at(step) == pytest.approx(optimizer.param_groups[0]["lr"], rel=1e-12), step
        optimizer.step()
        reference.step()
    assert LRSchedule(**schedule.state_dict()) == schedule
