"""``dlscale score`` with damaged stores: a missing chunk or NaN values in the truth leave the initial times whose
valid times they touch out of every lead, counted and named on the console and in scores.json, the rest scored
exactly as against a whole truth; an unreadable chunk of the truth or of the forecast, or a forecast whose
metadata names a codec that runs code, is one line, exit 2, nothing written (and no code run)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from dlscale.cli import main

xarray = pytest.importorskip("xarray", reason="the era5 extra (xarray, zarr) reads the stores")
zarr = pytest.importorskip("zarr", reason="the era5 extra (xarray, zarr) reads the stores")
from damaged_stores import damage, name_pickle_codec  # noqa: E402
from era5_stores import ZARR_FORMAT_2, random_truth, six_hourly_times, write_wb2  # noqa: E402
from test_score import HEIGHT, OFFSETS, WIDTH, offset_forecast  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Consolidated metadata:UserWarning")
STEPS = 12
# The forecast's initial times are the truth's states 0, 2 and 4 with leads 0, 6 and 12 h: state 3 is a valid
# time of the second initial time alone (at lead 6 h).
DAMAGED_STATE = 3


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A whole truth store and the forecast (truth + OFFSETS) scored against it."""
    root = tmp_path_factory.mktemp("damaged_truth")
    truth = write_wb2(
        root / "truth.zarr", random_truth(STEPS, HEIGHT, WIDTH), six_hourly_times([2018], STEPS)
    )
    return truth, offset_forecast(truth, root / "forecast.zarr", OFFSETS)


def damaged_copy(truth: Path, where: Path, kind: str) -> Path:
    """A copy of ``truth`` whose 2m_temperature chunk at state DAMAGED_STATE is damaged (``kind``: 'nan'
    writes NaN into it through zarr, the others are :func:`damaged_stores.damage`'s)."""
    copy = Path(shutil.copytree(truth, where))
    if kind == "nan":
        array = zarr.open_group(str(copy), mode="r+")["2m_temperature"]
        array[DAMAGED_STATE] = np.nan
    else:
        chunk = next((copy / "2m_temperature").glob(f"{DAMAGED_STATE}.*"))
        damage(chunk, kind)
    return copy


def run_score(forecast: Path, truth: Path, out: Path, *options: str) -> int:
    return main(["score", str(forecast), "--truth", str(truth), "--out", str(out), "--no-figures", *options])


@pytest.mark.parametrize("kind", ["missing", "nan"])
def test_initial_times_the_damage_touches_are_left_out_of_every_lead_and_named(kind, clean, tmp_path, capsys):
    truth, forecast = clean
    damaged = damaged_copy(truth, tmp_path / "damaged.zarr", kind)
    assert run_score(forecast, damaged, tmp_path / "scores") == 0
    console = capsys.readouterr().out
    assert "1 whose truth has a missing chunk or NaN or infinite values" in console
    assert "2018-01-01T12:00 (at lead 6h, 2018-01-01T18:00: channel t2m" in console
    if kind == "missing":
        assert "its chunk 2m_temperature/3." in console
    document = json.loads((tmp_path / "scores" / "scores.json").read_text())
    assert document["initial_time_count"] == 2
    assert document["initial_times_left_out"] == 1
    assert list(document["truth_unusable"]) == ["2018-01-01T12:00"]
    assert "t2m" in document["truth_unusable"]["2018-01-01T12:00"]
    assert not document["nonfinite"]["truth"], "no NaN reached the scores"

    # The rest are scored exactly as against the whole truth, every score over the same two initial times.
    kept = "2018-01-01T00..2018-01-01T00"
    assert run_score(forecast, truth, tmp_path / "first", "--times", kept) == 0
    assert run_score(forecast, truth, tmp_path / "last", "--times", "2018-01-02T00..2018-01-02T00") == 0
    first, last = (json.loads((tmp_path / n / "scores.json").read_text()) for n in ("first", "last"))
    for measure in ("rmse", "bias"):
        for channel in document["channels"]:
            got = np.array(document["scores"]["model"][measure][channel], float)
            assert np.isfinite(got).all(), (measure, channel)
            one = np.array(first["scores"]["model"][measure][channel], float)
            other = np.array(last["scores"]["model"][measure][channel], float)
            expected = (one + other) / 2 if measure == "bias" else np.sqrt((one**2 + other**2) / 2)
            np.testing.assert_allclose(got, expected, rtol=1e-5, err_msg=f"{measure} {channel}")


def test_a_truth_damaged_at_every_initial_time_is_refused(clean, tmp_path, capsys):
    truth, forecast = clean
    damaged = Path(shutil.copytree(truth, tmp_path / "damaged.zarr"))
    for state in (0, 2, 4):  # every initial state, which persistence scores
        next((damaged / "2m_temperature").glob(f"{state}.*")).unlink()
    assert run_score(forecast, damaged, tmp_path / "scores") == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "cannot score any of the 3 initial times" in error[0], error
    assert not (tmp_path / "scores").exists()


@pytest.mark.parametrize("kind", ["truncated", "link_loop"])
def test_an_unreadable_truth_chunk_is_one_line_naming_the_store_and_variable(kind, clean, tmp_path, capsys):
    truth, forecast = clean
    damaged = damaged_copy(truth, tmp_path / "damaged.zarr", kind)
    assert run_score(forecast, damaged, tmp_path / "scores") == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("dlscale: error: "), error
    assert "damaged.zarr" in error[0] and "2m_temperature" in error[0]
    assert not (tmp_path / "scores").exists()


METADATA = ("zarr.json", ".zarray", ".zattrs", ".zgroup")


@pytest.mark.parametrize("kind", ["garbage", "link_loop"])
def test_an_unreadable_forecast_chunk_is_one_line_naming_the_forecast_and_variable(
    kind, clean, tmp_path, capsys
):
    truth, forecast = clean
    damaged = Path(shutil.copytree(forecast, tmp_path / "damaged_forecast.zarr"))
    chunk = sorted(
        p for p in (damaged / "2m_temperature").rglob("*") if p.is_file() and p.name not in METADATA
    )[0]
    damage(chunk, kind)
    assert run_score(damaged, truth, tmp_path / "scores") == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith(f"dlscale: error: {damaged}: variable '2m_temperature'"), (
        error
    )
    assert "the store is damaged" in error[0], error
    assert not (tmp_path / "scores").exists()


def test_a_forecast_whose_metadata_names_the_pickle_codec_is_refused_and_runs_nothing(
    clean, tmp_path, capsys
):
    truth, forecast = clean
    with xarray.open_zarr(forecast) as opened:
        loaded = opened.load()
    for variable in loaded.variables.values():
        variable.encoding = {}
    copy = tmp_path / "pickled.zarr"
    loaded.to_zarr(copy, mode="w", consolidated=True, **ZARR_FORMAT_2)
    marker = tmp_path / "code-ran"
    name_pickle_codec(copy, "2m_temperature", marker)
    assert run_score(copy, truth, tmp_path / "scores") == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "names the codec 'pickle'" in error[0], error
    assert not marker.exists(), "the store's pickle was never loaded"
