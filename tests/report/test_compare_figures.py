"""The skill and bias figures of a comparison (``dlscale score --compare``): a line per forecast, named by its
label, beside the baselines, each forecast in a colour of its own."""

from __future__ import annotations

from dlscale.report.forecast_figures import bias_figure, forecaster_styles
from dlscale.report.forecast_report import headline_lines, skill_figure


def comparison_document() -> dict:
    leads = [0.0, 6.0, 12.0]
    entry = {"rmse": {"z500": [0.0, 1.0, 2.0]}, "bias": {"z500": [0.0, 0.5, 1.0]}, "acc": None}
    return {
        "title": "2 forecasts against era5.zarr",
        "initial_time_count": 3,
        "lead_hours": leads,
        "step_hours": 6.0,
        "channels": ["z500"],
        "units": {"z500": "m**2 s**-2"},
        "forecasters": ["mine", "hres", "persistence"],
        "scores": {"mine": entry, "hres": entry, "persistence": entry},
        "headline_channels": ["z500"],
        "headline_note": None,
        "headline": [
            {
                "channel": "z500",
                "lead_hours": 6.0,
                "mine_rmse": 1.0,
                "hres_rmse": 2.0,
                "persistence_rmse": 3.0,
            }
        ],
    }


def test_each_compared_forecast_is_a_line_of_its_own_colour_beside_the_baselines():
    document = comparison_document()
    for figure in (skill_figure(document), bias_figure(document)):
        labels = [
            line.get_label() for line in figure.axes[0].get_lines() if not line.get_label().startswith("_")
        ]
        assert labels == ["mine", "hres", "persistence"]
        assert "2 forecasts against era5.zarr: 3 initial times" in figure.texts[0].get_text()
    styles = forecaster_styles(document["forecasters"])
    assert styles["persistence"] == ("C1", "--")
    assert len({styles["mine"], styles["hres"], styles["persistence"]}) == 3


def test_the_headline_table_has_a_column_per_compared_forecast():
    lines = headline_lines(comparison_document())
    assert lines[1].split()[3:] == ["mine", "hres", "persistence"]
    assert lines[2].split()[-3:] == ["1", "2", "3"]
