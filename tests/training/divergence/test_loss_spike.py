"""The finite-explosion rule: a loss above factor x the median of the accepted losses before it."""

from __future__ import annotations

import pytest
import torch

from dlscale.errors import InvalidValue
from dlscale.training.divergence.loss_spike import LossSpikeWatch
from dlscale.training.train_config import TrainConfig

CPU = torch.device("cpu")


def feed(watch: LossSpikeWatch, losses: list[float]) -> None:
    for step, loss in enumerate(losses):
        watch.record(torch.tensor(loss), step)


def test_nothing_is_a_spike_before_there_is_a_history():
    watch = LossSpikeWatch(CPU, factor=100, window=5)
    assert not bool(watch.is_spike(torch.tensor(1e30)))


def test_a_loss_over_factor_times_the_median_is_the_first_spike_and_stays_out_of_the_history():
    watch = LossSpikeWatch(CPU, factor=100, window=5)
    feed(watch, [1.0, 2.0, 3.0, 350.0, 1e6, 2.5])
    # 350 > 100 x median(1, 2, 3) = 200; 1e6 as well; neither entered the history, so 2.5 is normal again. The
    # window counts steps: the two rejected ones took their places, so 2.5 replaced the oldest loss (1.0).
    assert watch.poll() == (3, 350.0, 2.0)
    assert float(watch.median()) == 2.5  # of 2, 3, 2.5
    assert not bool(watch.is_spike(torch.tensor(199.0 * 1.0)))


def test_just_under_the_factor_is_not_a_spike():
    watch = LossSpikeWatch(CPU, factor=100, window=5)
    feed(watch, [2.0, 2.0, 2.0])
    assert not bool(watch.is_spike(torch.tensor(200.0)))
    assert bool(watch.is_spike(torch.tensor(200.001)))
    assert watch.poll() is None


def test_the_median_covers_the_last_window_of_losses_only():
    watch = LossSpikeWatch(CPU, factor=10, window=3)
    feed(watch, [100.0, 100.0, 100.0, 1.0, 1.0, 1.0])
    assert float(watch.median()) == 1.0  # the hundreds have left the window
    assert bool(watch.is_spike(torch.tensor(11.0)))


def test_one_hard_batch_in_the_window_does_not_raise_the_bar():
    watch = LossSpikeWatch(CPU, factor=100, window=5)
    feed(watch, [1.0, 1.0, 1.0, 1.0, 90.0])  # 90 is under 100 x 1: a hard batch, accepted
    # The median of the window stays 1, so 150 is a spike; their mean (18.8) would set the bar at 1880.
    watch.record(torch.tensor(150.0), 5)
    assert watch.poll() == (5, 150.0, 1.0)


def test_non_finite_losses_are_the_nan_checks_business_and_never_enter_the_history():
    watch = LossSpikeWatch(CPU, factor=100, window=5)
    feed(watch, [1.0, float("nan"), float("inf")])
    assert watch.poll() is None
    assert float(watch.median()) == 1.0


def test_a_factor_of_zero_switches_the_rule_off_and_reset_forgets():
    off = LossSpikeWatch(CPU, factor=0, window=5)
    feed(off, [1.0, 1e9])
    assert off.poll() is None and not bool(off.is_spike(torch.tensor(1e12)))
    on = LossSpikeWatch(CPU, factor=100, window=5)
    feed(on, [1.0, 1e9])
    on.reset()
    assert on.poll() is None and torch.isnan(on.median())


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("loss_spike_factor", -1.0),
        ("loss_spike_factor", 0.5),
        ("loss_spike_factor", float("inf")),
        ("loss_spike_window", 0),
        ("healthy_steps_before_save", -1),
    ],
)
def test_the_spike_knobs_refuse_values_that_mean_nothing(key, value):
    with pytest.raises(InvalidValue, match=key):
        TrainConfig(**{key: value})
