"""What the forecast's report shows: the leads a rollout has (short rollouts too), the headline channels of
any workload (its own list, checked; ERA5's four; all of a few; the first of many, said), and maps laid out for
one or many leads with a colour bar that says when the forecast leaves its range."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg

from dlscale.data.trajectories import ForecastStart
from dlscale.errors import WorkloadError
from dlscale.report.forecast_report import (
    HEADLINE_DAYS,
    MAP_DAYS,
    forecast_document,
    headline_lines,
    maps_figure,
    skill_figure,
)
from dlscale.report.forecast_selection import MAX_HEADLINE_CHANNELS, headline_channels, report_leads
from dlscale.scoring.rollout import RolloutMaps, roll_out

IDENTITY = {"workload": "line", "split": "test", "checkpoint_name": "ckpt_latest"}


class LineTrajectories:
    """A workload's own trajectories: C channels on a 1-D line of 16 points (H = 1, not on the Earth), one
    state per hour, one trajectory of 30 states; each channel a wave drifting one point per state."""

    step_hours = 1.0
    hours_per_state = 1.0
    latitudes = np.zeros(1)
    longitudes = np.arange(16.0)

    def __init__(self, channels: Sequence[str] = ("u", "v", "p"), headline: object = None):
        self.channel_names = tuple(channels)
        self.units = tuple("m/s" if name != "p" else "" for name in channels)
        self.long_names = self.channel_names
        if headline is not None:
            self.headline_channels = headline

    def starts(self) -> list[ForecastStart]:
        return [ForecastStart(0, step) for step in range(30)]

    def reach(self, start: ForecastStart) -> int:
        return 29 - start.step

    def states(self, starts: Sequence[ForecastStart], lead: int) -> torch.Tensor:
        steps = torch.tensor([start.step + lead for start in starts], dtype=torch.float32)
        points = torch.arange(16, dtype=torch.float32)
        waves = [
            torch.sin((points[None, :] - steps[:, None]) / (c + 2)) for c in range(len(self.channel_names))
        ]
        return torch.stack(waves, dim=1)[:, :, None, :]  # (N, C, 1, W)

    def normalize(self, states: torch.Tensor) -> torch.Tensor:
        return states.clone()

    def to_physical(self, normalized: torch.Tensor) -> torch.Tensor:
        return normalized.clone()

    def climatology(self) -> torch.Tensor | None:
        return None

    def describe(self) -> str:
        return "a line"


def document_of(trajectories: LineTrajectories, steps: int, map_days: Sequence[float] = MAP_DAYS) -> dict:
    """The scores.json of a rollout of a model that damps each state a little."""
    starts = trajectories.starts()[:4]
    rollout = roll_out(
        lambda state: 0.9 * state,
        trajectories,
        starts,
        steps,
        batch_size=2,
        device=torch.device("cpu"),
        map_leads=report_leads(map_days, trajectories.step_hours, steps),
    )
    document = forecast_document(rollout, trajectories, IDENTITY, [s.describe() for s in starts])
    return {**document, "rollout": rollout}


# ---------------------------------------------------------------------------------------------------- leads


@pytest.mark.parametrize(
    ("lead_hours", "step_hours", "shown_hours"),
    [
        (12, 6, [6, 12]),  # --lead 12h: every lead
        (
            48,
            6,
            [12, 24, 36, 48],
        ),  # --lead 2d: an even spread ending at the last lead, not only the 1-day one
        (24, 6, [6, 12, 18, 24]),
        (96, 6, [24, 72, 96]),  # 4 days: the day marks, and the last lead the rollout stops at
        (240, 6, [24, 72, 120, 168, 240]),  # 10 days: the day marks
        (336, 6, [24, 72, 120, 168, 240]),  # beyond the last mark: the marks only
        (50, 5, [10, 20, 30, 40, 50]),  # 5-hour steps never land on a day: a spread of whole steps
    ],
)
def test_the_table_shows_the_leads_the_rollout_has(lead_hours, step_hours, shown_hours):
    steps = lead_hours // step_hours
    leads = report_leads(HEADLINE_DAYS, step_hours, steps)
    assert [lead * step_hours for lead in leads] == shown_hours


def test_the_maps_show_at_most_as_many_leads_as_the_day_marks():
    assert [lead * 6 for lead in report_leads(MAP_DAYS, 6.0, 8)] == [12, 24, 36, 48]
    assert [lead * 6 for lead in report_leads(MAP_DAYS, 6.0, 40)] == [24, 72, 120, 240]
    assert report_leads(MAP_DAYS, 6.0, 1) == [1]


def test_a_short_rollouts_table_prints_its_leads_in_hours():
    document = document_of(LineTrajectories(), steps=12)  # 12 one-hour steps: 3, 6, 9 and 12 h
    assert [row["lead_hours"] for row in document["headline"] if row["channel"] == "u"] == [3, 6, 9, 12]
    lines = headline_lines(document)
    assert [line.split()[:2] for line in lines[2:6]] == [["u", "3h"], ["u", "6h"], ["u", "9h"], ["u", "12h"]]


# ------------------------------------------------------------------------------------------- headline channels


def test_a_workload_of_its_own_gets_a_headline_of_all_its_few_channels():
    document = document_of(LineTrajectories(), steps=4)
    assert document["headline_channels"] == ["u", "v", "p"] and document["headline_note"] is None
    assert sorted({row["channel"] for row in document["headline"]}) == ["p", "u", "v"]
    model_rmse = document["scores"]["model"]["rmse"]
    for row in document["headline"]:
        lead = round(row["lead_hours"])
        assert row["model_rmse"] == model_rmse[row["channel"]][lead] > 0
    assert len(headline_lines(document)) == 2 + 3 * 4


def test_the_trajectories_own_headline_channels_lead_in_their_order():
    trajectories = LineTrajectories(headline=("p", "u"))
    assert headline_channels(trajectories).names == ("p", "u")
    document = document_of(trajectories, steps=2)
    assert [row["channel"] for row in document["headline"]] == ["p", "p", "u", "u"]
    figure = skill_figure(document)
    assert [axis.get_title() for axis in figure.axes[:2]] == ["p", "u"]


@pytest.mark.parametrize("named", [("u", "rain", "snow"), "u", ()])
def test_headline_channels_the_data_lacks_are_one_clear_error(named):
    with pytest.raises(WorkloadError) as caught:
        headline_channels(LineTrajectories(headline=named))
    message = str(caught.value)
    assert "LineTrajectories.headline_channels" in message and "u, v, p" in message
    if named:
        assert ("'rain', 'snow'" in message) == (named == ("u", "rain", "snow"))


def test_era5s_four_lead_where_the_data_has_them_in_weatherbench2s_order():
    era5_like = LineTrajectories(channels=("u10", "v10", "t2m", "sp", "msl", "t850", "z500", "r500"))
    assert headline_channels(era5_like).names == ("z500", "t850", "t2m", "u10")
    without_z500 = LineTrajectories(channels=("u10", "v10", "t2m", "sp", "msl", "t850", "r500"))
    assert headline_channels(without_z500).names == ("t850", "t2m", "u10")


def test_many_channels_of_a_workload_of_its_own_headline_the_first_few_and_say_so():
    channels = [f"c{index}" for index in range(9)]
    chosen = headline_channels(LineTrajectories(channels=channels))
    assert chosen.names == tuple(channels[:MAX_HEADLINE_CHANNELS])
    assert f"the first {MAX_HEADLINE_CHANNELS} of 9 channels" in chosen.note
    document = document_of(LineTrajectories(channels=channels), steps=2)
    assert document["headline_note"] == chosen.note
    assert chosen.note in skill_figure(document)._suptitle.get_text()


# ------------------------------------------------------------------------------------------------------ maps


def drawn_maps(leads: Sequence[int], drift: float) -> tuple[object, object]:
    """The maps of z500 on a 2:1 grid at ``leads`` (6-hour steps), the forecast ``drift`` times the truth's
    anomaly; and the figure's colour bars, drawn (so the text has its size)."""

    class Grid:
        channel_names, units = ("z500",), ("m^2/s^2",)
        latitudes = np.linspace(87.1875, -87.1875, 16)
        longitudes = np.arange(32) * 11.25

    maps = RolloutMaps(ForecastStart(0, 0, np.datetime64("1982-01-01T00:00")))
    truth = 54000 + 3000 * np.sin(np.deg2rad(Grid.latitudes))[:, None] * np.ones((1, 32))  # +- anomalies
    for lead in leads:
        maps.leads.append(lead)
        maps.truths.append(truth[None])
        maps.forecasts.append((54000 + (truth - 54000) * drift)[None])
    figure = maps_figure(maps, Grid(), "z500", 6.0)
    FigureCanvasAgg(figure).draw()
    return figure, [axis for axis in figure.axes if axis.get_label() == "<colorbar>"]


@pytest.mark.parametrize("leads", [[1], [2, 4, 6, 8], [4, 12, 20, 40]])
def test_the_maps_title_fits_the_figure_for_any_number_of_leads(leads):
    figure, _ = drawn_maps(leads, drift=1.0)
    renderer = figure.canvas.get_renderer()
    title = figure._suptitle.get_window_extent(renderer)
    width = figure.bbox.width
    assert title.x0 >= 0 and title.x1 <= width, (title.x0, title.x1, width)
    assert len([axis for axis in figure.axes if axis.get_title()]) == 3 * len(leads)


@pytest.mark.parametrize(("drift", "extend"), [(1.0, "neither"), (1.5, "both"), (0.5, "neither")])
def test_the_forecasts_colour_bar_points_where_the_forecast_leaves_the_truths_range(drift, extend):
    figure, bars = drawn_maps([4, 12], drift)
    truth_bar, forecast_bar, error_bar = (axis._colorbar for axis in bars)
    assert forecast_bar.extend == extend
    assert truth_bar.extend == error_bar.extend == "neither"
    assert ("pointed bar ends" in figure._suptitle.get_text()) == (extend != "neither")


def test_one_sided_drift_extends_one_end():
    maps_high = RolloutMaps(ForecastStart(0, 0))
    field = np.linspace(0.0, 1.0, 32).reshape(1, 1, 32) * np.ones((1, 4, 1))
    maps_high.leads, maps_high.truths, maps_high.forecasts = [1], [field], [field + 0.5]
    figure = maps_figure(maps_high, LineTrajectories(channels=("u",)), "u", 1.0)
    forecast_bar = [axis for axis in figure.axes if axis.get_label() == "<colorbar>"][1]._colorbar
    assert forecast_bar.extend == "max"


def test_a_grid_not_on_the_earth_is_drawn_in_rows_and_columns():
    document = document_of(LineTrajectories(), steps=3)
    maps = document["rollout"].maps
    figure = maps_figure(maps, LineTrajectories(), "u", 1.0)
    assert maps.leads == [1, 2, 3]
    assert figure.axes[0].get_ylabel() == "row" and figure.axes[6].get_xlabel() == "column"
