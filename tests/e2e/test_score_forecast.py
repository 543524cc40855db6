"""``dlscale score`` of a forecast ``dlscale forecast --write zarr`` wrote gives the RMSE, bias and ACC of the
forecast's own scores.json (the forecast file holds float32 fields: to float32's precision), against the
WeatherBench2 store its data was imported from and against the data root itself (``--truth DATA_ROOT``: the
import's, whose files hold their dates and grid, and a synthetic one like the demo's, whose dates come from its
files' years and whose grid is the tutorial's formula; with ``--compare`` of two forecasts)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from run_configs import tiny_run_config

from dlscale.cli import main
from dlscale.run.training import train

xarray = pytest.importorskip("xarray", reason="the era5 extra (xarray, zarr) reads the store")
from era5_stores import random_truth, six_hourly_times, write_wb2  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
HEIGHT, WIDTH, STEPS_PER_YEAR = 16, 32, 12


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A WeatherBench2 store, the data root imported from it, a tiny run trained on that and its forecast
    (``--write zarr``, scored against the import's climatology store)."""
    tmp_path = tmp_path_factory.mktemp("score_forecast")
    store = write_wb2(
        tmp_path / "wb2.zarr",
        random_truth(3 * STEPS_PER_YEAR, HEIGHT, WIDTH),
        six_hourly_times([2016, 2017, 2018], STEPS_PER_YEAR),
    )
    data = tmp_path / "era5"
    split = "2016:train,2017:valid,2018:test"
    assert main(["data", "import-era5", str(store), "--out", str(data), "--split", split]) == 0
    assert (
        train(tiny_run_config(CONFIGS / "vit_era5.yaml", data, tmp_path / "runs", "train.num_epochs=1")) == 0
    )
    run = tmp_path / "runs" / "tiny" / "00"
    assert (
        main(["forecast", str(run), "--lead", "12h", "--init", "every:6h", "--write", "zarr", "--no-figures"])
        == 0
    )
    directory = next((run / "forecast").glob("test-ckpt_latest-lead12h-every6h*zarr*"))
    return {"store": store, "data": data, "run": run, "directory": directory}


def assert_same_scores(scored: dict, forecast: dict, forecasters: dict[str, str], measures=("rmse", "bias")):
    """``scored``'s scores of each forecaster (``forecasters``: its name there -> the forecast's name for it) are
    the forecast's own, at the leads the file holds (it starts at lead 1)."""
    assert scored["initial_times"] == forecast["initial_times"]
    assert scored["lead_hours"] == forecast["lead_hours"]
    assert sorted(scored["channels"]) == sorted(forecast["channels"])
    for name, own in forecasters.items():
        for measure in measures:
            for channel in forecast["channels"]:
                expected = forecast["scores"][own][measure][channel][1:]
                got = scored["scores"][name][measure][channel][1:]
                if own == "climatology" and measure == "acc":
                    assert got == expected == [None, None]  # no anomaly, no correlation
                    continue
                # the bias is small beside each channel's offset (1000 x index): compared with that scale
                np.testing.assert_allclose(
                    got,
                    expected,
                    rtol=1e-5,
                    atol=1e-3 if measure == "bias" else 1e-7,
                    err_msg=f"{name} {measure} {channel}",
                )


@pytest.mark.slow
def test_score_gives_the_forecasts_own_scores(imported):
    directory = imported["directory"]
    forecast = json.loads((directory / "scores.json").read_text())
    assert forecast["climatology"]["kind"] == "day_of_year_and_hour"  # the import's stats/climatology.zarr

    climatology = imported["data"] / "stats" / "climatology.zarr"
    argv = ["score", str(directory / "forecast.zarr"), "--truth", str(imported["store"])]
    assert main([*argv, "--climatology", str(climatology), "--no-figures"]) == 0
    scored = json.loads((directory / "score-forecast" / "scores.json").read_text())
    every = {name: name for name in ("model", "persistence", "climatology")}
    assert_same_scores(scored, forecast, every, ("rmse", "bias", "acc"))
    spectra, own = scored["spectra"], forecast["spectra"]
    np.testing.assert_allclose(
        spectra["model"]["small_scale_ratio"]["z500"][1:],
        own["model"]["small_scale_ratio"]["z500"][1:],
        rtol=1e-5,
    )


def test_score_against_the_data_root_gives_the_forecasts_own_scores(imported, tmp_path, capsys):
    directory, data = imported["directory"], imported["data"]
    forecast = json.loads((directory / "scores.json").read_text())
    out = tmp_path / "against-root"
    climatology = data / "stats" / "climatology.zarr"
    argv = [
        "score",
        str(directory / "forecast.zarr"),
        "--truth",
        str(data),
        "--climatology",
        str(climatology),
    ]
    assert main([*argv, "--out", str(out), "--no-figures"]) == 0
    scored = json.loads((out / "scores.json").read_text())
    assert scored["truth"] == str(data)
    every = {name: name for name in ("model", "persistence", "climatology")}
    assert_same_scores(scored, forecast, every, ("rmse", "bias", "acc"))
    console = capsys.readouterr().out
    assert f"against {data}: 20 channels, {len(forecast['initial_times'])} initial times" in console


def test_a_forecast_of_synthetic_data_is_scored_against_its_data_root_alone_and_compared(
    imported, tiny_era5, tmp_path, capsys
):
    """The demo's path: data from synth-era5 (dates from the files' years, the tutorial's grid), a forecast of
    its test split written twice (WeatherBench2's names and the short ones), scored against the data root."""
    run = imported["run"]  # its weights roll out on any data with its 20 channels on its 16 x 32 grid
    written = []
    for names in ("wb2", "short"):
        before = set((run / "forecast").iterdir())
        argv = ["forecast", str(run), "--lead", "12h", "--write", "zarr", "--names", names, "--no-figures"]
        assert main([*argv, "--set", f"data.root={tiny_era5}"]) == 0
        (directory,) = set((run / "forecast").iterdir()) - before
        written.append(directory)
    forecast = json.loads((written[0] / "scores.json").read_text())
    assert forecast["initial_times"][0].startswith("1982-01-01")  # the test split's file is 1982.h5
    capsys.readouterr()

    assert main(["score", str(written[0] / "forecast.zarr"), "--truth", str(tiny_era5), "--no-figures"]) == 0
    scored = json.loads((written[0] / "score-forecast" / "scores.json").read_text())
    assert_same_scores(scored, forecast, {"model": "model", "persistence": "persistence"})
    assert "dlscale.score - INFO - Scoring" in capsys.readouterr().out  # score's own logger

    out = tmp_path / "compared"
    argv = ["score", f"wb2={written[0] / 'forecast.zarr'}", "--truth", str(tiny_era5), "--out", str(out)]
    assert main([*argv, "--compare", f"short={written[1] / 'forecast.zarr'}", "--no-figures"]) == 0
    compared = json.loads((out / "scores.json").read_text())
    short = json.loads((written[1] / "scores.json").read_text())
    assert_same_scores(compared, forecast, {"wb2": "model", "persistence": "persistence"})
    assert_same_scores(compared, short, {"short": "model"})
