"""MetricEvaluator: a workload's metrics against a baseline in a few lines, reduced as means of sums (the mean
over samples whatever the batches), with the skill 1 - model / baseline, and one line for each mistake."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dlscale.errors import ConfigError, WorkloadError
from dlscale.scoring.metric_evaluator import MetricEvaluator


class Pairs(torch.utils.data.Dataset):
    """(input, target) pairs of (channels, 4, 4) fields; the target is the input plus 0.1 * its index."""

    def __init__(self, count: int = 6, channels: int = 2):
        generator = torch.Generator().manual_seed(0)
        self.inputs = torch.randn(count, channels, 4, 4, generator=generator)
        self.targets = self.inputs + 0.1 * torch.arange(1, count + 1).view(-1, 1, 1, 1)

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[index], self.targets[index]


def mean_abs_error(prediction: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"MAE": (prediction - target).abs().flatten(1).mean(dim=1)}


def persistence(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return inputs


def evaluate_in_batches(evaluator: MetricEvaluator, data: Pairs, predictions: torch.Tensor, sizes: list[int]):
    evaluator.reset()
    start = 0
    for size in sizes:
        part = slice(start, start + size)
        evaluator.update(data.inputs[part], data.targets[part], predictions[part])
        start += size
    return evaluator.summary()


def test_metrics_are_means_over_samples_whatever_the_batches():
    data = Pairs()
    predictions = data.targets + torch.arange(6.0).view(-1, 1, 1, 1)  # sample i is off by i everywhere

    def metrics(prediction, target):  # one per-sample value, one batch mean: both must count each sample once
        error = (prediction - target).abs().flatten(1).mean(dim=1)
        return {"MAE": error, "batch_MAE": error.mean()}

    evaluator = MetricEvaluator(data, F.mse_loss, metrics)
    for sizes in ([6], [1, 5], [4, 2], [1, 1, 1, 3]):
        summary = evaluate_in_batches(evaluator, data, predictions, sizes)
        # the mean over the 6 samples, 2.5; a mean of the batch means would give e.g. (0 + 3) / 2 for [1, 5]
        assert summary.scalars["MAE"] == pytest.approx(2.5, abs=1e-6), sizes
        assert summary.scalars["batch_MAE"] == pytest.approx(2.5, abs=1e-6), sizes
        assert summary.loss == pytest.approx(float(np.mean(np.arange(6.0) ** 2)), abs=1e-5)
        assert summary.samples == 6


def test_the_baseline_gets_the_same_metrics_and_the_skill_is_one_minus_their_ratio():
    data = Pairs()
    predictions = data.targets + 0.05  # the model: off by 0.05; persistence: off by 0.1 * (i + 1)
    evaluator = MetricEvaluator(data, F.mse_loss, mean_abs_error, persistence, baseline_name="persistence")
    summary = evaluate_in_batches(evaluator, data, predictions, [4, 2])
    baseline_mae = 0.1 * np.mean(np.arange(1, 7))
    assert summary.headline == "MAE" and summary.scalars["MAE"] == pytest.approx(0.05, abs=1e-6)
    assert summary.baseline_name == "persistence"
    assert summary.baseline_scalars["MAE"] == pytest.approx(baseline_mae, abs=1e-6)
    assert summary.baseline_scalars["loss"] == pytest.approx(np.mean((0.1 * np.arange(1, 7)) ** 2), abs=1e-6)
    assert summary.scalars["skill/MAE"] == pytest.approx(1 - 0.05 / baseline_mae, abs=1e-5)
    assert summary.lines == [f"  Val MAE=0.05; persistence {baseline_mae:.4g}, skill +0.857"]
    # the image of channel 0 of the first sample, with the baseline's beside it
    assert summary.example is not None and summary.example.baseline_name == "persistence"
    np.testing.assert_array_equal(summary.example.baseline, data.inputs[0, 0].numpy())
    np.testing.assert_array_equal(summary.example.target, data.targets[0, 0].numpy())


def test_a_per_channel_metric_is_reported_per_channel_with_its_skill_per_channel():
    data = Pairs()
    predictions = data.targets.clone()
    predictions[:, 1] += 0.2  # channel "v" is worse than persistence on the first samples, "u" is exact

    def per_channel(prediction, target):
        return {"RMSE": (prediction - target).pow(2).flatten(2).mean(dim=2).sqrt()}

    evaluator = MetricEvaluator(
        data, F.mse_loss, per_channel, persistence, baseline_name="persistence", channel_names=["u", "v"],
        image_channel="v",
    )  # fmt: skip
    summary = evaluate_in_batches(evaluator, data, predictions, [5, 1])
    assert summary.scalars["RMSE/u"] == pytest.approx(0.0, abs=1e-6)
    assert summary.scalars["RMSE/v"] == pytest.approx(0.2, abs=1e-6)
    assert summary.scalars["RMSE"] == pytest.approx(0.1, abs=1e-6)  # the mean over the channels
    skill = summary.channel_skill
    assert skill is not None and skill.channels == ("u", "v") and skill.baseline_name == "persistence"
    np.testing.assert_allclose(skill.model, [0.0, 0.2], atol=1e-6)
    np.testing.assert_allclose(skill.baseline, [0.35, 0.35], atol=1e-6)
    assert skill.not_beating() == []
    assert summary.example.channel == "v"
    with pytest.raises(ConfigError, match="log.image_channel: 'w' is not an output channel"):
        MetricEvaluator(data, F.mse_loss, per_channel, channel_names=["u", "v"], image_channel="w")
    with pytest.raises(ConfigError, match="log.image_channel: '2' is not an output channel.*channels: 0, 1"):
        MetricEvaluator(data, F.mse_loss, per_channel, image_channel="2")


def test_without_a_baseline_the_summary_has_the_metrics_alone():
    data = Pairs()
    summary = evaluate_in_batches(MetricEvaluator(data, F.mse_loss, mean_abs_error), data, data.targets, [6])
    assert (
        summary.scalars == {"MAE": 0.0} and summary.baseline_name is None and summary.baseline_scalars == {}
    )
    assert summary.channel_skill is None and summary.example.baseline is None


def test_the_headline_can_be_any_metric_and_a_wrong_one_is_named():
    data = Pairs()

    def two(prediction, target):
        return {
            "MAE": (prediction - target).abs().flatten(1).mean(1),
            "max": (prediction - target).abs().amax(),
        }

    assert MetricEvaluator(data, F.mse_loss, two, headline="max").headline == "max"
    with pytest.raises(WorkloadError, match=r"headline 'MSE' is not one of the metrics \('MAE', 'max'\)"):
        MetricEvaluator(data, F.mse_loss, two, headline="MSE")


@pytest.mark.parametrize(
    ("metrics", "message"),
    [
        (lambda p, t: {"MAE": (p - t).abs()}, r"metric 'MAE' has shape \(2, 2, 4, 4\) for a batch of 2"),
        (lambda p, t: {"MAE": (p - t).abs().mean(dim=(0, 2, 3))[:1]}, r"metric 'MAE' has shape \(1,\)"),
        (lambda p, t: (p - t).abs().mean(), "metrics returned a Tensor; it must return a non-empty dict"),
        (lambda p, t: {}, "metrics returned a dict; it must return a non-empty dict"),
    ],
)
def test_a_metric_of_the_wrong_shape_is_one_line_naming_it(metrics, message):
    with pytest.raises(WorkloadError, match=message):
        MetricEvaluator(Pairs(), F.mse_loss, metrics)


def test_a_baseline_of_another_shape_than_the_targets_is_refused_rather_than_broadcast():
    data = Pairs()
    evaluator = MetricEvaluator(data, F.mse_loss, mean_abs_error, lambda inputs, targets: inputs[:, :1])
    with pytest.raises(
        WorkloadError, match=r"baseline 'baseline' returned \(6, 1, 4, 4\) for targets of shape"
    ):
        evaluate_in_batches(evaluator, data, data.targets, [6])
