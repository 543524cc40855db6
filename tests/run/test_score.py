"""``dlscale score`` on hand-made forecasts in WeatherBench2's layout: the truth plus a known offset has that bias
and an RMSE of its size, persistence scores what numpy computes from the truth, a comparison equals the separate
scores, the forecast is lined up with the truth by coordinates whatever order each keeps, and bad input is one
line with exit status 2 and nothing written."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest

import dlscale
import dlscale.run.score
from dlscale.cli import main
from dlscale.data.era5.chunk_files import StoreChunks

xarray = pytest.importorskip("xarray", reason="the era5 extra (xarray, zarr) reads the stores")
from era5_stores import grid, random_truth, six_hourly_times, write_wb2  # noqa: E402

# zarr 3 warns of the consolidated metadata xarray writes (as WeatherBench2's stores have it).
pytestmark = pytest.mark.filterwarnings("ignore:Consolidated metadata:UserWarning")
HEIGHT, WIDTH, STEPS = 8, 16, 12
OFFSETS = {"geopotential": 2.5, "2m_temperature": -1.5, "10m_u_component_of_wind": 0.25}
CHANNELS = {"z500": ("geopotential", 500), "z850": ("geopotential", 850), "t2m": ("2m_temperature", None)}
CHANNELS["u10"] = ("10m_u_component_of_wind", None)
LEADS_HOURS = (0, 6, 12)


@pytest.fixture(scope="module")
def truth_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A WeatherBench2 store (south to north, (longitude, latitude)) of 12 six-hourly states."""
    root = tmp_path_factory.mktemp("score")
    return write_wb2(root / "truth.zarr", random_truth(STEPS, HEIGHT, WIDTH), six_hourly_times([2018], STEPS))


def truth_field(store: Path, channel: str) -> xarray.DataArray:
    """The truth of ``channel``, (time, latitude, longitude) north to south."""
    variable, level = CHANNELS[channel]
    with xarray.open_zarr(store) as opened:
        field = opened[variable].sel(level=level) if level else opened[variable]
        return field.transpose("time", "latitude", "longitude").sortby("latitude", ascending=False).load()


def offset_forecast(
    store: Path, path: Path, offsets: dict[str, float], init_steps=range(0, 6, 2), leads=LEADS_HOURS
) -> Path:
    """A forecast in WeatherBench2's layout, north to south: the truth at each valid time plus the variable's
    offset; initial times every 12 h from the store's first."""
    with xarray.open_zarr(store) as opened:
        times = opened.time.values[list(init_steps)]
        deltas = np.array(leads, dtype="timedelta64[h]").astype("timedelta64[ns]")
        data_vars = {}
        for variable, offset in offsets.items():
            source = opened[variable]
            if "level" in source.dims:
                source = source.sel(level=[500, 850])
            per_time = [
                source.sel(time=times[i] + deltas).values for i in range(len(times))
            ]  # (lead, [level,] lon, lat), south to north
            values = np.stack(per_time).astype(np.float32) + np.float32(offset)
            values = np.swapaxes(values, -1, -2)[..., ::-1, :]  # (.., latitude north to south, longitude)
            dims = ("time", "prediction_timedelta", *(("level",) if "level" in source.dims else ()))
            data_vars[variable] = ((*dims, "latitude", "longitude"), np.ascontiguousarray(values))
        latitude, longitude = grid(HEIGHT, WIDTH)
        coords = {
            "time": times,
            "prediction_timedelta": deltas,
            "level": np.array([500, 850]),
            "latitude": latitude,
            "longitude": longitude,
        }
    dataset = xarray.Dataset(data_vars, coords=coords)
    if path.suffix == ".nc":
        dataset.to_netcdf(path, engine="h5netcdf")
    else:
        dataset.to_zarr(path, mode="w")
    return path


def weighted_rmse_and_bias(forecast: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    """WeatherBench2's RMSE and bias of (N, H, W) fields on the store's grid, from numpy."""
    latitude, _ = grid(HEIGHT, WIDTH)
    weights = np.cos(np.deg2rad(latitude))
    weights = (weights / weights.mean())[None, :, None]
    error = forecast.astype(np.float64) - truth.astype(np.float64)
    return float(np.sqrt((error**2 * weights).mean(axis=(1, 2)).mean())), float((error * weights).mean())


def test_a_forecast_offset_from_the_truth_has_that_bias_and_rmse(truth_store, tmp_path):
    forecast = offset_forecast(truth_store, tmp_path / "offset.zarr", OFFSETS)
    document = dlscale.score(forecast, truth_store, out=tmp_path / "scores")
    assert document["lead_hours"] == [0.0, 6.0, 12.0]
    assert document["initial_time_count"] == 3
    assert sorted(document["channels"]) == sorted(CHANNELS)
    model = document["scores"]["model"]
    for channel, (variable, _) in CHANNELS.items():
        offset = OFFSETS[variable]
        np.testing.assert_allclose(model["bias"][channel], [offset] * 3, rtol=1e-4, err_msg=channel)
        np.testing.assert_allclose(model["rmse"][channel], [abs(offset)] * 3, rtol=1e-4, err_msg=channel)
    assert document["scores"]["model"]["acc"] is None  # no climatology named: no ACC
    assert "climatology" not in document["scores"]
    directory = tmp_path / "scores"
    assert sorted(p.name for p in directory.iterdir()) == sorted(document["files"])
    assert {"scores.json", "scores.csv", "skill_vs_lead.png", "bias.png", "spectra.png"} <= set(
        document["files"]
    )


def test_persistence_is_the_truth_at_each_initial_time(truth_store, tmp_path):
    forecast = offset_forecast(truth_store, tmp_path / "offset.nc", OFFSETS)  # a netCDF file this time
    document = dlscale.score(forecast, truth_store, out=tmp_path / "scores", figures=False)
    assert document["persistence"] == "the truth at each initial time"
    field = truth_field(truth_store, "t2m").values  # 6-hourly states; initial times every 12 h from the first
    for lead_index, hours in enumerate(LEADS_HOURS):
        rmse, bias = weighted_rmse_and_bias(
            field[[0, 2, 4]], field[[0 + hours // 6, 2 + hours // 6, 4 + hours // 6]]
        )
        assert document["scores"]["persistence"]["rmse"]["t2m"][lead_index] == pytest.approx(rmse, rel=1e-5)
        assert document["scores"]["persistence"]["bias"]["t2m"][lead_index] == pytest.approx(bias, abs=1e-4)


def test_a_comparison_scores_each_forecast_as_alone_on_their_common_times_and_leads(truth_store, tmp_path):
    first = offset_forecast(truth_store, tmp_path / "first.zarr", OFFSETS)
    # Another forecast with other offsets, one initial time more and one lead fewer: only the common ones count.
    second_offsets = {name: -2 * value for name, value in OFFSETS.items()}
    second = offset_forecast(truth_store, tmp_path / "second.zarr", second_offsets, range(0, 8, 2), (0, 6))
    compared = dlscale.score(first, truth_store, out=tmp_path / "both", compare=[f"other={second}"])
    assert compared["forecasters"] == ["first", "other", "persistence"]
    assert compared["lead_hours"] == [0.0, 6.0]
    assert compared["initial_time_count"] == 3
    assert "3 initial times and 2 leads all 2 forecasts have" in compared["common"]
    for label, path in (("first", first), ("other", second)):
        alone = dlscale.score(path, truth_store, out=tmp_path / f"alone-{label}", figures=False)
        for measure in ("rmse", "bias"):
            for channel in CHANNELS:
                np.testing.assert_allclose(
                    compared["scores"][label][measure][channel],
                    alone["scores"]["model"][measure][channel][:2],
                    rtol=1e-6,
                    err_msg=f"{label} {measure} {channel}",
                )
    rows = list(csv.DictReader(io.StringIO((tmp_path / "both" / "scores.csv").read_text())))
    assert {row["forecaster"] for row in rows} == {"first", "other", "persistence"}
    row = next(
        r for r in rows if r["forecaster"] == "other" and r["channel"] == "t2m" and r["lead_hours"] == "6.0"
    )
    assert float(row["bias"]) == pytest.approx(-2 * OFFSETS["2m_temperature"], rel=1e-4)
    assert "skill_vs_lead.png" in compared["files"]


@pytest.mark.slow
def test_the_default_directory_is_beside_the_forecast(truth_store, tmp_path):
    forecast = offset_forecast(truth_store, tmp_path / "mine.zarr", OFFSETS, leads=(6,))
    assert main(["score", str(forecast), "--truth", str(truth_store)]) == 0
    document = json.loads((tmp_path / "score-mine" / "scores.json").read_text())
    assert document["scores"]["model"]["rmse"]["t2m"][0] is None  # the file has no lead 0
    assert document["scores"]["model"]["rmse"]["t2m"][1] == pytest.approx(
        abs(OFFSETS["2m_temperature"]), rel=1e-4
    )


def climatology_store(
    path: Path, latitude: np.ndarray, longitude: np.ndarray, variables=tuple(OFFSETS)
) -> Path:
    """A climatology in WeatherBench2's layout whose every field is a known pattern: 1000 x the variable's index
    in ``OFFSETS`` plus a gradient along longitude and one along latitude, at every hour and day of year."""
    hours, days = np.array([0, 6, 12, 18]), np.arange(1, 367)
    data_vars = {}
    for index, variable in enumerate(variables):
        field = (
            1000.0 * index + np.linspace(-1, 1, len(longitude))[None, :] + np.asarray(latitude)[:, None] / 90
        )
        if variable == "geopotential":
            values = np.broadcast_to(field, (4, 366, 2, *field.shape)).astype(np.float32)
            data_vars[variable] = (("hour", "dayofyear", "level", "latitude", "longitude"), values)
        else:
            values = np.broadcast_to(field, (4, 366, *field.shape)).astype(np.float32)
            data_vars[variable] = (("hour", "dayofyear", "latitude", "longitude"), values)
    coords = {
        "hour": hours,
        "dayofyear": days,
        "level": [500, 850],
        "latitude": latitude,
        "longitude": longitude,
    }
    xarray.Dataset(data_vars, coords=coords).to_zarr(path, mode="w", consolidated=True)
    return path


def test_the_acc_against_a_climatology_is_numpys(truth_store, tmp_path):
    forecast = offset_forecast(truth_store, tmp_path / "offset.zarr", OFFSETS)
    latitude, longitude = grid(HEIGHT, WIDTH)
    # South to north, as WeatherBench2's stores: found on the forecast's grid by coordinates.
    climatology = climatology_store(tmp_path / "clim.zarr", latitude[::-1], longitude)
    document = dlscale.score(
        forecast, truth_store, climatology=climatology, out=tmp_path / "scores", figures=False
    )
    assert document["climatology"]["kind"] == "day_of_year_and_hour"
    assert document["forecasters"] == ["model", "persistence", "climatology"]
    weights = np.cos(np.deg2rad(latitude))[None, :, None]
    truth = truth_field(truth_store, "t2m").values.astype(np.float64)
    # 2m_temperature: index 1
    reference = 1000.0 * 1 + np.linspace(-1, 1, WIDTH)[None, None, :] + latitude[None, :, None] / 90
    for lead_index, hours in enumerate(LEADS_HOURS):
        target = truth[[0 + hours // 6, 2 + hours // 6, 4 + hours // 6]]
        f, o = target + OFFSETS["2m_temperature"] - reference, target - reference
        acc = (weights * f * o).sum((1, 2)) / np.sqrt(
            (weights * f**2).sum((1, 2)) * (weights * o**2).sum((1, 2))
        )
        assert document["scores"]["model"]["acc"]["t2m"][lead_index] == pytest.approx(acc.mean(), rel=1e-5)


def test_a_climatology_on_another_grid_or_without_the_channels_is_refused(truth_store, tmp_path, capsys):
    forecast = offset_forecast(truth_store, tmp_path / "offset.zarr", OFFSETS)
    latitude, longitude = grid(HEIGHT, WIDTH)
    shifted = climatology_store(tmp_path / "shifted.zarr", latitude, longitude + 2.0)
    lacking = climatology_store(tmp_path / "lacking.zarr", latitude, longitude, ("geopotential",))
    before = sorted(tmp_path.rglob("*"))
    for climatology, message in (
        (shifted, "has no longitude within"),
        (lacking, "lacking.zarr: has no variable '"),
    ):
        argv = ["score", str(forecast), "--truth", str(truth_store), "--climatology", str(climatology)]
        assert main(argv) == 2
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and message in error[0], error
    assert sorted(tmp_path.rglob("*")) == before


def without_dimension(store: Path, path: Path) -> Path:
    forecast = offset_forecast(store, path.with_name("full.zarr"), OFFSETS)
    with xarray.open_zarr(forecast) as opened:
        opened.isel(prediction_timedelta=0).drop_vars("prediction_timedelta").to_zarr(
            path, mode="w", consolidated=False
        )
    return path


def with_other_grid(store: Path, path: Path) -> Path:
    forecast = offset_forecast(store, path.with_name("full.zarr"), OFFSETS)
    with xarray.open_zarr(forecast) as opened:
        opened.assign_coords(longitude=opened.longitude + 1.0).to_zarr(path, mode="w")
    return path


def later(store: Path, path: Path) -> Path:
    forecast = offset_forecast(store, path.with_name("full.zarr"), OFFSETS)
    with xarray.open_zarr(forecast) as opened:
        opened.assign_coords(time=opened.time + np.timedelta64(365, "D")).to_zarr(
            path, mode="w", consolidated=False
        )
    return path


def other_channels(store: Path, path: Path) -> Path:
    forecast = offset_forecast(store, path.with_name("full.zarr"), OFFSETS)
    with xarray.open_zarr(forecast) as opened:
        renamed = {name: f"my_{name}" for name in ("2m_temperature", "10m_u_component_of_wind")}
        opened.drop_vars("geopotential").rename(renamed).to_zarr(path, mode="w")
    return path


def not_a_store(store: Path, path: Path) -> Path:
    path.mkdir()
    (path / "notes.txt").write_text("not a forecast")
    return path


def not_netcdf(store: Path, path: Path) -> Path:
    path.write_text("not a forecast")
    return path


BAD_FORECASTS = {
    "no lead dimension": (without_dimension, "forecast.zarr", "has no 'prediction_timedelta' dimension"),
    "another grid": (with_other_grid, "forecast.zarr", "is not the truth's, 8 latitudes x 16 longitudes"),
    "no common valid time": (later, "forecast.zarr", "no common valid time"),
    "no common channel": (other_channels, "forecast.zarr", "holds none of the forecast's channels"),
    "a directory": (not_a_store, "forecast", "is a directory but not a zarr store"),
    "not netCDF": (not_netcdf, "forecast.nc", "cannot be opened as a zarr store or a netCDF file"),
}


@pytest.mark.parametrize("case", list(BAD_FORECASTS))
def test_a_bad_forecast_is_one_line_with_nothing_written(case, truth_store, tmp_path, capsys):
    make, name, message = BAD_FORECASTS[case]
    forecast = make(truth_store, tmp_path / name)
    before = sorted(tmp_path.rglob("*"))
    out = tmp_path / "scores"
    assert main(["score", str(forecast), "--truth", str(truth_store), "--out", str(out)]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("dlscale: error: ") and message in error[0], error
    assert sorted(tmp_path.rglob("*")) == before, "a refused score writes nothing"


def test_a_missing_forecast_and_truth_are_one_line_each(truth_store, tmp_path, capsys):
    forecast = offset_forecast(truth_store, tmp_path / "offset.zarr", OFFSETS)
    assert main(["score", str(tmp_path / "nosuch.zarr"), "--truth", str(truth_store)]) == 2
    assert "nosuch.zarr: no such forecast file or zarr store" in capsys.readouterr().err
    assert main(["score", str(forecast), "--truth", str(tmp_path / "nosuch")]) == 2
    assert "--truth" in capsys.readouterr().err
    assert not (tmp_path / "score-offset").exists()


def test_each_variable_of_a_forecast_is_read_once_per_block_of_its_chunks(truth_store, tmp_path, monkeypatch):
    """A zarr chunk holds several initial times, leads and levels: the forecast is read a variable (all its
    levels) at a time, for the chunk's initial times at every lead, not a channel at a time per lead and few
    initial times, which decoded each chunk once per channel, lead and batch (up to 120 times in the demo's)."""
    forecast = offset_forecast(
        truth_store, tmp_path / "forecast.zarr", OFFSETS
    )  # one chunk: 3 times, 3 leads
    reads: list[tuple[str, int, int]] = []
    check = StoreChunks.check

    def counted(self, array, dims, selection, what):
        reads.append((array, np.size(selection["time"]), np.size(selection["prediction_timedelta"])))
        return check(self, array, dims, selection, what)

    monkeypatch.setattr(StoreChunks, "check", counted)
    monkeypatch.setattr(dlscale.run.score, "BATCH_INITIAL_TIMES", 1)  # the file's chunk alone sets the batch
    dlscale.score(forecast, truth_store, out=tmp_path / "scores", figures=False)
    assert sorted(reads) == [(variable, 3, len(LEADS_HOURS)) for variable in sorted(OFFSETS)]
