"""``dlscale score --truth DATA_ROOT``: a dlscale data root (``synth-era5``'s: dates from its files' years, the
tutorial's grid) is the truth by its dates, grid and physical values, in any time order its files keep; one of
its split directories is too; a forecast on the crop a run reads is scored on that crop; its damaged or
missing truth is left out and named as a store's; a root without the split holding the forecast's dates, on
another grid, with a date twice or a damaged file is one line with nothing written; scoring shows its progress
in initial times under score's own logger."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

import dlscale
import dlscale.run.score as score_module
from dlscale.cli import main
from dlscale.data.era5.layout import ERA5_CHANNELS
from dlscale.data.era5.synth import spec_from_preset, write_synthetic_era5

xarray = pytest.importorskip("xarray", reason="the era5 extra (xarray, zarr) reads the forecasts")

pytestmark = pytest.mark.filterwarnings("ignore:Consolidated metadata:UserWarning")
OFFSETS = {"z500": 2.5, "t2m": -1.5, "u10": 0.25}
INIT_STEPS = (0, 2, 4)  # time indices of the test year's file: initial times every 12 h from 1 January
LEADS_HOURS = (6, 12)


def year_of_test_split(root: Path) -> tuple[np.ndarray, np.ndarray]:
    """The dates (from the file's year, 6-hourly) and fields (T, C, H, W) of the root's test year."""
    (path,) = sorted((root / "test").glob("*.h5"))
    with h5py.File(path, "r") as handle:
        fields = handle["fields"][()]
    dates = np.datetime64(f"{path.stem}-01-01T00", "ns") + np.arange(len(fields)) * np.timedelta64(6, "h")
    return dates, fields


def offset_forecast(
    root: Path, path: Path, rows: slice = slice(None), init_steps=INIT_STEPS, time_chunk: int | None = None
) -> Path:
    """A forecast in WeatherBench2's layout with the channels' own names: the root's test year at each valid time
    plus the channel's offset, on the tutorial's grid (``rows``: a part of it); ``time_chunk``: its zarr chunks'
    initial times (default: zarr's choice)."""
    dates, fields = year_of_test_split(root)
    height, width = fields.shape[2:]
    values = {
        channel: (
            ("time", "prediction_timedelta", "latitude", "longitude"),
            np.stack(
                [
                    [fields[t + hours // 6, ERA5_CHANNELS.index(channel)] for hours in LEADS_HOURS]
                    for t in init_steps
                ]
            )[:, :, rows].astype(np.float32)
            + np.float32(offset),
        )
        for channel, offset in OFFSETS.items()
    }
    coords = {
        "time": dates[list(init_steps)],
        "prediction_timedelta": np.array(LEADS_HOURS, "timedelta64[h]").astype("timedelta64[ns]"),
        "latitude": np.linspace(90, -90, height)[rows],
        "longitude": np.arange(width) * 360.0 / width,
    }
    dataset = xarray.Dataset(values, coords=coords)
    if time_chunk is not None:
        for variable in dataset.data_vars.values():
            variable.encoding["chunks"] = (time_chunk, *variable.shape[1:])
    dataset.to_zarr(path, mode="w")
    return path


def copied(root: Path, tmp_path: Path) -> Path:
    """A copy of the session's data root to damage."""
    return Path(shutil.copytree(root, tmp_path / "root"))


def assert_offset_scores(document: dict) -> None:
    """The model's bias is each channel's offset and its RMSE the offset's size, at both leads."""
    for channel, offset in OFFSETS.items():
        model = document["scores"]["model"]
        np.testing.assert_allclose(model["bias"][channel][1:], [offset] * 2, atol=2e-3, err_msg=channel)
        np.testing.assert_allclose(model["rmse"][channel][1:], [abs(offset)] * 2, atol=2e-3, err_msg=channel)


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("dlscale: error: "), error
    return error[0]


@pytest.mark.parametrize("truth", ["the data root", "its test split"])
def test_a_data_root_is_the_truth_by_its_dates_grid_and_physical_values(truth, tiny_era5, tmp_path):
    forecast = offset_forecast(tiny_era5, tmp_path / "forecast.zarr")
    where = tiny_era5 if truth == "the data root" else tiny_era5 / "test"
    document = dlscale.score(forecast, where, out=tmp_path / "scores", figures=False)
    assert document["initial_time_count"] == len(INIT_STEPS)
    assert document["truth"] == str(where)
    assert_offset_scores(document)
    # persistence: the root's state at each initial time, against its state 6 h on
    _, fields = year_of_test_split(tiny_era5)
    latitudes = np.linspace(90, -90, fields.shape[2])
    weights = np.cos(np.deg2rad(latitudes)) / np.cos(np.deg2rad(latitudes)).mean()
    c = ERA5_CHANNELS.index("t2m")
    error = fields[[t + 1 for t in INIT_STEPS], c].astype(np.float64) - fields[list(INIT_STEPS), c]
    rmse = np.sqrt((error**2 * weights[None, :, None]).mean())
    assert document["scores"]["persistence"]["rmse"]["t2m"][1] == pytest.approx(rmse, rel=1e-5)


def test_a_root_whose_files_keep_their_times_in_another_order_scores_the_same(tiny_era5, tmp_path):
    """An imported file holds its dates in a ``time`` dataset: the states are found by date, not position."""
    forecast = offset_forecast(tiny_era5, tmp_path / "forecast.zarr")
    root = copied(tiny_era5, tmp_path)
    dates, fields = year_of_test_split(root)
    order = np.random.default_rng(0).permutation(len(dates))
    with h5py.File(next((root / "test").glob("*.h5")), "r+") as handle:
        handle["fields"][...] = fields[order]
        handle["time"] = (dates[order] - np.datetime64("1970-01-01", "ns")) // np.timedelta64(1, "s")
    expected = dlscale.score(forecast, tiny_era5, out=tmp_path / "in-order", figures=False)
    shuffled = dlscale.score(forecast, root, out=tmp_path / "shuffled", figures=False)
    assert shuffled["scores"] == expected["scores"]


def test_a_forecast_on_the_crop_a_run_reads_is_scored_on_that_crop(tiny_era5, tmp_path, capsys):
    forecast = offset_forecast(tiny_era5, tmp_path / "crop.zarr", rows=slice(0, 12))
    assert (
        main(
            ["score", str(forecast), "--truth", str(tiny_era5), "--out", str(tmp_path / "s"), "--no-figures"]
        )
        == 0
    )
    assert "scored on the top-left 12 x 32 of its 16 x 32 grid" in capsys.readouterr().out
    assert_offset_scores(json.loads((tmp_path / "s" / "scores.json").read_text()))
    # any other part of the grid is not what a run reads: refused, as on a store
    shifted = offset_forecast(tiny_era5, tmp_path / "shifted.zarr", rows=slice(4, 16))
    assert main(["score", str(shifted), "--truth", str(tiny_era5), "--out", str(tmp_path / "t")]) == 2
    assert "is not the truth's, 16 latitudes x 32 longitudes" in one_error_line(capsys)
    assert not (tmp_path / "t").exists()


def test_nan_in_a_year_file_leaves_out_the_initial_times_it_touches_and_names_them(
    tiny_era5, tmp_path, capsys
):
    forecast = offset_forecast(tiny_era5, tmp_path / "forecast.zarr")
    root = copied(tiny_era5, tmp_path)
    with h5py.File(next((root / "test").glob("*.h5")), "r+") as handle:
        handle["fields"][3, ERA5_CHANNELS.index("z500"), 2, 5] = np.nan  # the valid time of step 2 at 6 h
    document = dlscale.score(forecast, root, out=tmp_path / "scores", figures=False)
    assert document["initial_time_count"] == 2
    (why,) = document["truth_unusable"].values()
    assert "1982-01-01T12:00 (at lead 6h, 1982-01-01T18:00: channel z500" in why and "NaN at 1 of 512" in why
    assert "1 whose truth has a missing chunk or NaN" in capsys.readouterr().out


def test_a_year_file_without_dates_is_left_out_and_said(tiny_era5, tmp_path, capsys):
    forecast = offset_forecast(tiny_era5, tmp_path / "forecast.zarr")
    root = copied(tiny_era5, tmp_path)
    (root / "train" / "1979.h5").rename(root / "train" / "first.h5")
    assert (
        main(["score", str(forecast), "--truth", str(root), "--out", str(tmp_path / "s"), "--no-figures"])
        == 0
    )
    assert "left out train/first.h5: no 'time' dataset and no year as its name" in capsys.readouterr().out


def without_the_test_split(root: Path) -> str:
    shutil.rmtree(root / "test")
    return "it has no test/"


def with_a_date_twice(root: Path) -> str:
    shutil.copy(root / "test" / "1982.h5", root / "valid" / "1982.h5")
    return "valid/1982.h5 (index 0) and test/1982.h5 (index 0) both hold 1982-01-01T00:00"


def on_another_grid(root: Path) -> str:
    shutil.rmtree(root)
    write_synthetic_era5(root, spec_from_preset("tiny", height=8, width=16))
    return "its grid, 16 latitudes x 32 longitudes (-90..90, 0..348.75), is not the truth's, 8 latitudes x 16"


def with_a_truncated_file(root: Path) -> str:
    path = root / "test" / "1982.h5"
    path.write_bytes(path.read_bytes()[:5000])
    return "test/1982.h5: cannot be opened as HDF5"


def with_another_format_under_the_name(root: Path) -> str:
    (root / "test" / "1982.h5").write_text("year,value\n1982,1\n")
    return "test/1982.h5: cannot be opened as HDF5"


def with_a_directory_under_the_name(root: Path) -> str:
    (root / "test" / "1983.h5").mkdir()
    return "test/1983.h5: cannot be opened as HDF5"


def with_other_channels_in_a_split(root: Path) -> str:
    with h5py.File(root / "valid" / "1981.h5", "r+") as handle:
        handle["fields"].attrs["channels"] = [f"x{i}" for i in range(20)]
    return "valid/1981.h5: holds the channels x0, x1"


@pytest.mark.parametrize(
    "damage",
    [
        without_the_test_split,
        with_a_date_twice,
        on_another_grid,
        with_a_truncated_file,
        with_another_format_under_the_name,
        with_a_directory_under_the_name,
        with_other_channels_in_a_split,
    ],
)
def test_a_root_that_cannot_be_the_truth_is_one_line_with_nothing_written(
    damage, tiny_era5, tmp_path, capsys
):
    forecast = offset_forecast(tiny_era5, tmp_path / "forecast.zarr")
    root = copied(tiny_era5, tmp_path)
    expected = damage(root)
    out = tmp_path / "scores"
    assert main(["score", str(forecast), "--truth", str(root), "--out", str(out)]) == 2
    line = one_error_line(capsys)
    assert expected in line, line
    assert not out.exists()


def test_a_root_without_the_split_names_what_it_holds_and_the_way_out(tiny_era5, tmp_path, capsys):
    forecast = offset_forecast(tiny_era5, tmp_path / "forecast.zarr")
    root = copied(tiny_era5, tmp_path)
    without_the_test_split(root)
    assert main(["score", str(forecast), "--truth", str(root)]) == 2
    line = one_error_line(capsys)
    assert (
        "holds none of their valid times at every lead (it holds 72 times: train/ 1979-01-01T00:00 .." in line
    )
    assert "valid/ 1981-01-01T00:00 .. 1981-01-06T18:00; it has no test/)" in line
    assert "give --truth a store or data root that holds the forecast's dates" in line


def test_scoring_shows_its_progress_in_initial_times_under_its_own_logger(
    tiny_era5, tmp_path, capsys, monkeypatch
):
    forecast = offset_forecast(tiny_era5, tmp_path / "forecast.zarr", time_chunk=1)
    monkeypatch.setattr(score_module, "PROGRESS_INTERVAL_S", 0.0)  # a line per batch (stdout is no terminal)
    monkeypatch.setattr(score_module, "BATCH_INITIAL_TIMES", 2)
    assert (
        main(
            ["score", str(forecast), "--truth", str(tiny_era5), "--out", str(tmp_path / "s"), "--no-figures"]
        )
        == 0
    )
    lines = [line for line in capsys.readouterr().out.splitlines() if " - scoring: " in line]
    assert [line.split(" - ", 2)[1] for line in lines] == ["dlscale.score"] * 2
    assert "scoring: 2/3 initial times (67%)" in lines[0] and "ETA" in lines[0]
    assert "scoring: 3/3 initial times (100%)" in lines[1]
