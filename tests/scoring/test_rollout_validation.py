"""Validation of a multi-step run: the workload's metrics see the first step exactly as in a one-step run, and
the K-step loss is the mean over the rollout's steps and samples."""

from __future__ import annotations

import pytest
import torch

from dlscale.scoring.loss_evaluator import LossEvaluator
from dlscale.scoring.rollout_validation import RolloutEvaluator, RolloutPredict, rollout_loss_name


def mse(prediction, target):
    return ((prediction - target) ** 2).mean()


def halve(x):
    return 0.5 * x


def test_rollout_predictions_feed_each_prediction_back():
    inputs = torch.full((2, 3), 8.0)
    predictions = RolloutPredict(halve, 3)(inputs)
    assert predictions.shape == (2, 3, 3)
    assert predictions[0, :, 0].tolist() == [4.0, 2.0, 1.0]


def test_the_first_step_goes_to_the_workloads_evaluator_and_the_k_step_loss_beside_it():
    generator = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(n, 3, generator=generator), torch.randn(n, 2, 3, generator=generator)) for n in (4, 1)
    ]
    evaluator = RolloutEvaluator(LossEvaluator(mse), mse, steps=2)
    evaluator.reset()
    one_step = LossEvaluator(mse)
    one_step.reset()
    predict = RolloutPredict(halve, 2)
    first, kstep, count = 0.0, 0.0, 0
    for inputs, targets in batches:
        predictions = predict(inputs)
        evaluator.update(inputs, targets, predictions)
        one_step.update(inputs, targets[:, 0], halve(inputs))
        n = inputs.shape[0]
        first += float(mse(halve(inputs), targets[:, 0])) * n
        kstep += (
            (float(mse(halve(inputs), targets[:, 0])) + float(mse(halve(halve(inputs)), targets[:, 1])))
            / 2
            * n
        )
        count += n
    summary = evaluator.summary()
    assert summary.loss == pytest.approx(one_step.summary().loss) == pytest.approx(first / count)
    assert summary.scalars[rollout_loss_name(2)] == pytest.approx(kstep / count)
    assert any("2-step rollout loss" in line for line in summary.lines)


def test_the_k_step_sums_are_summed_over_ranks():
    evaluator = RolloutEvaluator(LossEvaluator(mse), mse, steps=1)
    evaluator.reset()
    inputs, targets = torch.ones(2, 3), torch.zeros(2, 1, 3)
    evaluator.update(inputs, targets, inputs[:, None])  # loss 1 per sample: sums (2, 2)
    seen = []

    def other_rank_with_two_samples_of_loss_4(tensor):
        seen.append(tensor)
        if tensor is evaluator._sums:
            tensor += torch.tensor([8.0, 2.0], dtype=tensor.dtype)

    evaluator.reduce_across_ranks(other_rank_with_two_samples_of_loss_4, torch.device("cpu"))
    assert any(tensor is evaluator._sums for tensor in seen)
    assert evaluator.summary().scalars[rollout_loss_name(1)] == pytest.approx(10.0 / 4)
