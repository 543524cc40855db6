"""Loss and metric math (relative L2, latitude-weighted RMSE, per-sample sums) and the ERA5 evaluator."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dlscale.data.era5.config import ERA5DataConfig
from dlscale.data.era5.dataset import ERA5Dataset
from dlscale.data.era5.layout import ERA5_CHANNELS
from dlscale.data.era5.synth import SynthERA5Spec, write_synthetic_era5
from dlscale.errors import ConfigError
from dlscale.scoring.metrics import (
    MetricSums,
    latitude_weights,
    relative_l2_loss,
    relative_l2_per_sample,
    weighted_rmse_per_sample,
)
from dlscale.workloads.era5_metrics import CHANNEL_QUANTITIES, ERA5Evaluator


def cos_weights(height: int) -> np.ndarray:
    """cos(latitude) of ``height`` rows from +90 to -90, scaled to average 1, computed independently."""
    lat = np.linspace(np.pi / 2, -np.pi / 2, height)
    weights = np.cos(lat)
    return weights / weights.mean()


# ---- relative L2 -----------------------------------------------------------------------------------------


def test_relative_l2_per_sample_matches_hand_computation() -> None:
    target = torch.tensor([[[[3.0, 0.0], [0.0, 4.0]]], [[[1.0, 1.0], [1.0, 1.0]]]])  # norms 5 and 2
    prediction = target.clone()
    prediction[0, 0, 0, 0] += 1.0  # error norm 1 -> 1/5
    prediction[1] += torch.tensor([[[1.0, -1.0], [1.0, -1.0]]])  # error norm 2 -> 2/2
    per_sample = relative_l2_per_sample(prediction, target)
    assert per_sample.shape == (2,)
    torch.testing.assert_close(per_sample, torch.tensor([0.2, 1.0]))
    torch.testing.assert_close(relative_l2_loss(prediction, target), torch.tensor(0.6))


def test_relative_l2_random_against_numpy() -> None:
    generator = torch.Generator().manual_seed(0)
    target = torch.randn(4, 3, 5, 6, generator=generator)
    prediction = target + 0.3 * torch.randn(4, 3, 5, 6, generator=generator)
    t, p = target.numpy().reshape(4, -1), prediction.numpy().reshape(4, -1)
    expected = np.linalg.norm(p - t, axis=1) / np.linalg.norm(t, axis=1)
    np.testing.assert_allclose(relative_l2_per_sample(prediction, target).numpy(), expected, rtol=1e-5)
    assert relative_l2_loss(prediction, target).item() == pytest.approx(expected.mean(), rel=1e-5)
    assert relative_l2_loss(target, target).item() == 0.0


# ---- latitude weights and weighted RMSE ------------------------------------------------------------------


@pytest.mark.parametrize("height", [5, 8, 33])
def test_latitude_weights_average_one_symmetric_zero_at_poles(height: int) -> None:
    lat = np.linspace(90.0, -90.0, height)
    weights = latitude_weights(lat)
    assert weights.shape == (height,)
    assert weights.dtype == torch.float32
    assert weights.mean().item() == pytest.approx(1.0, abs=1e-6)
    torch.testing.assert_close(weights, weights.flip(0))
    assert abs(weights[0].item()) < 1e-6 and abs(weights[-1].item()) < 1e-6
    np.testing.assert_allclose(weights.numpy(), cos_weights(height), atol=1e-6)
    assert torch.all(weights[1:-1] > 0)
    # A torch tensor of latitudes gives the same weights.
    torch.testing.assert_close(latitude_weights(torch.as_tensor(lat)), weights)


def test_uniform_error_gives_that_rmse() -> None:
    weights = latitude_weights(np.linspace(90.0, -90.0, 9))
    target = torch.randn(3, 2, 9, 12, generator=torch.Generator().manual_seed(1))
    error = 0.37
    rmse = weighted_rmse_per_sample(target + error, target, weights)
    assert rmse.shape == (3, 2)
    torch.testing.assert_close(rmse, torch.full((3, 2), error), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weighted_rmse_per_sample(target, target, weights), torch.zeros(3, 2))


def test_rmse_weights_rows_by_cos_latitude() -> None:
    height, width = 9, 12
    weights = latitude_weights(np.linspace(90.0, -90.0, height))
    target = torch.zeros(1, 1, height, width)
    at_pole = target.clone()
    at_pole[..., 0, :] = 5.0
    at_pole[..., -1, :] = -5.0
    assert weighted_rmse_per_sample(at_pole, target, weights).item() == pytest.approx(0.0, abs=1e-5)
    equator = height // 2
    at_equator = target.clone()
    at_equator[..., equator, :] = 2.0
    expected = 2.0 * np.sqrt(cos_weights(height)[equator] / height)
    assert weighted_rmse_per_sample(at_equator, target, weights).item() == pytest.approx(expected, rel=1e-5)
    # The same error one row from the pole counts for less than at the equator.
    near_pole = target.clone()
    near_pole[..., 1, :] = 2.0
    assert weighted_rmse_per_sample(near_pole, target, weights).item() < expected


def test_rmse_is_per_channel() -> None:
    weights = latitude_weights(np.linspace(90.0, -90.0, 5))
    target = torch.zeros(2, 3, 5, 4)
    prediction = target.clone()
    prediction[:, 1] = 1.0
    prediction[1, 2] = 3.0
    expected = torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.0, 3.0]])
    torch.testing.assert_close(weighted_rmse_per_sample(prediction, target, weights), expected)


# ---- MetricSums ------------------------------------------------------------------------------------------


def accumulate(scalars: torch.Tensor, vectors: torch.Tensor, batch_size: int) -> MetricSums:
    sums = MetricSums()
    for start in range(0, len(scalars), batch_size):
        stop = start + batch_size
        sums.add(len(scalars[start:stop]), loss=scalars[start:stop], rmse=vectors[start:stop])
    return sums


def test_metric_sums_do_not_depend_on_batching() -> None:
    generator = torch.Generator().manual_seed(2)
    n = 7  # 3 + 3 + 1: a mean of batch means would weigh the last sample three times too much
    scalars = torch.rand(n, generator=generator) * torch.arange(1, n + 1)
    vectors = torch.rand(n, 4, generator=generator)
    results = []
    for batch_size in (1, 3, n):
        sums = accumulate(scalars, vectors, batch_size)
        assert sums.count == n
        results.append((sums.mean("loss"), sums.mean("rmse")))
    for loss, rmse in results:
        assert loss.shape == () and rmse.shape == (4,)
        assert loss.item() == pytest.approx(scalars.double().mean().item(), rel=1e-12)
        torch.testing.assert_close(rmse, vectors.double().mean(dim=0))
    batch_means = torch.stack([scalars[0:3].mean(), scalars[3:6].mean(), scalars[6:].mean()]).mean()
    assert results[1][0].item() != pytest.approx(batch_means.item(), rel=1e-6)


def test_mean_of_empty_sums_raises() -> None:
    with pytest.raises(ValueError, match="no samples"):
        MetricSums().mean("loss")


# ---- ERA5Evaluator ---------------------------------------------------------------------------------------

HEIGHT, WIDTH = 8, 16


@pytest.fixture(scope="module")
def era5_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = SynthERA5Spec(
        height=HEIGHT, width=WIDTH, steps_per_year=9, train_years=1, valid_years=1, test_years=0
    )
    return write_synthetic_era5(tmp_path_factory.mktemp("metrics") / "era5", spec, progress=lambda _: None)


@pytest.fixture(scope="module")
def valid_set(era5_root: Path) -> ERA5Dataset:
    return ERA5Dataset(ERA5DataConfig(root=str(era5_root), img_size=(HEIGHT, WIDTH)), "valid")


def batches(dataset: ERA5Dataset, batch_size: int):
    for start in range(0, len(dataset), batch_size):
        pairs = [dataset[i] for i in range(start, min(start + batch_size, len(dataset)))]
        yield torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


def direct_rmse(dataset: ERA5Dataset, predict) -> np.ndarray:
    """Mean over samples of the latitude-weighted RMSE per channel, in float64 with numpy."""
    weights = cos_weights(HEIGHT)[None, :, None]
    per_sample = []
    for i in range(len(dataset)):
        inputs, targets = (t.numpy().astype(np.float64) for t in dataset[i])
        error = predict(inputs) - targets
        per_sample.append(np.sqrt((weights * error**2).mean(axis=(-2, -1))))
    return np.mean(per_sample, axis=0)


def test_persistence_rmse_matches_direct_computation(valid_set: ERA5Dataset) -> None:
    evaluator = ERA5Evaluator(valid_set)
    for inputs, targets in batches(valid_set, 3):
        evaluator.update(inputs, targets, inputs)  # predictions = persistence too
    summary = evaluator.summary()
    expected = direct_rmse(valid_set, lambda x: x)
    names = valid_set.channel_names
    assert summary.samples == len(valid_set) == 8
    assert summary.headline == "RMSE(u10m)"
    assert summary.baseline_name == "persistence"
    for c, name in enumerate(names):
        assert summary.baseline_scalars[f"RMSE/{name}"] == pytest.approx(expected[c], rel=1e-4)
        assert summary.scalars[f"RMSE/{name}"] == pytest.approx(expected[c], rel=1e-4)
    assert summary.scalars["RMSE(u10m)"] == pytest.approx(expected[names.index("u10")], rel=1e-4)
    assert summary.baseline_scalars["RMSE(u10m)"] == summary.scalars["RMSE(u10m)"]
    assert expected[names.index("u10")] > 0.01  # the data does change in 6 hours
    assert summary.loss == pytest.approx(summary.baseline_scalars["loss"], rel=1e-6)


def test_results_do_not_depend_on_batch_size(valid_set: ERA5Dataset) -> None:
    summaries = []
    for batch_size in (1, 3, len(valid_set)):
        evaluator = ERA5Evaluator(valid_set)
        for inputs, targets in batches(valid_set, batch_size):
            evaluator.update(inputs, targets, 0.5 * inputs)
        summaries.append(evaluator.summary())
    for summary in summaries[1:]:
        assert summary.loss == pytest.approx(summaries[0].loss, rel=1e-6)
        assert summary.scalars == pytest.approx(summaries[0].scalars, rel=1e-6)


def test_perfect_prediction_scores_zero(valid_set: ERA5Dataset) -> None:
    evaluator = ERA5Evaluator(valid_set)
    for inputs, targets in batches(valid_set, 4):
        evaluator.update(inputs, targets, targets.clone())
    summary = evaluator.summary()
    assert summary.loss == 0.0
    assert all(value == 0.0 for value in summary.scalars.values())
    assert summary.baseline_scalars["RMSE(u10m)"] > 0
    assert summary.baseline_scalars["loss"] > 0
    assert "RMSE(u10m)" in summary.lines[0] and "persistence" in summary.lines[0]


def test_reset_forgets_previous_batches(valid_set: ERA5Dataset) -> None:
    evaluator = ERA5Evaluator(valid_set)
    inputs, targets = next(batches(valid_set, 4))
    evaluator.update(inputs, targets, inputs)
    evaluator.reset()
    evaluator.update(inputs, targets, targets)
    summary = evaluator.summary()
    assert summary.samples == 4
    assert summary.scalars["RMSE(u10m)"] == 0.0
    assert summary.example is not None and np.array_equal(summary.example.prediction, summary.example.target)


def test_unknown_image_channel_is_a_config_error_with_a_suggestion(valid_set: ERA5Dataset) -> None:
    with pytest.raises(ConfigError, match="log.image_channel") as raised:
        ERA5Evaluator(valid_set, image_channel="z5000")
    message = str(raised.value)
    assert "'z5000'" in message
    assert "did you mean 'z500'" in message


@pytest.mark.parametrize("channel", ["z500", None])
def test_example_image_is_the_configured_channel_of_the_first_sample(valid_set: ERA5Dataset, channel) -> None:
    evaluator = ERA5Evaluator(valid_set, image_channel=channel)
    expected_channel = channel or "t2m"  # the default image channel
    c = valid_set.channel_names.index(expected_channel)
    all_batches = list(batches(valid_set, 3))
    for inputs, targets in all_batches:
        evaluator.update(inputs, targets, inputs + 1.0)
    example = evaluator.summary().example
    inputs, targets = all_batches[0]
    assert example is not None
    assert example.channel == expected_channel
    assert example.target.shape == (HEIGHT, WIDTH)
    np.testing.assert_array_equal(example.target, targets[0, c].numpy())
    np.testing.assert_array_equal(example.baseline, inputs[0, c].numpy())
    np.testing.assert_allclose(example.prediction, inputs[0, c].numpy() + 1.0)
    assert example.baseline_name.startswith("persistence")


def test_fewer_output_channels_use_the_first_input_channels_as_persistence(era5_root: Path) -> None:
    cfg = ERA5DataConfig(root=str(era5_root), img_size=(HEIGHT, WIDTH), n_in_channels=20, n_out_channels=3)
    dataset = ERA5Dataset(cfg, "valid")
    evaluator = ERA5Evaluator(dataset)
    for inputs, targets in batches(dataset, 3):
        assert inputs.shape[1] == 20 and targets.shape[1] == 3
        evaluator.update(inputs, targets, targets)
    summary = evaluator.summary()
    assert set(summary.scalars) == {"RMSE(u10m)", "RMSE/u10", "RMSE/v10", "RMSE/t2m"}
    expected = direct_rmse(dataset, lambda x: x[:3])
    assert summary.baseline_scalars["RMSE/t2m"] == pytest.approx(expected[2], rel=1e-4)


def test_every_era5_channel_has_a_quantity_and_a_unit() -> None:
    assert set(CHANNEL_QUANTITIES) == set(ERA5_CHANNELS)
    assert all(quantity and unit for quantity, unit in CHANNEL_QUANTITIES.values())


def test_example_image_knows_its_unit_stats_and_place_on_the_globe(valid_set: ERA5Dataset) -> None:
    evaluator = ERA5Evaluator(valid_set, image_channel="z500")
    inputs, targets = next(batches(valid_set, 2))
    evaluator.update(inputs, targets, targets)
    example = evaluator.summary().example
    c = valid_set.channel_names.index("z500")
    assert (example.quantity, example.unit) == ("geopotential at 500 hPa", "m^2/s^2")
    assert example.scale == pytest.approx(valid_set.stds[c]) and example.offset == pytest.approx(
        valid_set.means[c]
    )
    # the physical field is what the file holds: the data set read without normalization
    raw = ERA5Dataset(valid_set.cfg, "valid", normalize=False)[0][1][c].numpy()
    np.testing.assert_allclose(example.physical(example.target), raw, rtol=1e-5)
    # the whole 8 x 16 grid: pixel edges half a cell beyond 0..360 degrees east and +90..-90 degrees north
    dlon, dlat = 360 / WIDTH, 180 / (HEIGHT - 1)
    assert example.extent == pytest.approx((-dlon / 2, 360 - dlon / 2, -90 - dlat / 2, 90 + dlat / 2))
    assert example.region is None


def test_a_crop_has_the_extent_of_its_top_left_corner(era5_root: Path) -> None:
    dataset = ERA5Dataset(ERA5DataConfig(root=str(era5_root), img_size=(4, 8)), "valid")
    evaluator = ERA5Evaluator(dataset)
    inputs, targets = next(batches(dataset, 1))
    evaluator.update(inputs, targets, targets)
    example = evaluator.summary().example
    dlon, dlat = 360 / WIDTH, 180 / (HEIGHT - 1)
    south = 90 - 3 * dlat - dlat / 2
    assert example.extent == pytest.approx((-dlon / 2, 8 * dlon - dlon / 2, south, 90 + dlat / 2))
    assert example.region == f"top-left 4x8 crop of the {HEIGHT}x{WIDTH} grid"


def test_channel_skill_compares_the_model_with_persistence_per_channel(valid_set: ERA5Dataset) -> None:
    # The model predicts persistence on every channel but the first, where it is exact: skill 1 there, 0 elsewhere.
    evaluator = ERA5Evaluator(valid_set)
    for inputs, targets in batches(valid_set, 3):
        predictions = inputs.clone()
        predictions[:, 0] = targets[:, 0]
        evaluator.update(inputs, targets, predictions)
    summary = evaluator.summary()
    skill = summary.channel_skill
    names = valid_set.channel_names
    assert skill is not None and skill.channels == tuple(names) and skill.baseline_name == "persistence"
    for c, name in enumerate(names):
        assert skill.model[c] == summary.scalars[f"RMSE/{name}"]
        assert skill.baseline[c] == summary.baseline_scalars[f"RMSE/{name}"]
    np.testing.assert_allclose(skill.skill(), [1.0] + [0.0] * (len(names) - 1), atol=1e-12)
    # equal to persistence does not beat it
    assert skill.not_beating() == list(names[1:])
    assert skill.units[names.index("sp")] == "Pa"
    np.testing.assert_array_equal(skill.scales, valid_set.stds[: len(names)])
