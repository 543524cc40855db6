"""The divergence message's LRs: the scheduled one says how it came from optim.lr, and the advice is in
optim.lr's scale, below the value that diverged whatever the batch-size rule does to it."""

from __future__ import annotations

import math
import re

import pytest

from dlscale.run.divergence_advice import advice, lr_origin
from dlscale.training.divergence.policy import Divergence
from dlscale.training.optim_config import OptimConfig
from dlscale.training.schedule import LRSchedule, scaled_lr

GLOBAL_BATCH = 16


def diverged_at(step: int, optim: OptimConfig, lr_scale: float = 1.0) -> Divergence:
    """The divergence a run of ``optim`` at global batch 16 records at ``step``, as the guard records it."""
    peak = scaled_lr(optim.lr, optim.lr_scaling, GLOBAL_BATCH, optim.base_batch_size)
    schedule = LRSchedule(peak, 1000, optim.warmup, kind=optim.lr_schedule, scale=lr_scale)
    return Divergence(
        step, "the loss is nan", schedule.lr_at(step), lr_scale=lr_scale, peak_lr=schedule.peak_lr
    )


def suggested(text: str) -> float:
    (value,) = re.findall(r"--set optim\.lr=(\S+?),", text)
    return float(value)


def test_the_scheduled_lr_says_how_the_batch_size_rule_made_it_from_optim_lr():
    # optim.lr 5e4 for batch 256; at global batch 16 the sqrt rule gives 5e4 * sqrt(16 / 256) = 1.25e4.
    optim = OptimConfig(lr=5e4, lr_scaling="sqrt", base_batch_size=256, lr_schedule="constant")
    divergence = diverged_at(10, optim)
    assert divergence.lr == pytest.approx(1.25e4)
    where = divergence.describe(lr_origin(divergence, optim, GLOBAL_BATCH))
    assert where.endswith(
        "at scheduled lr 1.25e+04 (optim.lr 5e+04, x 0.25 by optim.lr_scaling sqrt from base_batch_size 256 "
        "to global batch 16)"
    )


def test_the_warm_up_and_the_rollbacks_are_named_too():
    optim = OptimConfig(lr=1e-3, warmup=10, lr_schedule="constant")
    divergence = diverged_at(4, optim, lr_scale=0.25)  # warm-up step 4 of 10: half the peak
    origin = lr_origin(divergence, optim, GLOBAL_BATCH)
    assert origin == (
        "optim.lr 0.001, x 0.5 by the warm-up at this step, "
        "x 0.25 by the rollbacks (train.rollback_lr_factor)"
    )
    assert lr_origin(diverged_at(20, optim), optim, GLOBAL_BATCH) == "optim.lr 0.001 itself"


@pytest.mark.parametrize(
    "scaling",
    [("sqrt", 256), ("linear", 4), ("none", None)],
    ids=["rule-lowers-it", "rule-raises-it-4x", "no-rule"],
)
@pytest.mark.parametrize("lr_scale", [1.0, 0.25], ids=["first-try", "after-rollbacks"])
def test_the_suggested_optim_lr_is_below_the_one_that_diverged_in_the_configs_scale(scaling, lr_scale):
    rule, base = scaling
    optim = OptimConfig(lr=5e4, lr_scaling=rule, base_batch_size=base, lr_schedule="constant")
    divergence = diverged_at(10, optim, lr_scale)
    text = advice(divergence, "stop", optim)
    value = suggested(text)
    # Below the optim.lr that diverged (lowered by the rollbacks), and so, through the same batch-size rule
    # and schedule, a scheduled LR below the one that diverged.
    assert value < optim.lr * lr_scale
    assert scaled_lr(value, rule, GLOBAL_BATCH, base) * lr_scale < divergence.lr
    named = re.search(r"a quarter of optim\.lr ([-+.e0-9]+)", text)
    assert named is not None and math.isclose(float(named.group(1)), optim.lr, rel_tol=1e-3)
