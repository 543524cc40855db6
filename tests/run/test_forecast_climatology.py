"""Which climatology a forecast is scored against: the data's store by default (when its starts have dates),
``--climatology PATH`` (dates needed: one line otherwise), ``--climatology time-mean``; every valid time is
checked against the store before the rollout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from era5_stores import ZARR_FORMAT_2

from dlscale.data.trajectories import ForecastStart
from dlscale.errors import ConfigError, DataError
from dlscale.run.forecast_climatology import choose_climatology
from dlscale.scoring.climatologies import TimeMeanClimatology, ValidTimeClimatology

xarray = pytest.importorskip("xarray", reason="the era5 extra (xarray, zarr) reads the store")

LATITUDES, LONGITUDES = np.array([45.0, -45.0]), np.array([0.0, 180.0])


class DatedTrajectories:
    """Two channels on a 2 x 2 grid, 6-hourly states from 2017-01-01 (the ERA5 workload's optional members)."""

    channel_names = ("z500", "t2m")
    weatherbench2_names = (("geopotential", 500), None)  # t2m looked up by its own name
    step_hours = 6.0
    latitudes, longitudes = LATITUDES, LONGITUDES

    def __init__(self, store: Path | None = None, dated: bool = True):
        self.climatology_store = store
        self.dated = dated

    def starts(self) -> list[ForecastStart]:
        first = np.datetime64("2017-01-01T00:00")
        return [
            ForecastStart(0, i, first + np.timedelta64(6 * i, "h") if self.dated else None) for i in range(4)
        ]

    def climatology(self) -> torch.Tensor:
        return torch.ones(2, 2, 2)


def write_store(path: Path, empty_days: tuple[int, ...] = ()) -> Path:
    days = np.arange(1, 367)
    values = np.broadcast_to(days.reshape(1, -1, 1, 1), (4, 366, 2, 2)).astype(np.float32).copy()
    values[:, [day - 1 for day in empty_days]] = np.nan
    dims = ("hour", "dayofyear", "latitude", "longitude")
    xarray.Dataset(
        {
            "geopotential": (("hour", "dayofyear", "level", "latitude", "longitude"), values[:, :, None]),
            "t2m": (dims, values),
        },
        coords={
            "hour": [0, 6, 12, 18],
            "dayofyear": days,
            "level": [500],
            "latitude": LATITUDES,
            "longitude": LONGITUDES,
        },
        attrs={"years": [1990, 2019], "window_days": 61, "days_without_data": list(empty_days)},
    ).to_zarr(path, mode="w", **ZARR_FORMAT_2, consolidated=True)
    return path


def test_the_datas_store_is_the_default_and_time_mean_names_the_mean_field(tmp_path):
    store = write_store(tmp_path / "clim.zarr")
    trajectories = DatedTrajectories(store)
    chosen = choose_climatology(None, trajectories, trajectories.starts(), steps=8)
    assert isinstance(chosen, ValidTimeClimatology)
    assert chosen.description["kind"] == "day_of_year_and_hour" and chosen.description["years"] == [
        1990,
        2019,
    ]
    assert float(chosen.fields(trajectories.starts()[:1], lead=4)[0, 1, 0, 0]) == 2.0  # 1 January + 1 day
    mean = choose_climatology("time-mean", trajectories, trajectories.starts(), steps=8)
    assert isinstance(mean, TimeMeanClimatology) and mean.description["kind"] == "time_mean"
    without = choose_climatology(None, DatedTrajectories(None), trajectories.starts(), steps=8)
    assert isinstance(without, TimeMeanClimatology)


def test_undated_starts_fall_back_to_the_mean_field_and_refuse_a_named_store(tmp_path):
    store = write_store(tmp_path / "clim.zarr")
    trajectories = DatedTrajectories(store, dated=False)
    assert isinstance(choose_climatology(None, trajectories, trajectories.starts(), 2), TimeMeanClimatology)
    with pytest.raises(ConfigError, match="initial times have no dates"):
        choose_climatology(str(store), trajectories, trajectories.starts(), 2)


def test_a_valid_time_on_a_day_without_data_stops_the_forecast_before_the_rollout(tmp_path):
    store = write_store(tmp_path / "clim.zarr", empty_days=(3,))
    trajectories = DatedTrajectories()
    # Leads up to 2 days from 1 January 18 UTC reach 3 January.
    with pytest.raises(DataError, match="at the valid time 2017-01-03T00:00"):
        choose_climatology(str(store), trajectories, trajectories.starts(), steps=8)
    assert choose_climatology(str(store), trajectories, trajectories.starts()[:1], steps=7) is not None


def test_the_mean_field_names_one_directory_however_it_was_chosen_and_the_store_none(tmp_path):
    from dlscale.run.forecast_climatology import directory_climatology
    from dlscale.run.results_directory import forecast_name_parts

    store = write_store(tmp_path / "clim.zarr")
    dated, bare, undated = DatedTrajectories(store), DatedTrajectories(None), DatedTrajectories(store, False)

    def part(requested, trajectories) -> list[str]:
        chosen = choose_climatology(requested, trajectories, trajectories.starts(), steps=2)
        reference = directory_climatology(requested, chosen)
        return forecast_name_parts("10d", "every:12h", None, None, 6.0, None, climatology=reference)

    assert part(None, dated) == []  # the data's own store by day of year: the default's name
    # the mean field, asked for or fallen back to (no store; starts without dates): one name
    assert part(None, bare) == part("time-mean", dated) == part(None, undated) == ["clim-timemean"]
    named = part(str(store), dated)
    assert len(named) == 1 and named[0].startswith("clim-") and named[0] != "clim-timemean"
    assert directory_climatology(None, None) == "none"  # no climatology at all: no ACC
    assert forecast_name_parts("10d", "every:12h", None, None, 6.0, None, climatology="none") == ["clim-none"]


def test_falling_back_to_the_mean_field_says_its_acc_is_not_weatherbench2s_and_what_builds_one(caplog):
    trajectories = DatedTrajectories(None)
    trajectories.climatology_command = "`dlscale data climatology --root /data/era5`"
    with caplog.at_level("INFO", logger="dlscale.train"):
        choose_climatology(None, trajectories, trajectories.starts(), steps=2)
    (warning,) = [record for record in caplog.records if record.levelname == "WARNING"]
    text = warning.getMessage()
    assert "not comparable with published ones" in text
    assert "`dlscale data climatology --root /data/era5` builds WeatherBench2's climatology" in text
    caplog.clear()
    with caplog.at_level("INFO", logger="dlscale.train"):
        choose_climatology("time-mean", trajectories, trajectories.starts(), steps=2)
    # asked for: said, not warned of
    assert [record.levelname for record in caplog.records] == ["INFO"]
    assert "not comparable with published ones" in caplog.records[0].getMessage()
