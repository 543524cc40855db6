"""A forecast or an evaluation never silently replaces another (issue 36): on a tiny trained ERA5 run, results
of other options land in directories of their own and both stay, the same options again replace their directory
with a line saying what they replace, and every document records its options, its checkpoint and where it
went. (How the names are spelled is tests/run/test_results_directory.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from run_configs import tiny_run_config

import dlscale
from dlscale.checkpoint.files import load_checkpoint
from dlscale.cli import main
from dlscale.run.forecast import ForecastOptions, forecast_checkpoint
from dlscale.run.training import train

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.fixture(scope="module")
def era5_run(tiny_era5: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny ERA5 run (one epoch)."""
    expdir = tmp_path_factory.mktemp("results_runs")
    assert train(tiny_run_config(CONFIGS / "vit_era5.yaml", tiny_era5, expdir, "train.num_epochs=1")) == 0
    return expdir / "tiny" / "00"


def read(directory: Path, name: str) -> dict:
    return json.loads((directory / name).read_text())


def test_forecasts_of_other_options_keep_their_own_directories(era5_run):
    short = forecast_checkpoint(era5_run, ForecastOptions(lead="6h", init_count=2, figures=False))
    longer = forecast_checkpoint(era5_run, ForecastOptions(lead="12h", init_count=3, figures=False))
    assert short.output_dir == era5_run / "forecast" / "test-ckpt_latest-lead6h-init2-clim-timemean"
    assert longer.output_dir == era5_run / "forecast" / "test-ckpt_latest-lead12h-init3-clim-timemean"
    first, second = read(short.output_dir, "scores.json"), read(longer.output_dir, "scores.json")
    assert (first["lead_hours"], first["initial_time_count"]) == ([0.0, 6.0], 2)
    assert (second["lead_hours"], second["initial_time_count"]) == ([0.0, 6.0, 12.0], 3)
    assert first == short.document and first["output_dir"] == str(short.output_dir)
    # What was asked for, and the checkpoint it came from.
    assert first["options"] == {
        "split": "test",
        "lead": "6h",
        "init": "every:12h",
        "init_count": 2,
        "batch_size": None,
        "write": None,
        "names": "wb2",
        "climatology": None,
        "members": 1,
        "perturb": None,
        "figures": False,
        "overrides": [],
    }
    progress = load_checkpoint(era5_run / "checkpoints" / "ckpt_latest.pt")["progress"]
    assert first["checkpoint"] == str(era5_run / "checkpoints" / "ckpt_latest.pt")
    assert (first["global_step"], first["epochs_completed"]) == (progress["global_step"], 1)


def test_an_init_count_that_keeps_every_initial_time_names_no_directory_of_its_own(era5_run):
    every = forecast_checkpoint(era5_run, ForecastOptions(lead="5d", figures=False))
    counted = forecast_checkpoint(era5_run, ForecastOptions(lead="120h", init_count=1000, figures=False))
    assert (
        every.output_dir
        == counted.output_dir
        == era5_run / "forecast" / "test-ckpt_latest-lead5d-clim-timemean"
    )
    assert counted.document["initial_time_count"] == every.document["initial_time_count"]


@pytest.mark.slow
def test_the_same_options_again_replace_their_directory_and_say_what_they_replace(era5_run, capsys):
    first = forecast_checkpoint(
        era5_run, ForecastOptions(lead="1d", init="every:1d", init_count=2, figures=False)
    )
    assert "will replace" not in capsys.readouterr().out
    again = dlscale.forecast(
        era5_run, lead="24h", init="every:4", init_count=2
    )  # the same, written otherwise
    out = capsys.readouterr().out
    step = first.document["global_step"]
    notice = f"This forecast will replace {first.output_dir} (step {step}, written "
    assert notice in out, out
    assert re.search(re.escape(notice) + r"\d{4}-\d\d-\d\d \d\d:\d\d\)", out)
    assert again["output_dir"] == str(first.output_dir)
    assert read(first.output_dir, "scores.json")["options"]["lead"] == "24h"  # the newer one is there
    siblings = [
        p.name for p in first.output_dir.parent.iterdir() if p.name.startswith("test-ckpt_latest-lead1d")
    ]
    assert siblings == [first.output_dir.name]


@pytest.mark.slow
def test_evaluations_with_other_set_changes_stay_beside_each_other(era5_run, capsys):
    assert main(["evaluate", str(era5_run)]) == 0
    assert main(["evaluate", str(era5_run), "--set", "data.limit_nsamples_val=1"]) == 0
    out = capsys.readouterr().out
    evaluations = era5_run / "eval"
    (changed,) = [p for p in evaluations.iterdir() if p.name != "valid-ckpt_latest"]
    assert re.fullmatch(r"valid-ckpt_latest-set-[0-9a-f]{8}", changed.name), changed.name
    default, limited = read(evaluations / "valid-ckpt_latest", "metrics.json"), read(changed, "metrics.json")
    assert (default["samples"], limited["samples"]) == (23, 1)
    assert limited["options"] == {"split": "valid", "overrides": ["data.limit_nsamples_val=1"]}
    assert (limited["output_dir"], default["options"]["overrides"]) == (str(changed), [])
    assert f"metrics:     {changed / 'metrics.json'}, metrics.csv" in out  # the end of the run says where
    # A layout change computes the same numbers: it replaces the default's directory, and says so.
    assert main(["evaluate", str(era5_run), "--set", "parallel.tensor_parallel=1"]) == 0
    out = capsys.readouterr().out
    assert (
        f"This evaluation will replace {evaluations / 'valid-ckpt_latest'} (step {default['global_step']}"
        in out
    )
    assert sorted(p.name for p in evaluations.iterdir()) == sorted(["valid-ckpt_latest", changed.name])
    assert read(evaluations / "valid-ckpt_latest", "metrics.json")["overrides"] == [
        "parallel.tensor_parallel=1"
    ]
