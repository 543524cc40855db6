"""``dlscale score`` against HOSTILE_INPUTS.md: where its results go (never over someone else's files, never
silently over its own), forecasts with their coordinates in any order or repeated, in other units and
conventions, with NaN, infinite, float16, float64 or integer values, on a cropped or shifted grid, with what the
truth cannot match, and ``--channels`` / ``--times``. Every case through the command line; the forecasts are
hand-made from the truth (``tests/run/test_score.py``'s ``offset_forecast``), no training."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dlscale.cli import main

xarray = pytest.importorskip("xarray", reason="the era5 extra (xarray, zarr) reads the stores")
from era5_stores import grid, random_truth, six_hourly_times, write_wb2  # noqa: E402
from test_score import HEIGHT, OFFSETS, WIDTH, climatology_store, offset_forecast  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Consolidated metadata:UserWarning")
STEPS = 12  # six-hourly truth states: 2018-01-01T00 .. 2018-01-03T18


@pytest.fixture(scope="module")
def truth_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    return write_wb2(root / "truth.zarr", random_truth(STEPS, HEIGHT, WIDTH), six_hourly_times([2018], STEPS))


@pytest.fixture(scope="module")
def base(truth_store: Path, tmp_path_factory: pytest.TempPathFactory) -> xarray.Dataset:
    """The truth plus OFFSETS, 3 initial times 12 h apart, leads 0, 6 and 12 h, north to south, in memory."""
    path = offset_forecast(truth_store, tmp_path_factory.mktemp("base") / "base.zarr", OFFSETS)
    with xarray.open_zarr(path) as opened:
        return opened.load()


def write(dataset: xarray.Dataset, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    dataset.to_zarr(path, mode="w")
    return path


def score(forecast: Path, truth: Path, out: Path, *options: str) -> int:
    return main(["score", str(forecast), "--truth", str(truth), "--out", str(out), "--no-figures", *options])


def scores(out: Path) -> dict:
    return json.loads((out / "scores.json").read_text())


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with a file's bytes (None for a directory): to see that nothing changed."""
    return {
        str(path.relative_to(root)): (path.read_bytes() if path.is_file() else None)
        for path in sorted(root.rglob("*"))
    }


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("dlscale: error: "), error
    return error[0]


# ---- Outputs: where results go, never replaced silently -----------------------------------------------------------


def forecast_results(root: Path, base: xarray.Dataset) -> Path:
    """A dlscale forecast's results directory: its forecast.zarr and its own scores.json (no command 'score')."""
    directory = root / "forecast" / "test-ckpt_latest-zarr"
    write(base, directory / "forecast.zarr")
    (directory / "scores.json").write_text(
        json.dumps({"split": "test", "files": ["scores.json", "scores.csv"]})
    )
    (directory / "scores.csv").write_text("forecaster,channel\n")
    return directory


def an_earlier_score_with_a_users_file(root: Path, truth: Path, forecast: Path) -> Path:
    out = root / "earlier"
    assert score(forecast, truth, out) == 0
    (out / "notes.txt").write_text("mine")
    return out


OUT_CASES = {
    # --out, from (root, truth, forecast, forecast results directory) -> the message
    "the forecast's results directory": (lambda r, t, f, d: d, "holds the forecast"),
    "the forecast itself": (lambda r, t, f, d: f, "is the forecast"),
    "inside the forecast": (lambda r, t, f, d: f / "scores", "is inside the forecast"),
    "the truth": (lambda r, t, f, d: t, "is the truth"),
    "a forecast's scores without its data": (
        lambda r, t, f, d: (d / "forecast.zarr").rename(r / "moved.zarr") and d,
        "a scores.json that no dlscale score wrote",
    ),
    "a user's directory with an empty scores.json": (
        lambda r, t, f, d: (
            (r / "mine").mkdir() or (r / "mine" / "scores.json").write_text("{}") and r / "mine"
        ),
        "a scores.json that no dlscale score wrote",
    ),
    "an earlier score with a user's file": (
        lambda r, t, f, d: an_earlier_score_with_a_users_file(r, t, r / "moved.zarr"),
        "also 'notes.txt', which that score did not write",
    ),
    "a symbolic link": (
        lambda r, t, f, d: (r / "link").symlink_to(d, target_is_directory=True) or r / "link",
        "is a symbolic link",
    ),
}


@pytest.mark.parametrize("case", list(OUT_CASES))
def test_out_is_never_the_input_nor_a_directory_score_did_not_write(
    case, truth_store, base, tmp_path, capsys
):
    directory = forecast_results(tmp_path, base)
    forecast = directory / "forecast.zarr"
    if case == "an earlier score with a user's file":
        write(base, tmp_path / "moved.zarr")
    make, message = OUT_CASES[case]
    out = make(tmp_path, truth_store, forecast, directory)
    if not forecast.exists():
        forecast = tmp_path / "moved.zarr"
    before, truth_before = tree(tmp_path), tree(truth_store)
    capsys.readouterr()
    assert score(forecast, truth_store, out) == 2
    assert message in one_error_line(capsys)
    assert tree(tmp_path) == before and tree(truth_store) == truth_before, "nothing touched"


def test_an_earlier_scores_directory_is_replaced_and_the_console_says_so(truth_store, base, tmp_path, capsys):
    forecast = write(base, tmp_path / "forecast.zarr")
    out = tmp_path / "scores"
    assert score(forecast, truth_store, out) == 0
    assert "Replacing" not in capsys.readouterr().out
    assert score(forecast, truth_store, out, "--channels", "t2m") == 0
    assert f"Replacing the earlier scores in {out}" in capsys.readouterr().out
    assert scores(out)["channels"] == ["t2m"]


def test_other_channels_or_times_get_their_own_default_directory(truth_store, base, tmp_path):
    forecast = write(base, tmp_path / "mine.zarr")
    argv = ["score", str(forecast), "--truth", str(truth_store), "--no-figures"]
    assert main(argv) == 0
    assert main([*argv, "--channels", "z500,t2m"]) == 0
    assert main([*argv, "--times", "2018-01-01..2018-01-01"]) == 0
    names = sorted(path.name for path in tmp_path.glob("score-*"))
    assert len(names) == 3 and "score-mine" in names and "score-mine-times20180101-20180101" in names
    assert len(scores(tmp_path / "score-mine")["channels"]) == 4
    assert scores(tmp_path / "score-mine-times20180101-20180101")["initial_time_count"] == 2


# ---- Order and duplicates ---------------------------------------------------------------------------------------


def test_a_forecast_with_its_times_leads_and_levels_reordered_scores_exactly_as_the_sorted_one(
    truth_store, base, tmp_path
):
    climatology = climatology_store(tmp_path / "clim.zarr", *grid(HEIGHT, WIDTH))
    # another error at each initial time, so that pairing a forecast with another time's truth shows
    varied = base.copy(deep=True)
    varied["geopotential"] = varied["geopotential"] + xarray.DataArray([0.0, 30.0, 60.0], dims="time")
    reordered = varied.isel(time=[2, 0, 1], prediction_timedelta=[2, 0, 1], level=[1, 0])
    sorted_path, reordered_path = (
        write(varied, tmp_path / "sorted.zarr"),
        write(reordered, tmp_path / "re.zarr"),
    )
    options = ("--climatology", str(climatology))
    assert score(sorted_path, truth_store, tmp_path / "a", *options) == 0
    assert score(reordered_path, truth_store, tmp_path / "b", *options) == 0
    first, second = scores(tmp_path / "a"), scores(tmp_path / "b")
    assert second["initial_times"] == first["initial_times"]
    assert second["scores"] == first["scores"]  # exactly
    assert second["spectra"] == first["spectra"]


def test_a_grid_in_other_orders_and_conventions_scores_as_the_truths(truth_store, base, tmp_path):
    """Latitudes south to north, longitudes -180..180 (rolled), scattered: the same scores (another order of
    summation over the grid: to float32 rounding)."""
    flipped = base.isel(latitude=slice(None, None, -1), longitude=np.roll(np.arange(WIDTH), WIDTH // 2))
    flipped = flipped.assign_coords(longitude=((flipped.longitude + 180) % 360) - 180)
    assert float(flipped.longitude.min()) < 0
    assert score(write(base, tmp_path / "a.zarr"), truth_store, tmp_path / "a") == 0
    assert score(write(flipped, tmp_path / "b.zarr"), truth_store, tmp_path / "b") == 0
    for channel in ("z500", "t2m"):
        for measure in ("rmse", "bias"):
            np.testing.assert_allclose(
                scores(tmp_path / "b")["scores"]["model"][measure][channel],
                scores(tmp_path / "a")["scores"]["model"][measure][channel],
                rtol=1e-5,
            )


DUPLICATED = {
    "time": (lambda d: d.isel(time=[0, 0, 1, 2]), "its 'time' coordinate holds 2018-01-01T00:00 2 times"),
    "lead": (
        lambda d: d.isel(prediction_timedelta=[0, 1, 1, 2]),
        "its 'prediction_timedelta' coordinate holds 6 h 2 times",
    ),
    "level": (lambda d: d.isel(level=[0, 0, 1]), "its 'level' coordinate holds 500 2 times"),
    "latitude": (
        lambda d: d.isel(latitude=[0, *range(HEIGHT - 1)]),
        "its 'latitude' coordinate holds 90 2 times",
    ),
    "longitude 0 and 360": (
        lambda d: d.isel(longitude=[*range(WIDTH), 0]).assign_coords(longitude=[*d.longitude.values, 360.0]),
        "its 'longitude' coordinate holds 0 2 times",
    ),
}


@pytest.mark.parametrize("case", list(DUPLICATED))
def test_a_repeated_coordinate_value_is_one_line_naming_the_file_and_value(
    case, truth_store, base, tmp_path, capsys
):
    make, message = DUPLICATED[case]
    forecast = write(make(base), tmp_path / "forecast.zarr")
    before = tree(tmp_path)
    assert score(forecast, truth_store, tmp_path / "scores") == 2
    line = one_error_line(capsys)
    assert str(forecast) in line and message in line, line
    assert tree(tmp_path) == before


def ensemble_of(base: xarray.Dataset, numbers: list[int]) -> xarray.Dataset:
    """Members ``numbers``, member n the forecast plus n in every field (number 0: the control, the forecast)."""
    members = [base + float(n) for n in numbers]
    return xarray.concat(members, dim="number").assign_coords(number=numbers).transpose("time", "number", ...)


def test_members_in_any_order_score_as_in_increasing_order(truth_store, base, tmp_path):
    in_order = write(ensemble_of(base, [0, 1, 2]), tmp_path / "in_order.zarr")
    shuffled = write(ensemble_of(base, [2, 0, 1]), tmp_path / "shuffled.zarr")
    assert score(in_order, truth_store, tmp_path / "a") == 0
    assert score(shuffled, truth_store, tmp_path / "b") == 0
    first, second = scores(tmp_path / "a"), scores(tmp_path / "b")
    assert second["scores"] == first["scores"]
    for entry in ("crps", "spread", "spread_skill", "rank_histograms"):
        assert second["ensemble"][entry] == first["ensemble"][entry], entry
    np.testing.assert_allclose(first["scores"]["model"]["bias"]["t2m"], OFFSETS["2m_temperature"], rtol=1e-4)


def test_a_member_with_nan_is_named_and_the_first_members_scores_stay_finite(
    truth_store, base, tmp_path, capsys
):
    members = ensemble_of(base, [0, 1, 2])
    broken = members["2m_temperature"].values.copy()
    broken[1, 2, 1] = np.nan  # the second initial time's member 2, at lead 6 h
    members["2m_temperature"] = members["2m_temperature"].copy(data=broken)
    capsys.readouterr()
    assert score(write(members, tmp_path / "ens.zarr"), truth_store, tmp_path / "scores") == 0
    console = capsys.readouterr().out
    assert "the member numbered 2 (of its 3) holds NaN or infinite values from lead 6 h on" in console
    assert "The forecast" not in console, "the first member, scored as the model, is finite"
    document = scores(tmp_path / "scores")
    assert document["ensemble"]["nonfinite_members"] == [2]
    assert np.isfinite(document["scores"]["model"]["rmse"]["t2m"]).all()
    assert document["nonfinite"]["forecasts"] == {}


# ---- Units and conventions --------------------------------------------------------------------------------------


@pytest.mark.parametrize("units", ["Pa", None])
def test_levels_in_pa_are_read_as_hpa_and_the_console_says_so(units, truth_store, base, tmp_path, capsys):
    in_pa = base.assign_coords(level=base.level * 100)
    if units:
        in_pa.level.attrs["units"] = units
    assert score(write(base, tmp_path / "hpa.zarr"), truth_store, tmp_path / "a") == 0
    capsys.readouterr()
    assert score(write(in_pa, tmp_path / "pa.zarr"), truth_store, tmp_path / "b") == 0
    assert "its levels are in Pa" in capsys.readouterr().out
    first, second = scores(tmp_path / "a"), scores(tmp_path / "b")
    assert sorted(second["channels"]) == sorted(first["channels"]) and "z500" in second["channels"]
    assert second["scores"] == first["scores"]


def test_a_truth_with_its_levels_in_pa_scores_as_in_hpa_and_the_console_says_so(
    truth_store, base, tmp_path, capsys
):
    with xarray.open_zarr(truth_store) as opened:
        in_pa = opened.load().assign_coords(level=opened.level * 100)
    in_pa.level.attrs["units"] = "Pa"
    for variable in in_pa.variables.values():
        variable.encoding = {}  # the store's zarr format 2 codecs: written anew in this zarr's default
    truth_in_pa = write(in_pa, tmp_path / "truth_pa.zarr")
    forecast = write(base, tmp_path / "forecast.zarr")
    assert score(forecast, truth_store, tmp_path / "a") == 0
    capsys.readouterr()
    assert score(forecast, truth_in_pa, tmp_path / "b") == 0
    assert "its levels are in Pa (its units are 'Pa'): read as hPa" in capsys.readouterr().out
    first, second = scores(tmp_path / "a"), scores(tmp_path / "b")
    assert "z500" in second["channels"] and second["channels_left_out"] == {}
    assert second["scores"] == first["scores"]


def test_time_in_cf_hours_and_leads_as_numbers_with_units_are_read_and_without_units_refused(
    truth_store, base, tmp_path, capsys
):
    hours = (base.prediction_timedelta.values / np.timedelta64(1, "h")).astype(np.int64)
    as_numbers = base.assign_coords(prediction_timedelta=("prediction_timedelta", hours, {"units": "hours"}))
    as_numbers.time.encoding.update(units="hours since 2018-01-01", dtype="int64")
    assert score(write(base, tmp_path / "a.zarr"), truth_store, tmp_path / "a") == 0
    assert score(write(as_numbers, tmp_path / "b.zarr"), truth_store, tmp_path / "b") == 0
    assert scores(tmp_path / "b")["scores"] == scores(tmp_path / "a")["scores"]
    capsys.readouterr()
    bare = base.assign_coords(prediction_timedelta=hours)
    assert score(write(bare, tmp_path / "c.zarr"), truth_store, tmp_path / "c") == 2
    assert "its leads ('prediction_timedelta') are not durations (int64, no units)" in one_error_line(capsys)


# ---- Values -----------------------------------------------------------------------------------------------------


def with_nan(base: xarray.Dataset) -> xarray.Dataset:
    broken = base.copy(deep=True)
    broken["2m_temperature"][1, 1, 2, 3] = np.nan  # the second initial time, lead 6 h
    return broken


def float16_overflow(base: xarray.Dataset) -> xarray.Dataset:
    broken = base.copy(deep=True)
    broken["2m_temperature"][1, 1, 2, 3] = 1e5  # beyond float16's 65504
    broken["2m_temperature"] = broken["2m_temperature"].astype(np.float16)
    return broken


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # float16's, on purpose
@pytest.mark.parametrize("make", [with_nan, float16_overflow], ids=["NaN", "float16 overflow"])
def test_a_non_finite_value_is_said_and_nulls_all_three_scores_of_its_lead_and_channel(
    make, truth_store, base, tmp_path, capsys
):
    climatology = climatology_store(tmp_path / "clim.zarr", *grid(HEIGHT, WIDTH))
    forecast = write(make(base), tmp_path / "forecast.zarr")
    assert score(forecast, truth_store, tmp_path / "scores", "--climatology", str(climatology)) == 0
    out = capsys.readouterr().out
    assert f"The forecast {forecast} holds NaN or infinite values at lead 6 h in t2m" in out, out
    document = scores(tmp_path / "scores")
    model = document["scores"]["model"]
    for measure in ("rmse", "bias", "acc"):
        assert model[measure]["t2m"][1] is None, measure  # never the mean of the other initial times
        assert model[measure]["t2m"][2] is not None and model[measure]["z500"][1] is not None
    assert document["nonfinite"] == {"forecasts": {"model": {"t2m": [6.0]}}, "truth": {}}
    assert document["nonfinite_from_lead_hours"] == 6.0
    assert any("holds NaN or infinite values" in note for note in document["notes"])


def test_an_acc_averaged_over_fewer_initial_times_is_said(truth_store, base, tmp_path, capsys):
    """A forecast that is the climatology at one initial time has no anomaly there: its ACC is the mean of the
    others, and the console says so."""
    latitude, longitude = grid(HEIGHT, WIDTH)
    climatology = climatology_store(tmp_path / "clim.zarr", latitude, longitude)
    with xarray.open_zarr(climatology) as opened:  # 2018-01-01T00 + 6 h: hour 6 of day 1
        field = opened["2m_temperature"].sel(hour=6, dayofyear=1).values
    flat = base.copy(deep=True)
    flat["2m_temperature"][0, 1] = field
    forecast = write(flat, tmp_path / "forecast.zarr")
    assert score(forecast, truth_store, tmp_path / "scores", "--climatology", str(climatology)) == 0
    assert (
        "The ACC of model in t2m at lead 6 h is the mean of 2 of the 3 initial times"
        in capsys.readouterr().out
    )
    document = scores(tmp_path / "scores")
    assert document["scores"]["model"]["acc"]["t2m"][1] is not None
    assert any("is the mean of 2 of the 3 initial times" in note for note in document["notes"])


def test_short_names_score_as_weatherbench2s_long_ones(truth_store, base, tmp_path):
    short = base.rename({"geopotential": "z", "2m_temperature": "t2m", "10m_u_component_of_wind": "u10"})
    assert score(write(base, tmp_path / "long.zarr"), truth_store, tmp_path / "a") == 0
    assert score(write(short, tmp_path / "short.zarr"), truth_store, tmp_path / "b") == 0
    assert scores(tmp_path / "b")["scores"] == scores(tmp_path / "a")["scores"]


@pytest.mark.parametrize("dtype", [np.float64, np.int32])
def test_a_float64_or_integer_forecast_is_scored_in_float64(dtype, truth_store, base, tmp_path, capsys):
    """An offset of 1e-3 on fields of 1000s: float32 (a step of 6e-5 there) blurs it, float64 keeps it."""
    precise = base.astype(np.float64)
    precise["geopotential"] = precise["geopotential"] - OFFSETS["geopotential"] + 1e-3
    precise["2m_temperature"] = precise["2m_temperature"] - OFFSETS["2m_temperature"]
    expected = 1e-3
    if dtype is np.int32:  # whole numbers: the truth (float32, with decimals) rounded; its error is known
        precise = precise.round().astype(np.int32)
    forecast = write(precise, tmp_path / "forecast.zarr")
    assert score(forecast, truth_store, tmp_path / "scores") == 0
    assert "in float64" in capsys.readouterr().out
    document = scores(tmp_path / "scores")
    assert document["dtype"] == "float64"
    if dtype is np.float64:
        np.testing.assert_allclose(document["scores"]["model"]["bias"]["z500"], expected, rtol=1e-9)
        np.testing.assert_allclose(document["scores"]["model"]["rmse"]["z850"], expected, rtol=1e-9)
    else:
        truth = xarray.open_zarr(truth_store)["2m_temperature"].values.astype(np.float64)
        assert 0 < document["scores"]["model"]["rmse"]["t2m"][1] < 0.5  # rounding errors only
        assert np.abs(truth - truth.round()).max() > 0.01


# ---- Shape ------------------------------------------------------------------------------------------------------


GRIDS = {
    "cropped": lambda d: d.isel(latitude=slice(1, -1)),
    "subsampled": lambda d: d.isel(longitude=slice(None, None, 2)),
    "one row": lambda d: d.isel(latitude=[3]),
}


@pytest.mark.parametrize("case", list(GRIDS))
def test_a_forecast_on_part_of_the_truths_grid_is_refused(case, truth_store, base, tmp_path, capsys):
    forecast = write(GRIDS[case](base), tmp_path / "forecast.zarr")
    before = tree(tmp_path)
    assert score(forecast, truth_store, tmp_path / "scores") == 2
    line = one_error_line(capsys)
    assert "is not the truth's, 8 latitudes x 16 longitudes (-90..90, 0..337.5)" in line, line
    assert "score it against a truth on the forecast's grid" in line
    assert tree(tmp_path) == before


def test_a_single_time_lead_and_member_are_scored(truth_store, base, tmp_path):
    single = ensemble_of(base.isel(time=[1], prediction_timedelta=[2]), [0])
    assert score(write(single, tmp_path / "single.zarr"), truth_store, tmp_path / "scores") == 0
    document = scores(tmp_path / "scores")
    assert document["initial_time_count"] == 1 and document["lead_hours"] == [0.0, 12.0]
    assert document["scores"]["model"]["rmse"]["t2m"][1] == pytest.approx(
        abs(OFFSETS["2m_temperature"]), 1e-4
    )
    assert document["ensemble"]["members"] == 1


# ---- What cannot be matched, and --channels / --times --------------------------------------------------------------


def unknown_names(base: xarray.Dataset) -> xarray.Dataset:
    """geopotential under a name no channel has (its 2 levels unnamed), 2m_temperature under one the truth
    lacks: 1 of 4 fields (u10) left to score."""
    return base.rename({"geopotential": "geopot", "2m_temperature": "temp_2m"})


def test_unknown_names_are_said_and_too_few_channels_refused_with_channels_as_the_way_out(
    truth_store, base, tmp_path, capsys
):
    forecast = write(unknown_names(base), tmp_path / "forecast.zarr")
    assert score(forecast, truth_store, tmp_path / "scores") == 2
    line = one_error_line(capsys)
    assert "only 1 of its 4 fields can be scored" in line and "--channels u10" in line, line
    assert not (tmp_path / "scores").exists()
    assert score(forecast, truth_store, tmp_path / "scores", "--channels", "u10") == 0
    out = capsys.readouterr().out
    assert "geopot at 500 hPa (no channel name for it)" in out
    assert "not scored, as --channels leaves them out: temp_2m, geopot at 500 hPa, geopot at 850 hPa" in out
    assert scores(tmp_path / "scores")["channels"] == ["u10"]


def test_a_variable_without_its_level_dimension_is_left_out_in_scores_words(
    truth_store, base, tmp_path, capsys
):
    flat = base.copy()
    flat["geopotential"] = base["geopotential"].isel(level=0, drop=True)
    forecast = write(flat, tmp_path / "forecast.zarr")
    assert score(forecast, truth_store, tmp_path / "scores") == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "lacks them" in line)
    assert "geopotential (its 'geopotential' has pressure levels" in line, line
    assert "import-era5" not in out and "geopotential50" not in out
    document = scores(tmp_path / "scores")
    assert sorted(document["channels"]) == ["t2m", "u10"]
    assert "has pressure levels" in document["channels_left_out"]["geopotential"]


def test_initial_times_past_the_truth_are_said_and_too_many_refused_with_times_as_the_way_out(
    truth_store, base, tmp_path, capsys
):
    later = base.assign_coords(time=base.time + np.timedelta64(3, "D"))  # valid times after the truth's last
    forecast = write(xarray.concat([base.isel(time=[0, 1]), later], "time"), tmp_path / "forecast.zarr")
    assert score(forecast, truth_store, tmp_path / "scores") == 2
    line = one_error_line(capsys)
    assert "only 2 of its 5 initial times can be scored" in line, line
    assert "--times 2018-01-01T00..2018-01-01T12" in line
    assert not (tmp_path / "scores").exists()
    assert score(forecast, truth_store, tmp_path / "scores", "--times", "2018-01-01T00..2018-01-01T12") == 0
    out = capsys.readouterr().out
    assert "2 of its 5 initial times scored" in out and "3 outside --times" in out, out
    assert scores(tmp_path / "scores")["initial_time_count"] == 2
    # half or more of them scored: scored, and the console says what was left out
    assert score(forecast, truth_store, tmp_path / "all", "--times", "2018..") == 0
    assert "3 whose valid times the truth (12 times, 2018-01-01T00:00 .. 2018-01-03T18:00) lacks" in (
        capsys.readouterr().out
    )
    three = xarray.concat([base, later.isel(time=[0])], "time")  # 4 times, 3 of them scored
    assert score(write(three, tmp_path / "three.zarr"), truth_store, tmp_path / "three") == 0
    assert "3 of its 4 initial times scored" in capsys.readouterr().out
    assert scores(tmp_path / "three")["initial_time_count"] == 3


def test_a_channel_another_forecast_lacks_is_said(truth_store, base, tmp_path, capsys):
    first = write(base, tmp_path / "first.zarr")
    second = write(base.drop_vars("2m_temperature"), tmp_path / "second.zarr")
    argv = ["score", str(first), "--truth", str(truth_store), "--compare", str(second), "--no-figures"]
    assert main([*argv, "--out", str(tmp_path / "scores")]) == 0
    assert "its channels t2m are left out: not every forecast compared has them" in capsys.readouterr().out


BAD_CHOICES = {
    "a channel the forecast lacks": (["--channels", "z500,q700"], "has no channel q700"),
    "a channel the truth lacks": (["--channels", "z500,temp_2m"], "cannot give temp_2m: it has no variable"),
    "no initial time in --times": (["--times", "2019-01-01.."], "--times 2019-01-01..: "),
}


@pytest.mark.parametrize("case", list(BAD_CHOICES))
def test_a_choice_that_cannot_be_scored_is_one_line(case, truth_store, base, tmp_path, capsys):
    forecast = write(unknown_names(base).rename({"geopot": "geopotential"}), tmp_path / "forecast.zarr")
    options, message = BAD_CHOICES[case]
    before = tree(tmp_path)
    assert score(forecast, truth_store, tmp_path / "scores", *options) == 2
    assert message in one_error_line(capsys)
    assert tree(tmp_path) == before


MALFORMED = {
    "no channel": (["--channels", ",,"], "--channels ',,': names no channel"),
    "a channel twice": (["--channels", "z500,z500"], "names z500 more than once"),
    "times reversed": (["--times", "2018-02-01..2018-01-01"], "2018-02-01 comes after 2018-01-01"),
    "one date": (["--times", "2018-01-01"], "expected FIRST..LAST"),
    "an absurd year": (["--times", "0001-01-01..2018-01-01"], "outside the years 1678 to 2261"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_choice_is_one_line(case, truth_store, base, tmp_path, capsys):
    forecast = write(base, tmp_path / "forecast.zarr")
    before = tree(tmp_path)
    options, message = MALFORMED[case]
    assert main(["score", str(forecast), "--truth", str(truth_store), *options]) == 2
    assert message in one_error_line(capsys)
    assert tree(tmp_path) == before


# main() in a fresh interpreter: the last line of stderr says whether torch was imported by then.
RUN_MAIN = """
import sys
import dlscale.cli
status = dlscale.cli.main(sys.argv[1:])
print("torch imported" if "torch" in sys.modules else "torch not imported", file=sys.stderr)
sys.exit(status)
"""


def test_a_malformed_choice_is_refused_before_torch_is_imported(truth_store, base, tmp_path):
    forecast = write(base, tmp_path / "forecast.zarr")
    argv = ["score", str(forecast), "--truth", str(truth_store), "--times", "2018-02-01..2018-01-01"]
    done = subprocess.run(
        [sys.executable, "-c", RUN_MAIN, *argv],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and lines[-1] == "torch not imported", done.stderr
    assert lines[-2].startswith("dlscale: error: --times 2018-02-01..2018-01-01"), done.stderr
