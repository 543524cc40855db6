"""An ensemble's perturbations: ``--perturb`` parsed and refused as the user wrote it, Gaussian noise of unit
standard deviation everywhere with the correlation it promises in kilometres, drawn per initial time (the same
members whatever the batch), and dropout switched on for the members only where a model has some."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from dlscale.data.trajectories import ForecastStart
from dlscale.errors import ConfigError
from dlscale.scoring.perturbation_spec import (
    DROPOUT,
    GAUSSIAN,
    HALF_CIRCUMFERENCE_KM,
    Perturbation,
    check_ensemble_options,
    parse_perturbation,
)
from dlscale.scoring.perturbations import (
    DEFAULT_LENGTH_KM,
    SmoothedNoise,
    dropout_on,
    ensemble_members,
    has_dropout,
    noise_for_grid,
)
from dlscale.scoring.spectra import EARTH_RADIUS_M


def grid(spacing: float) -> tuple[np.ndarray, np.ndarray]:
    """A global grid of cell centres ``spacing`` degrees apart (no pole rows)."""
    latitudes = np.arange(90 - spacing / 2, -90, -spacing)
    longitudes = np.arange(0, 360, spacing)
    return latitudes, longitudes


def starts(count: int) -> list[ForecastStart]:
    return [ForecastStart(0, step) for step in range(count)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gaussian:0.05", Perturbation(GAUSSIAN, 0.05, None)),
        ("gaussian:5e-2:250", Perturbation(GAUSSIAN, 0.05, 250.0)),
        ("Gaussian:0.1:0", Perturbation(GAUSSIAN, 0.1, 0.0)),
        ("dropout", Perturbation(DROPOUT)),
    ],
)
def test_perturbations_parse_as_written(text, expected):
    assert parse_perturbation(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gaussian:-0.1", "SCALE must be a number above 0"),
        ("gaussian:0", "SCALE must be a number above 0"),
        ("gaussian:nan", "SCALE must be a finite number"),
        ("gaussian:inf", "SCALE must be a finite number"),
        ("gaussian:abc", "SCALE 'abc' is not a number"),
        ("gaussian:0.1:-5", "LENGTH_KM must be 0"),
        ("gaussian:0.1:nan", "LENGTH_KM must be a finite number"),
        ("gaussian:1e30", "SCALE 1e\\+30 is beyond 10 standard deviations"),
        ("gaussian:10.5", "SCALE 10.5 is beyond 10 standard deviations"),
        ("gaussian:1e-9", "SCALE 1e-09 is below 1e-06 standard deviations"),
        ("gaussian:0.1:20100", "LENGTH_KM 20100 is beyond half the Earth's circumference"),
        ("gaussian:0.1:1e30", "LENGTH_KM 1e\\+30 is beyond half the Earth's circumference"),
        ("gaussian", "expected gaussian:SCALE"),
        ("uniform:0.1", "expected gaussian:SCALE"),
        ("dropout:0.1", "expected gaussian:SCALE"),
    ],
)
def test_a_bad_perturbation_is_one_line_naming_it(text, message):
    with pytest.raises(ConfigError, match=message) as caught:
        parse_perturbation(text)
    assert text in str(caught.value) and "\n" not in str(caught.value)


def test_the_bounds_themselves_are_accepted_and_half_the_circumference_is_the_scores_earths():
    assert parse_perturbation("gaussian:10") == Perturbation(GAUSSIAN, 10.0, None)
    assert parse_perturbation("gaussian:1e-6:0") == Perturbation(GAUSSIAN, 1e-6, 0.0)
    assert parse_perturbation("gaussian:0.1:20000").length_km == 20000.0
    assert math.isclose(HALF_CIRCUMFERENCE_KM, math.pi * EARTH_RADIUS_M / 1000, rel_tol=1e-12)


@pytest.mark.parametrize("members", [2.5, True, "4", float("nan")])
def test_members_must_be_a_whole_number(members):
    with pytest.raises(ConfigError, match="--members .*: expected a whole number of members >= 1"):
        check_ensemble_options(members, "gaussian:0.1")


def test_members_and_perturb_must_go_together():
    assert check_ensemble_options(1, None) is None
    assert check_ensemble_options(4, "dropout") == Perturbation(DROPOUT)
    with pytest.raises(ConfigError, match="--members 0: expected a number of members >= 1"):
        check_ensemble_options(0, "gaussian:0.1")
    with pytest.raises(ConfigError, match="--members -3"):
        check_ensemble_options(-3, None)
    with pytest.raises(ConfigError, match="--members 8: an ensemble needs --perturb"):
        check_ensemble_options(8, None)
    with pytest.raises(ConfigError, match="--perturb dropout: perturbs the members of an ensemble"):
        check_ensemble_options(1, "dropout")


@pytest.mark.parametrize("length_km", [0.0, 800.0, 2500.0])
def test_every_point_has_unit_standard_deviation_the_polar_rows_too(length_km):
    latitudes, longitudes = grid(5.0)
    noise = SmoothedNoise(latitudes, longitudes, length_km, seed=3)
    samples = torch.cat([noise.draw(starts(50), 8, 1)[:, :, 0] for _ in range(1)]).flatten(
        0, 1
    )  # (400, H, W)
    # A row's values along a circle are correlated, so each row's variance is estimated from its 400 draws
    # averaged over its columns: at least 400 independent values, a standard error below sqrt(2 / 400) = 0.07.
    variance = samples.var(dim=0).mean(dim=-1)
    assert variance.numpy() == pytest.approx(np.ones(len(latitudes)), abs=0.25)
    assert float(variance.mean()) == pytest.approx(1.0, abs=0.05)


def test_the_correlation_falls_off_as_a_gaussian_of_the_distance_in_km():
    latitudes, longitudes = grid(2.0)
    length = 1500.0
    noise = SmoothedNoise(latitudes, longitudes, length, seed=0)
    fields = noise.draw(starts(40), 10, 1)[:, :, 0].flatten(0, 1)  # (400, H, W)
    equator = int(np.argmin(np.abs(latitudes)))
    spacing_km = EARTH_RADIUS_M / 1000 * math.radians(2.0)
    for shift in (1, 5, 10):
        distance = shift * spacing_km * math.cos(math.radians(latitudes[equator]))
        expected = math.exp(-(distance**2) / (2 * length**2))
        zonal = (fields[:, equator] * fields[:, equator].roll(shift, dims=-1)).mean()
        meridional = (fields[:, equator] * fields[:, equator + shift]).mean()
        meridional_expected = math.exp(-((shift * spacing_km) ** 2) / (2 * length**2))
        # 400 draws x 180 columns, correlated over some 7 columns: a standard error of about 0.01
        assert float(zonal) == pytest.approx(expected, abs=0.05)
        assert float(meridional) == pytest.approx(meridional_expected, abs=0.05)


def test_white_noise_is_uncorrelated_between_neighbours():
    latitudes, longitudes = grid(5.0)
    fields = SmoothedNoise(latitudes, longitudes, 0.0, seed=0).draw(starts(20), 10, 1)[:, :, 0].flatten(0, 1)
    assert float((fields * fields.roll(1, dims=-1)).mean()) == pytest.approx(0.0, abs=0.03)


def test_an_initial_times_members_are_the_same_in_any_batch_and_differ_between_times_and_seeds():
    latitudes, longitudes = grid(10.0)
    noise = SmoothedNoise(latitudes, longitudes, 500.0, seed=7)
    together = noise.draw(starts(4), 3, 2)
    alone = torch.cat([noise.draw([start], 3, 2) for start in reversed(starts(4))]).flip(0)
    assert torch.equal(together, alone)
    assert not torch.allclose(together[0], together[1])
    assert not torch.allclose(together[:, 0], together[:, 1])  # members differ
    other_seed = SmoothedNoise(latitudes, longitudes, 500.0, seed=8).draw(starts(4), 3, 2)
    assert not torch.allclose(together, other_seed)


def test_the_default_length_applies_on_the_sphere_and_white_noise_elsewhere():
    latitudes, longitudes = grid(10.0)
    assert (
        noise_for_grid(Perturbation(GAUSSIAN, 0.1), latitudes, longitudes, 0).length_km == DEFAULT_LENGTH_KM
    )
    flat = np.zeros(4), np.arange(8.0)  # a solver's grid: no latitudes
    assert noise_for_grid(Perturbation(GAUSSIAN, 0.1), *flat, 0).length_km == 0.0
    assert noise_for_grid(Perturbation(GAUSSIAN, 0.1, 0.0), *flat, 0).length_km == 0.0
    with pytest.raises(ConfigError, match="needs a grid of distinct latitudes"):
        noise_for_grid(Perturbation(GAUSSIAN, 0.1, 300.0), *flat, 0)
    regional = latitudes, longitudes[:10]
    with pytest.raises(ConfigError, match="gaussian:0.1:0 for white noise"):
        noise_for_grid(Perturbation(GAUSSIAN, 0.1, 300.0), *regional, 0)


def test_gaussian_members_are_the_state_plus_scale_times_the_noise():
    latitudes, longitudes = grid(10.0)
    model = nn.Identity()
    members = ensemble_members(Perturbation(GAUSSIAN, 0.3, 0.0), 4, latitudes, longitudes, model, model, 5)
    state = torch.randn(2, 3, len(latitudes), len(longitudes))
    perturbed = members.perturb(starts(2), state)
    assert perturbed.shape == (2, 3, 3, len(latitudes), len(longitudes))
    noise = SmoothedNoise(latitudes, longitudes, 0.0, seed=5).draw(starts(2), 3, 3)
    torch.testing.assert_close(perturbed, state.unsqueeze(1) + 0.3 * noise)
    assert "0.3 standard deviations, white noise" in members.description


class DropoutNet(nn.Module):
    def __init__(self, rate: float):
        super().__init__()
        self.linear = nn.Linear(16, 16)
        self.norm = nn.BatchNorm1d(16)
        self.drop = nn.Dropout(rate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.norm(self.linear(x)))


def test_dropout_members_sample_while_the_control_and_batch_norm_stay_in_inference_mode():
    torch.manual_seed(0)
    model = DropoutNet(0.5).eval()
    assert has_dropout(model) and not has_dropout(DropoutNet(0.0))
    x = torch.randn(64, 16)
    control = model(x)
    with dropout_on(model):
        assert model.drop.training and not model.norm.training
        first, second = model(x), model(x)
    assert not torch.equal(first, second)  # each call samples its own masks
    assert not model.training and not model.drop.training  # back in inference mode
    assert torch.equal(model(x), control)
    members = ensemble_members(Perturbation(DROPOUT), 3, np.zeros(1), np.arange(4.0), model, model, 0)
    state = torch.randn(2, 16)
    assert torch.equal(members.perturb(starts(2), state), state.unsqueeze(1).expand(2, 2, 16))
    assert not torch.equal(members.predict(x), control)
    assert torch.equal(model(x), control)


def test_dropout_on_a_model_without_dropout_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="--perturb dropout: the model has no dropout"):
        ensemble_members(
            Perturbation(DROPOUT), 3, np.zeros(1), np.arange(4.0), DropoutNet(0.0), nn.Identity(), 0
        )
