"""``dlscale score`` of an ensemble ``dlscale forecast --members 4 --perturb gaussian:0.1 --write zarr`` wrote,
against the WeatherBench2 store its data was imported from, gives the forecast's own ensemble scores (CRPS,
spread, spread/skill, rank histograms) and its control's and the ensemble mean's RMSE; a one-member ensemble's
CRPS is its mean absolute error; a malformed ensemble, or one in a comparison, is one line, exit 2, nothing
written."""

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

# zarr 3 warns of the consolidated metadata xarray writes (as WeatherBench2's stores have it).
pytestmark = pytest.mark.filterwarnings("ignore:Consolidated metadata:UserWarning")
CONFIGS = Path(__file__).resolve().parents[2] / "configs"
HEIGHT, WIDTH, STEPS_PER_YEAR, MEMBERS = 16, 32, 12, 4
ENSEMBLE_SCORES = ("crps", "deterministic_crps", "spread", "spread_skill", "spread_skill_uncorrected")


@pytest.fixture(scope="module")
def ensemble(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A tiny ERA5 run's ensemble forecast (4 members, 12 h, 4 initial times of the test year) written
    as zarr: the truth store, the climatology, the forecast's directory and its own scores.json."""
    root = tmp_path_factory.mktemp("ensemble")
    store = write_wb2(
        root / "wb2.zarr",
        random_truth(3 * STEPS_PER_YEAR, HEIGHT, WIDTH),
        six_hourly_times([2016, 2017, 2018], STEPS_PER_YEAR),
    )
    data = root / "era5"
    split = "2016:train,2017:valid,2018:test"
    assert main(["data", "import-era5", str(store), "--out", str(data), "--split", split]) == 0
    assert train(tiny_run_config(CONFIGS / "vit_era5.yaml", data, root / "runs", "train.num_epochs=1")) == 0
    run = root / "runs" / "tiny" / "00"
    argv = [
        "forecast",
        str(run),
        "--lead",
        "12h",
        "--init",
        "every:6h",
        "--init-count",
        "4",
        "--write",
        "zarr",
    ]
    assert main([*argv, "--members", str(MEMBERS), "--perturb", "gaussian:0.1", "--no-figures"]) == 0
    (directory,) = (run / "forecast").iterdir()
    return {
        "store": store,
        "climatology": data / "stats" / "climatology.zarr",
        "directory": directory,
        "forecast": json.loads((directory / "scores.json").read_text()),
    }


def close(got, expected, what, atol=1e-7):
    """Lead 1 on (the file starts at the first step: lead 0 is the forecast's own, not the file's)."""
    np.testing.assert_allclose(got[1:], expected[1:], rtol=1e-5, atol=atol, err_msg=what)


@pytest.mark.slow
def test_the_file_holds_every_member_on_weatherbench2s_number_dimension(ensemble):
    with xarray.open_zarr(ensemble["directory"] / "forecast.zarr") as opened:
        assert list(opened["number"].values) == list(range(MEMBERS))
        assert opened["geopotential"].dims == (
            "time", "number", "prediction_timedelta", "level", "latitude", "longitude",
        )  # fmt: skip
        assert opened["2m_temperature"].dims == (
            "time",
            "number",
            "prediction_timedelta",
            "latitude",
            "longitude",
        )
        z500 = opened["geopotential"].sel(level=500).values
    assert not np.array_equal(z500[:, 0], z500[:, 1]), "the perturbed member differs from the control"


def test_score_gives_the_ensembles_own_scores(ensemble):
    directory, forecast = ensemble["directory"], ensemble["forecast"]
    argv = ["score", str(directory / "forecast.zarr"), "--truth", str(ensemble["store"])]
    assert main([*argv, "--climatology", str(ensemble["climatology"]), "--no-figures"]) == 0
    scored = json.loads((directory / "score-forecast" / "scores.json").read_text())
    assert scored["initial_times"] == forecast["initial_times"]
    assert (
        scored["forecasters"]
        == forecast["forecasters"]
        == ["model", "ensemble", "persistence", "climatology"]
    )
    assert scored["forecasts"][0]["members"] == MEMBERS
    assert scored["forecasts"][0]["scored_as_model"].startswith("number 0, the control")
    own, got = forecast["ensemble"], scored["ensemble"]
    # the file says how its members differ (dlscale's own attribute), and the score repeats it
    assert got["perturbation"].startswith(own["perturbation"] + "; the members of forecast.zarr")
    assert got["members"] == own["members"] == MEMBERS
    for channel in forecast["channels"]:
        for key in ENSEMBLE_SCORES:
            close(got[key][channel], own[key][channel], f"{key} {channel}")
        for forecaster in ("model", "ensemble", "persistence", "climatology"):
            for measure in ("rmse", "bias", "acc"):
                if forecaster == "climatology" and measure == "acc":
                    continue  # no anomaly, no correlation: None in both
                expected = forecast["scores"][forecaster][measure][channel]
                # the bias is small beside each channel's offset (1000 x index): compared with that scale
                atol = 1e-3 if measure == "bias" else 1e-7
                close(
                    scored["scores"][forecaster][measure][channel], expected, f"{forecaster} {measure}", atol
                )
    # The same float32 members against the same truth give the same ranks, except where the truth equals a member
    # (float32 fields at offsets of 1000s: a few points in 5120 per channel), whose ties each breaks at random,
    # drawn differently (another seed and batching): the counts agree to those few.
    assert [h["lead_hours"] for h in got["rank_histograms"]] == [
        h["lead_hours"] for h in own["rank_histograms"]
    ]
    for mine, theirs in zip(got["rank_histograms"], own["rank_histograms"], strict=True):
        for channel, counts in theirs["counts"].items():
            difference = np.abs(np.subtract(mine["counts"][channel], counts))
            assert sum(mine["counts"][channel]) == sum(counts), channel
            assert difference.sum() <= 0.005 * sum(counts), (channel, mine["counts"][channel], counts)


def test_a_one_member_ensembles_crps_is_its_mean_absolute_error(ensemble, tmp_path):
    directory, forecast = ensemble["directory"], ensemble["forecast"]
    control = tmp_path / "control.zarr"
    with xarray.open_zarr(directory / "forecast.zarr") as opened:
        opened.isel(number=[0]).load().to_zarr(control, mode="w")
    out = tmp_path / "scores"
    assert (
        main(["score", str(control), "--truth", str(ensemble["store"]), "--out", str(out), "--no-figures"])
        == 0
    )
    scored = json.loads((out / "scores.json").read_text())
    assert scored["ensemble"]["members"] == 1
    for channel in forecast["channels"]:
        # the forecast's own control scored as a one-member ensemble: its MAE
        expected = forecast["ensemble"]["deterministic_crps"][channel]
        close(scored["ensemble"]["crps"][channel], expected, f"crps {channel}")
        assert scored["ensemble"]["spread"][channel][1:] == [None, None]  # no spread with one member
        close(
            scored["scores"]["ensemble"]["rmse"][channel],
            forecast["scores"]["model"]["rmse"][channel],
            "rmse",
        )


def without_members(forecast: Path, path: Path) -> Path:
    """The ensemble with its 2 m temperature's members dropped (the control's alone)."""
    with xarray.open_zarr(forecast) as opened:
        dataset = opened.load()
    dataset["2m_temperature"] = dataset["2m_temperature"].isel(number=0, drop=True)
    dataset.to_zarr(path, mode="w")
    return path


def test_a_field_without_members_beside_an_ensemble_is_one_line(ensemble, tmp_path, capsys):
    forecast = without_members(ensemble["directory"] / "forecast.zarr", tmp_path / "mixed.zarr")
    before = sorted(tmp_path.rglob("*"))
    capsys.readouterr()
    assert (
        main(["score", str(forecast), "--truth", str(ensemble["store"]), "--out", str(tmp_path / "out")]) == 2
    )
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("dlscale: error: "), error
    assert "mixed.zarr: its variable '2m_temperature' has no 'number' dimension" in error[0]
    assert sorted(tmp_path.rglob("*")) == before, "a refused score writes nothing"


def test_an_ensemble_in_a_comparison_is_refused_in_one_line(ensemble, tmp_path, capsys):
    forecast = ensemble["directory"] / "forecast.zarr"
    capsys.readouterr()
    argv = [
        "score",
        f"deterministic={forecast}",
        "--compare",
        f"mine={forecast}",
        "--truth",
        str(ensemble["store"]),
    ]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "forecast.zarr: is an ensemble of 4 members" in error[0], error
    assert "score each ensemble alone" in error[0]
    assert not (tmp_path / "out").exists()
