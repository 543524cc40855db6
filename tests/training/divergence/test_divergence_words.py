"""The divergence guard's words: every skipped update and every divergence names the rule that fired."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest
import torch

from dlscale.runtime.device import Device
from dlscale.training.divergence.loss_spike import LossSpikeWatch
from dlscale.training.divergence.policy import DivergenceGuard, skip_cause
from dlscale.training.schedule import LRSchedule
from dlscale.training.train_config import TrainConfig
from dlscale.training.train_progress import TrainProgress


def guard_of(**policy: object) -> DivergenceGuard:
    """A guard over a stand-in for the run: the step object the guard reads, a CPU device, one process."""
    step = SimpleNamespace(skipped=False, last_grad_norm=None, last_spike=False, spike_check=None)
    setup = SimpleNamespace(
        policy=TrainConfig(**policy),
        device=Device("cpu"),
        step=step,
        process=SimpleNamespace(is_main=True),
        precision=SimpleNamespace(scaler=None),
        schedule=LRSchedule(peak_lr=0.5, total_steps=100, kind="constant"),
    )
    return DivergenceGuard(setup, TrainProgress())


def train_step(guard: DivergenceGuard, loss: float, skipped: bool = False, **step: object) -> None:
    """One step as the trainer reports it: the step object's state after it, then ``record_step``."""
    guard.setup.step.skipped = skipped
    guard.setup.step.last_grad_norm = step.get("grad_norm")
    guard.setup.step.last_spike = step.get("spiked_here", False)
    guard.record_step(torch.tensor(loss))
    guard.progress.global_step += 1


def skip_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "update skipped" in r.getMessage()]


@pytest.mark.parametrize("spiked_here", [True, False], ids=["this-rank", "another-rank"])
def test_a_skipped_finite_spike_is_called_a_spike_with_its_median_and_factor(caplog, spiked_here):
    guard = guard_of(on_nonfinite="skip", max_skipped_steps=0)
    for _ in range(3):
        train_step(guard, 2.0)
    with caplog.at_level(logging.WARNING, "dlscale.train"):
        train_step(guard, 1.756e10, skipped=True, grad_norm=torch.tensor(3.0), spiked_here=spiked_here)
    (warning,) = skip_warnings(caplog)
    assert warning.startswith(
        "Step 3: the loss 1.756e+10 is more than 100x the median 2 of the losses before it"
    )
    assert "NaN" not in warning and "infinite" not in warning
    # Over the limit, the divergence names the last skip's rule too.
    assert guard.divergence is not None and guard.divergence.loss == pytest.approx(1.756e10)
    assert "(train.max_skipped_steps); the last: the loss 1.756e+10 is more than 100x the median 2" in (
        guard.divergence.cause
    )


def test_a_skipped_nan_loss_and_an_infinite_gradient_are_named_as_such(caplog):
    guard = guard_of(on_nonfinite="skip")
    for _ in range(3):
        train_step(guard, 2.0)
    with caplog.at_level(logging.WARNING, "dlscale.train"):
        train_step(guard, math.nan, skipped=True, grad_norm=torch.tensor(math.nan))
        train_step(guard, 2.5, skipped=True, grad_norm=torch.tensor(math.inf))
    nan_loss, inf_gradient = skip_warnings(caplog)
    assert nan_loss.startswith("Step 3: the loss is nan: update skipped")
    assert inf_gradient.startswith(
        "Step 4: the gradient norm is inf (the loss 2.5 is finite, below 100x the median 2)"
    )


def test_an_exploded_loss_is_a_spike_first_even_when_its_gradient_overflowed():
    spikes = LossSpikeWatch(torch.device("cpu"), factor=100, window=5)
    cause = skip_cause(2e10, math.nan, spikes, median=1.0, spiked_here=False)
    assert cause.startswith("the loss 2e+10 is more than 100x the median 1 ")
    assert cause.endswith(", and the gradient norm is nan")


def test_an_fp16_step_skips_for_its_loss_only_so_its_gradient_is_not_blamed():
    # The scaler handles gradient overflows itself (the step checks only the loss under fp16): an overflowed
    # gradient there is routine, and a skip with an ordinary loss here was another rank's decision.
    guard = guard_of(on_nonfinite="skip")
    for _ in range(3):
        train_step(guard, 2.0)
    guard.setup.precision.scaler = object()
    guard.setup.step.last_grad_norm = torch.tensor(math.inf)
    cause = guard._skip_cause(torch.tensor(2.5))
    assert cause.startswith("another rank's loss") and "gradient norm is inf" not in cause


def test_the_weights_after_a_skipped_update_are_distrusted_until_healthy_steps_follow():
    guard = guard_of(on_nonfinite="skip", healthy_steps_before_save=2)
    for _ in range(3):
        train_step(guard, 2.0)
    train_step(guard, 1e9, skipped=True, spiked_here=True)  # step 3
    assert not guard.distrusts(2) and guard.distrusts(3) and guard.distrusts(4)
    assert guard.trouble_began == 3
    train_step(guard, 1e9, skipped=True, spiked_here=True)  # step 4: the same trouble goes on
    train_step(guard, 2.0)
    assert guard.in_trouble() and guard.distrusts(6) and guard.trouble_began == 3
    train_step(guard, 2.0)  # the second healthy step in a row: trusted again
    assert not guard.in_trouble() and not guard.distrusts(7) and guard.trouble_began is None


def test_under_stop_a_spike_whose_gradient_overflowed_is_reported_as_the_spike():
    guard = guard_of(on_nonfinite="stop")
    for _ in range(3):
        train_step(guard, 2.0, grad_norm=torch.tensor(1.0))
    train_step(guard, 3e10, grad_norm=torch.tensor(math.nan))
    assert not guard.check()
    where = guard.divergence.describe()
    assert where.startswith(
        "at step 3: the loss 3e+10 is more than 100x the median 2 of the losses before it"
    )
    assert "(gradient norm nan) at scheduled lr 0.5" in where
