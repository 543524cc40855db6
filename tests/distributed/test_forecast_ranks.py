"""``dlscale forecast`` on forked gloo ranks: 2 ranks sharing the initial times give one process's scores, an
ensemble's too (its perturbations are drawn per initial time), and rank 0 writes the forecasts of every rank in
one file, the one a single process writes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from forked_ranks import run_ranks
from run_configs import tiny_run_config

import dlscale
from dlscale.run.training import train

CONFIG_FILE = Path(__file__).resolve().parents[2] / "configs" / "vit_era5.yaml"
xarray = pytest.importorskip("xarray", reason="the era5 extra (xarray) reads the written forecasts")
# Sums over initial times added in another order (float64), and a batch split differently (float32 kernels)
SAME = 1e-5
OPTIONS = {
    "lead": "18h",
    "init_count": 5,
    "members": 3,
    "perturb": "gaussian:0.3",
    "write": "zarr",
    "figures": False,
}


@pytest.fixture(scope="module")
def era5_run(tiny_era5: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    expdir = tmp_path_factory.mktemp("forecast_rank_runs")
    assert train(tiny_run_config(CONFIG_FILE, tiny_era5, expdir, "train.num_epochs=1")) == 0
    return expdir / "tiny" / "00"


def forecast_rank(rank: int, run: Path) -> dict:
    return dlscale.forecast(run, **OPTIONS)


def numbers(document: dict) -> dict:
    """What the scores are, without where and how they ran."""
    ensemble = dict(document["ensemble"])
    return {"scores": document["scores"], "ensemble": ensemble, "spectra": document["spectra"]}


def assert_close(got, expected, path: str = "") -> None:
    if isinstance(expected, dict):
        assert set(got) == set(expected), path
        for key in expected:
            assert_close(got[key], expected[key], f"{path}.{key}")
    elif isinstance(expected, list):
        assert len(got) == len(expected), path
        for i, (a, b) in enumerate(zip(got, expected, strict=True)):
            assert_close(a, b, f"{path}[{i}]")
    elif isinstance(expected, float):
        assert got == pytest.approx(expected, rel=SAME, abs=1e-9), path
    else:
        assert got == expected, path


def test_two_ranks_share_the_initial_times_and_give_one_process_ensemble(era5_run):
    one = dlscale.forecast(era5_run, **OPTIONS)
    directory = Path(one["output_dir"])
    with xarray.open_zarr(directory / "forecast.zarr") as opened:
        written_by_one = opened.load()
    assert one["world_size"] == 1 and one["initial_time_count"] == 5

    documents = run_ranks(2, forecast_rank, era5_run)
    assert documents[0] == documents[1]  # every rank returns rank 0's document
    two = documents[0]
    assert two["world_size"] == 2 and two["initial_times"] == one["initial_times"]
    assert two["output_dir"] == one["output_dir"]
    assert two["throughput"]["forecast_steps"] == one["throughput"]["forecast_steps"] == 5 * 3 * 3
    # lead 0's rank histogram holds the control's tie with the truth, broken at random in each rank's order
    for document in (one, two):
        for histogram in document["ensemble"]["rank_histograms"]:
            assert histogram["lead_hours"] > 0
    assert_close(numbers(two), numbers(one))
    assert json.loads((directory / "scores.json").read_text()) == two
    with xarray.open_zarr(directory / "forecast.zarr") as opened:
        written_by_two = opened.load()
    assert list(written_by_two.data_vars) == list(written_by_one.data_vars)
    for name in written_by_one.data_vars:
        np.testing.assert_allclose(
            written_by_two[name].values, written_by_one[name].values, rtol=SAME, atol=1e-4
        )
    np.testing.assert_array_equal(written_by_two["time"].values, written_by_one["time"].values)
    assert written_by_two.sizes["number"] == 3
    assert written_by_two.attrs["ensemble_perturbation"] == two["ensemble"]["perturbation"]
