"""The forecast's spectra and bias: ``scores.json`` holds the model's and the truth's zonal energy spectra at the
report's leads (the truth's as numpy computes them from the states at those leads) and the small-scale ratio at
every lead; ``spectra.png`` and ``bias.png`` are drawn for one headline channel or several, with a panel per
channel and the leads of 1, 3, 5 and 10 days; the forecast's directory lists and holds both; a grid without
mid-latitudes has neither spectra nor their figure."""

from __future__ import annotations

import json
from collections.abc import Sequence

import matplotlib.image
import numpy as np
import pytest
import torch

from dlscale.data.trajectories import ForecastStart
from dlscale.report.figures import save_png
from dlscale.report.forecast_figures import BIAS_FIGURE, SPECTRA_FIGURE, bias_figure, spectra_figure
from dlscale.report.forecast_report import forecast_document
from dlscale.run.forecast import _write
from dlscale.runtime.strict_json import to_json
from dlscale.scoring.rollout import roll_out

IDENTITY = {"workload": "earth", "split": "test", "checkpoint_name": "ckpt_latest"}
RADIUS_M = 1000 * (6357 + 6378) / 2  # WeatherBench2's Earth radius, written out here
LATITUDES = np.array([67.5, 52.5, 37.5, 22.5, 7.5, -7.5, -22.5, -37.5, -52.5, -67.5])
LONGITUDES = 360.0 * np.arange(16) / 16


class EarthTrajectories:
    """C channels on a 10 x 16 grid of the Earth, a state per 6 hours, one trajectory of 48: per channel a few
    zonal waves drifting east, plus fixed noise (small scales a smoothing model loses)."""

    step_hours = hours_per_state = 6.0
    latitudes, longitudes = LATITUDES, LONGITUDES

    def __init__(self, channels: Sequence[str] = ("z500", "t850", "t2m", "u10")):
        self.channel_names = tuple(channels)
        self.units = tuple("K" if name.startswith("t") else "m/s" for name in channels)
        self.noise = torch.from_numpy(np.random.default_rng(0).normal(size=(len(channels), 10, 16))).float()

    def starts(self) -> list[ForecastStart]:
        return [ForecastStart(0, step) for step in range(48)]

    def states(self, starts: Sequence[ForecastStart], lead: int) -> torch.Tensor:
        times = torch.tensor([start.step + lead for start in starts], dtype=torch.float32)[:, None, None]
        columns = torch.arange(16, dtype=torch.float32)
        rows = torch.arange(10, dtype=torch.float32)[:, None]
        waves = [
            (c + 1) * torch.cos(2 * torch.pi * (2 * columns - 0.3 * times) / 16 + rows)
            + torch.sin(2 * torch.pi * (5 * columns - times) / 16)
            + 0.3 * self.noise[c]
            for c in range(len(self.channel_names))
        ]
        return torch.stack(waves, dim=1)  # (N, C, H, W)

    def normalize(self, states: torch.Tensor) -> torch.Tensor:
        return states.clone()

    def to_physical(self, normalized: torch.Tensor) -> torch.Tensor:
        return normalized.clone()

    def climatology(self) -> torch.Tensor | None:
        return None

    def describe(self) -> str:
        return "the Earth"


def smooth_and_warm(state: torch.Tensor) -> torch.Tensor:
    """A model that blurs along each row and warms by 0.1 a step."""
    return (torch.roll(state, 1, -1) + 2 * state + torch.roll(state, -1, -1)) / 4 + 0.1


def rolled_out(trajectories: EarthTrajectories, steps: int = 40, count: int = 4):
    starts = trajectories.starts()[:count]
    rollout = roll_out(smooth_and_warm, trajectories, starts, steps, 3, torch.device("cpu"))
    document = forecast_document(rollout, trajectories, IDENTITY, [s.describe() for s in starts])
    return rollout, starts, document


def spectrum_by_numpy(fields: np.ndarray) -> np.ndarray:
    """(C, 9): the band's (30 to 60 degrees) cos-weighted mean over rows, then over the N initial times, of
    WeatherBench2's spectrum of (N, C, H, 16) fields."""
    band = np.flatnonzero((np.abs(LATITUDES) >= 30) & (np.abs(LATITUDES) <= 60))
    weights = np.cos(np.deg2rad(LATITUDES[band]))
    weights /= weights.sum()
    circles = 2 * np.pi * RADIUS_M * np.cos(np.deg2rad(LATITUDES[band]))
    coefficients = np.fft.rfft(fields[:, :, band].astype(np.float64), axis=-1) / 16
    doubled = np.array([1.0] + [2.0] * 7 + [1.0])
    spectra = np.abs(coefficients) ** 2 * doubled * circles[:, None]
    return (spectra * weights[:, None]).sum(axis=2).mean(axis=0)


def test_scores_json_holds_the_spectra_at_the_report_leads_and_the_ratio_at_every_lead():
    trajectories = EarthTrajectories()
    rollout, starts, document = rolled_out(trajectories)
    spectra = json.loads(to_json(document))["spectra"]
    assert spectra["lead_hours"] == [24.0, 72.0, 120.0, 168.0, 240.0]
    assert spectra["wavenumbers"] == list(range(9))
    assert spectra["rows"] == 4 and spectra["mean_latitude"] == pytest.approx(45.0)
    assert spectra["units"]["t850"] == "m (K)^2"
    for c, name in enumerate(trajectories.channel_names):
        assert len(spectra["model"]["energy"][name]) == len(spectra["truth"]["energy"][name]) == 5
        assert len(spectra["model"]["small_scale_ratio"][name]) == 41
        for index, lead in enumerate((4, 12, 20, 28, 40)):
            expected = spectrum_by_numpy(trajectories.states(starts, lead).numpy())[c]
            np.testing.assert_allclose(spectra["truth"]["energy"][name][index], expected, rtol=1e-6)
        ratios = spectra["model"]["small_scale_ratio"][name]
        assert ratios[0] == pytest.approx(1.0)  # lead 0: the model's state is the truth
        assert ratios[-1] < 0.1  # 40 steps of smoothing: the short waves are gone


@pytest.mark.slow
@pytest.mark.parametrize("channels", [("t2m",), ("z500", "t850", "t2m", "u10")])
def test_the_spectra_and_bias_figures_have_a_panel_per_channel_and_are_written(channels, tmp_path):
    trajectories = EarthTrajectories(channels)
    _, _, document = rolled_out(trajectories)
    spectra, bias = spectra_figure(document), bias_figure(document)
    for figure, name in ((spectra, SPECTRA_FIGURE), (bias, BIAS_FIGURE)):
        titled = [axis.get_title().split("\n")[0] for axis in figure.axes if axis.get_title()]
        assert titled == list(channels), name
        path = save_png(figure, tmp_path / name)
        image = matplotlib.image.imread(path)
        assert path.stat().st_size > 10_000 and image.std() > 0.05, name  # drawn, not blank
    # The spectra at 1, 3, 5 and 10 days (not 7), the truth's and the model's.
    labels = [text.get_text() for text in spectra.legends[0].get_texts()]
    days = ("1d", "3d", "5d", "10d")
    assert labels == [f"truth +{day}" for day in days] + [f"model +{day}" for day in days]
    # The bias panel: the model's and persistence's bias per lead, and the zero line.
    axis = bias.axes[-1]
    lines = {line.get_label(): line for line in axis.get_lines()}
    model_bias = document["scores"]["model"]["bias"][channels[-1]]
    np.testing.assert_allclose(lines["model"].get_ydata(), model_bias)
    assert lines["model"].get_ydata()[-1] == pytest.approx(4.0, rel=1e-3)  # warms 0.1 a step for 40 steps
    np.testing.assert_allclose(lines["persistence"].get_xdata(), np.arange(41) / 4)  # days
    assert any(np.all(np.asarray(line.get_ydata()) == 0.0) for line in axis.get_lines())  # the zero line


def test_a_short_rollouts_spectra_figure_draws_all_its_leads():
    _, _, document = rolled_out(EarthTrajectories(("u10",)), steps=8)  # 2 days: 12, 24, 36 and 48 hours
    labels = [text.get_text() for text in spectra_figure(document).legends[0].get_texts()]
    assert labels == [f"{kind} +{lead}" for kind in ("truth", "model") for lead in ("12h", "1d", "36h", "2d")]


def test_the_forecast_directory_lists_and_holds_both_figures(tmp_path):
    trajectories = EarthTrajectories(("z500", "u10"))
    rollout, starts, document = rolled_out(trajectories, steps=8)
    written = _write(tmp_path / "forecast", document, rollout, trajectories, starts, None)
    assert {BIAS_FIGURE, SPECTRA_FIGURE} <= set(document["files"])
    for path in written:
        assert path.stat().st_size > 0, path
    saved = json.loads((tmp_path / "forecast" / "scores.json").read_text())
    assert saved["spectra"]["lead_hours"] == [12.0, 24.0, 36.0, 48.0]
    assert "spectra" in saved["conventions"]


def test_a_grid_without_mid_latitudes_has_no_spectra_and_no_spectra_figure(tmp_path, monkeypatch):
    trajectories = EarthTrajectories(("u10",))
    monkeypatch.setattr(trajectories, "latitudes", np.linspace(20, -20, 10))  # a crop of the tropics
    rollout, starts, document = rolled_out(trajectories, steps=4)
    assert rollout.spectra is None and document["spectra"] is None
    assert spectra_figure(document) is None
    _write(tmp_path / "forecast", document, rollout, trajectories, starts, None)
    assert SPECTRA_FIGURE not in document["files"] and BIAS_FIGURE in document["files"]
    assert not (tmp_path / "forecast" / SPECTRA_FIGURE).exists()
