"""The zonal energy spectrum at mid-latitudes is WeatherBench2's: a zonal wave of wavenumber k puts all its
energy at k, C A^2 / 2 for amplitude A on a circle of length C (the mean and the Nyquist wave once, C A^2);
Parseval holds; only the rows at 30 to 60 degrees count, weighted by cos(latitude); batches of initial times
sum as one; the small-scale ratio is the forecast's energy over the truth's above half the largest wavenumber,
so a smoothed forecast has less than 1; a grid without that band, or not around the Earth, has no spectra."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from dlscale.scoring.rollout import roll_out
from dlscale.scoring.spectra import ZonalSpectra

RADIUS_M = 1000 * (6357 + 6378) / 2  # WeatherBench2's Earth radius, written out here
WIDTH = 32  # points per row: wavenumbers 0..16
LONGITUDES = 360.0 * np.arange(WIDTH) / WIDTH
# Rows outside the band (75, 10, -20, -89), inside (45, -35), and on its edges (30, -60).
LATITUDES = np.array([75.0, 45.0, 30.0, 10.0, -20.0, -35.0, -60.0, -89.0])
IN_BAND = np.array([1, 2, 5, 6])
COLUMNS = np.arange(WIDTH)


def circle_m(latitude: float) -> float:
    return 2 * np.pi * RADIUS_M * np.cos(np.deg2rad(latitude))


def spectra_of(fields: np.ndarray, latitudes: np.ndarray = LATITUDES) -> ZonalSpectra:
    """The spectra of (N, C, H, W) ``fields`` as forecast and truth at lead 0."""
    spectra = ZonalSpectra.for_grid(1, fields.shape[1], latitudes, LONGITUDES)
    assert spectra is not None
    tensor = torch.from_numpy(fields)
    spectra.add(0, tensor, tensor)
    return spectra


def one_row_grid(row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A grid whose only row in the band is at 45 degrees and holds ``row``; the other rows hold noise."""
    latitudes = np.array([80.0, 45.0, 0.0])
    fields = np.random.default_rng(1).normal(size=(1, 1, 3, WIDTH))
    fields[0, 0, 1] = row
    return fields, latitudes


@pytest.mark.parametrize("k", [1, 5, 15])
def test_a_zonal_wave_puts_c_a_squared_over_2_at_its_wavenumber_and_nothing_elsewhere(k):
    amplitude = 3.0
    row = amplitude * np.cos(2 * np.pi * k * COLUMNS / WIDTH + 0.4)
    spectrum = spectra_of(*one_row_grid(row)).truth()[0, 0]
    expected = np.zeros(WIDTH // 2 + 1)
    # The wave's power A^2 / 2 is split between +k and -k; the spectrum counts both.
    expected[k] = circle_m(45.0) * amplitude**2 / 2
    np.testing.assert_allclose(spectrum, expected, rtol=1e-10, atol=1e-6 * expected[k])


def test_the_mean_and_the_nyquist_wave_count_once():
    row = 2.0 + 0.5 * np.cos(np.pi * COLUMNS)  # k = 0 and k = WIDTH / 2: no negative twin
    spectrum = spectra_of(*one_row_grid(row)).truth()[0, 0]
    assert spectrum[0] == pytest.approx(circle_m(45.0) * 2.0**2)
    assert spectrum[-1] == pytest.approx(circle_m(45.0) * 0.5**2)
    assert np.allclose(spectrum[1:-1], 0.0, atol=1e-6 * spectrum[-1])


def test_parseval_the_spectrum_sums_to_the_band_mean_of_each_rows_circumference_times_its_mean_square():
    fields = np.random.default_rng(0).normal(size=(3, 2, len(LATITUDES), WIDTH))
    spectra = spectra_of(fields)
    band = LATITUDES[IN_BAND]
    weights = np.cos(np.deg2rad(band)) / np.cos(np.deg2rad(band)).sum()
    circles = np.array([circle_m(latitude) for latitude in band])
    mean_squares = (fields[:, :, IN_BAND] ** 2).mean(axis=-1)  # (N, C, rows)
    expected = (mean_squares * weights * circles).sum(axis=-1).mean(axis=0)  # rows weighted, then times
    np.testing.assert_allclose(spectra.truth()[0].sum(axis=-1), expected, rtol=1e-12)


def test_only_the_rows_at_30_to_60_degrees_count():
    fields = np.random.default_rng(2).normal(size=(2, 1, len(LATITUDES), WIDTH))
    changed = fields.copy()
    outside = np.setdiff1d(np.arange(len(LATITUDES)), IN_BAND)
    changed[:, :, outside] *= 10.0
    np.testing.assert_array_equal(spectra_of(changed).truth(), spectra_of(fields).truth())
    edge = fields.copy()
    edge[:, :, 2] *= 10.0  # the row at 30 degrees: the band's edge is in it
    assert not np.allclose(spectra_of(edge).truth(), spectra_of(fields).truth())


def test_batches_of_initial_times_sum_as_one():
    fields = torch.from_numpy(np.random.default_rng(3).normal(size=(7, 2, len(LATITUDES), WIDTH)))
    whole = ZonalSpectra.for_grid(2, 2, LATITUDES, LONGITUDES)
    batched = ZonalSpectra.for_grid(2, 2, LATITUDES, LONGITUDES)
    whole.add(1, fields, 2 * fields)
    for first in range(0, 7, 3):
        batched.add(1, fields[first : first + 3], 2 * fields[first : first + 3])
    np.testing.assert_allclose(batched.forecast()[1], whole.forecast()[1], rtol=1e-13)
    np.testing.assert_allclose(batched.truth()[1], whole.truth()[1], rtol=1e-13)
    assert batched.count.tolist() == [0, 7]
    # The spectrum is the mean over initial times: the same field seven times has its own spectrum.
    one = spectra_of(fields[:1].numpy()).truth()[0]
    repeated = spectra_of(fields[:1].expand(7, -1, -1, -1).numpy()).truth()[0]
    np.testing.assert_allclose(repeated, one, rtol=1e-12)


def test_a_smoothed_forecast_has_less_small_scale_energy_than_the_truth():
    truth = np.random.default_rng(4).normal(size=(4, 2, len(LATITUDES), WIDTH))
    smoothed = truth.copy()
    for _ in range(3):  # a 1-2-1 filter along each row (periodic) damps the short waves most
        smoothed = (np.roll(smoothed, 1, -1) + 2 * smoothed + np.roll(smoothed, -1, -1)) / 4
    spectra = ZonalSpectra.for_grid(1, 2, LATITUDES, LONGITUDES)
    spectra.add(0, torch.from_numpy(smoothed), torch.from_numpy(truth))
    ratio = spectra.small_scale_ratio()[0]
    assert np.all(ratio < 0.5)
    assert spectra_of(truth).small_scale_ratio()[0] == pytest.approx([1.0, 1.0])


def test_the_small_scale_ratio_sums_the_energy_above_half_the_largest_wavenumber():
    largest = WIDTH // 2  # 16: the upper half is k = 9..16
    truth = np.zeros((1, 1, len(LATITUDES), WIDTH))
    truth[..., :] = np.cos(2 * np.pi * 12 * COLUMNS / WIDTH) + np.cos(2 * np.pi * largest * COLUMNS / WIDTH)
    forecast = truth.copy()
    forecast[..., :] += 5.0 * np.cos(2 * np.pi * (largest // 2) * COLUMNS / WIDTH)  # k = 8: not a small scale
    forecast[..., :] -= 0.5 * np.cos(2 * np.pi * 12 * COLUMNS / WIDTH)  # half the amplitude at k = 12
    spectra = ZonalSpectra.for_grid(1, 1, LATITUDES, LONGITUDES)
    spectra.add(0, torch.from_numpy(forecast), torch.from_numpy(truth))
    # Per unit of C: the truth has 1/2 at k = 12 and 1 at k = 16 (the Nyquist wave, once); the forecast
    # 1/8 at k = 12 and 1 at k = 16.
    assert spectra.small_scale_ratio()[0, 0] == pytest.approx((1 / 8 + 1) / (1 / 2 + 1))


def test_wavelengths_are_the_circle_at_the_bands_mean_latitude_over_k():
    spectra = ZonalSpectra.for_grid(1, 1, LATITUDES, LONGITUDES)
    mean = np.abs(LATITUDES[IN_BAND]).mean()  # 42.5
    assert spectra.mean_latitude == pytest.approx(mean)
    assert spectra.wavelengths_km[1:] == pytest.approx(circle_m(mean) / 1000 / np.arange(1, WIDTH // 2 + 1))
    assert spectra.wavelengths_km[0] == np.inf


@pytest.mark.parametrize(
    ("latitudes", "longitudes", "why"),
    [
        (np.zeros(4), LONGITUDES, "no row between 30 and 60"),  # a grid not on the Earth
        (np.array([20.0, 10.0, 0.0, -10.0]), LONGITUDES, "no row between 30 and 60"),  # a crop of the tropics
        (
            LATITUDES,
            LONGITUDES[:20],
            "not evenly spaced longitudes around the whole Earth",
        ),  # a regional crop
        (LATITUDES, np.arange(WIDTH, dtype=float), "not evenly spaced longitudes around the whole Earth"),
    ],
)
def test_a_grid_without_the_band_or_not_around_the_earth_has_no_spectra_said_once(
    latitudes, longitudes, why, caplog
):
    with caplog.at_level(logging.INFO, logger="dlscale.train"):
        assert ZonalSpectra.for_grid(3, 1, latitudes, longitudes) is None
    assert [record.getMessage() for record in caplog.records if why in record.getMessage()] != []
    assert len(caplog.records) == 1


class EarthTrajectories:
    """Two channels on the 8 x 32 grid above, a state per 6 hours: random fields, one trajectory of 12."""

    step_hours = hours_per_state = 6.0
    latitudes, longitudes = LATITUDES, LONGITUDES
    channel_names = ("a", "b")
    units = ("K", "m/s")
    fields = torch.from_numpy(np.random.default_rng(5).normal(size=(12, 2, len(LATITUDES), WIDTH)))

    def states(self, starts, lead: int) -> torch.Tensor:
        return self.fields[[start + lead for start in starts]].float()

    def normalize(self, states: torch.Tensor) -> torch.Tensor:
        return states

    def to_physical(self, normalized: torch.Tensor) -> torch.Tensor:
        return normalized

    def climatology(self) -> None:
        return None


@pytest.mark.parametrize("batch_size", [1, 3])
def test_the_rollout_keeps_the_models_and_the_truths_spectra_at_every_lead(batch_size):
    trajectories = EarthTrajectories()
    starts = [0, 2, 4, 6]
    rollout = roll_out(
        lambda state: 0.5 * state, trajectories, starts, 3, batch_size, device=torch.device("cpu")
    )
    spectra = rollout.spectra
    assert spectra.count.tolist() == [4, 4, 4, 4]
    for lead in range(4):
        truth = spectra_of(trajectories.states(starts, lead).double().numpy()).truth()[0]
        initial = spectra_of(trajectories.states(starts, 0).double().numpy()).truth()[0]
        np.testing.assert_allclose(spectra.truth()[lead], truth, rtol=1e-6)
        # The model halves its state each step: its energy is a quarter of the last one's.
        np.testing.assert_allclose(spectra.forecast()[lead], initial * 0.25**lead, rtol=1e-6)
