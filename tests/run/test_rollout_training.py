"""Multi-step training's assembly: workloads that cannot train on rollouts are refused by name, and the FLOP
rating follows the curriculum."""

from __future__ import annotations

import pytest

from dlscale.errors import ConfigError
from dlscale.perf.flops import Utilization
from dlscale.run.rollout_training import (
    RolloutUtilization,
    check_rollout_workload,
    rollout_curriculum,
    rollout_splits,
)
from dlscale.training.train_config import TrainConfig
from dlscale.workloads.cnn_mnist import WORKLOAD as MNIST
from dlscale.workloads.protocol import Workload


class WithOwnLoss(Workload):
    name = "own_loss"
    data_config = model_config = object

    @staticmethod
    def training_loss(model, batch, step):
        return model(batch[0]).mean()


def test_a_workload_with_its_own_training_loss_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="workload 'own_loss' has its own training_loss; use one of them"):
        check_rollout_workload(WithOwnLoss(), "configs/x.yaml (config 'x')")
    check_rollout_workload(MNIST, "here")  # no hook: accepted (its data is checked next)


def test_a_workload_that_cannot_roll_out_is_refused_naming_forecast_data():
    with pytest.raises(ConfigError) as raised:
        rollout_splits(MNIST, MNIST.data_config(), 2, "configs/cnn_mnist.yaml (config 'x')")
    message = str(raised.value)
    assert message.startswith("configs/cnn_mnist.yaml (config 'x'): train.rollout_steps 2 trains on")
    assert "forecast_data" in message and "\n" not in message


def test_the_curriculum_comes_from_the_schedule_in_epochs_or_from_k():
    assert rollout_curriculum(TrainConfig(rollout_steps=3), steps_per_epoch=7).steps_at(0) == 3
    curriculum = rollout_curriculum(TrainConfig(rollout_schedule="epoch 0=1, 2=4"), steps_per_epoch=7)
    assert (curriculum.steps_at(13), curriculum.steps_at(14)) == (1, 4)


def test_the_flop_rating_of_an_epoch_is_its_mean_k_times_one_steps():
    one_step = Utilization(1e9, "cpu", "fp32", warn_if_unknown=False)
    rating = RolloutUtilization(
        one_step, rollout_curriculum(TrainConfig(rollout_schedule="step 0=1, 10=3"), 5)
    )
    assert rating.flops_per_sample == 3e9
    assert rating.over_steps(0, 10).tflops(1000.0) == pytest.approx(1.0)
    assert rating.over_steps(5, 15).tflops(1000.0) == pytest.approx(2.0)  # K = 1 x 5 steps, 3 x 5 steps
    assert one_step.over_steps(0, 10) is one_step
