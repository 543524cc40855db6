"""``dlscale score`` of a forecast ``dlscale forecast --write zarr`` wrote, against the WeatherBench2 store its data
was imported from, gives the RMSE, bias and ACC of the forecast's own scores.json (the forecast file holds
float32 fields: to float32's precision)."""

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


def test_score_gives_the_forecasts_own_scores(tmp_path):
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
    directory = run / "forecast" / "test-ckpt_latest-lead12h-every6h-zarr"
    forecast = json.loads((directory / "scores.json").read_text())
    assert forecast["climatology"]["kind"] == "day_of_year_and_hour"  # the import's stats/climatology.zarr

    climatology = data / "stats" / "climatology.zarr"
    argv = [
        "score",
        str(directory / "forecast.zarr"),
        "--truth",
        str(store),
        "--climatology",
        str(climatology),
        "--no-figures",
    ]
    assert main(argv) == 0
    scored = json.loads((directory / "score-forecast" / "scores.json").read_text())
    assert scored["initial_times"] == forecast["initial_times"]
    assert scored["lead_hours"] == forecast["lead_hours"]
    assert sorted(scored["channels"]) == sorted(forecast["channels"])
    for forecaster in ("model", "persistence", "climatology"):
        for measure in ("rmse", "bias", "acc"):
            for channel in forecast["channels"]:
                expected = forecast["scores"][forecaster][measure][channel][1:]  # the file starts at lead 1
                got = scored["scores"][forecaster][measure][channel][1:]
                if forecaster == "climatology" and measure == "acc":
                    assert got == expected == [None, None]  # no anomaly, no correlation
                    continue
                # the bias is small beside each channel's offset (1000 x index): compared with that scale
                np.testing.assert_allclose(
                    got,
                    expected,
                    rtol=1e-5,
                    atol=1e-3 if measure == "bias" else 1e-7,
                    err_msg=f"{forecaster} {measure} {channel}",
                )
    spectra, own = scored["spectra"], forecast["spectra"]
    np.testing.assert_allclose(
        spectra["model"]["small_scale_ratio"]["z500"][1:],
        own["model"]["small_scale_ratio"]["z500"][1:],
        rtol=1e-5,
    )
