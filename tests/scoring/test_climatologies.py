"""A climatology by valid time looks up each start's time plus the lead's hours; the mean field is the same for
every time."""

from __future__ import annotations

import numpy as np
import torch

from dlscale.data.trajectories import ForecastStart
from dlscale.scoring.climatologies import TimeMeanClimatology, ValidTimeClimatology


def test_the_valid_time_is_the_start_plus_lead_model_steps():
    asked: list[np.ndarray] = []

    def lookup(times: np.ndarray) -> np.ndarray:
        asked.append(times)
        return np.zeros((len(times), 2, 3, 4), np.float32)

    starts = [
        ForecastStart(0, 0, np.datetime64("2016-02-28T18:00")),
        ForecastStart(0, 2, np.datetime64("2016-12-31T06:00")),
    ]
    climatology = ValidTimeClimatology(lookup, step_hours=12.0, description={"kind": "day_of_year_and_hour"})
    fields = climatology.fields(starts, lead=3)
    assert fields.shape == (2, 2, 3, 4) and fields.dtype == torch.float32
    expected = np.array(
        ["2016-03-01T06:00", "2017-01-01T18:00"], dtype="datetime64[m]"
    )  # + 36 h, over 29 Feb
    np.testing.assert_array_equal(asked[0], expected)


def test_the_time_mean_is_one_field_for_every_valid_time():
    field = torch.arange(24.0).reshape(2, 3, 4)
    climatology = TimeMeanClimatology(field, {"kind": "time_mean"})
    assert climatology.fields([ForecastStart(0, 0)], lead=5) is field
