"""``dlscale fit-perturbation`` end to end on a tiny trained ERA5 run: per-channel scales fitted on the validation
split and written beside the run, each iteration's scales the previous ones divided by their ratios, then
``forecast --perturb gaussian:auto`` forecasting with them; bad input one line, exit 2, nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from mounted_disks import mounted_tmpfs
from run_configs import tiny_run_config

import dlscale
from dlscale.cli import main
from dlscale.run.perturbation_fit import FitOptions, fit_perturbation_scales, next_scales
from dlscale.run.training import train
from dlscale.scoring.perturbation_scales import SCALES_FILE, ChannelScales

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.fixture(scope="module")
def era5_run(tiny_era5: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    expdir = tmp_path_factory.mktemp("fit_runs")
    assert train(tiny_run_config(CONFIGS / "vit_era5.yaml", tiny_era5, expdir, "train.num_epochs=1")) == 0
    return expdir / "tiny" / "00"


@pytest.fixture(scope="module")
def fitted(era5_run: Path) -> dict:
    options = FitOptions(
        lead="12h", members=3, init_count=3, start=0.2, iterations=2, channels=("z500", "t850")
    )
    return fit_perturbation_scales(era5_run, options)


def test_the_scales_are_fitted_on_validation_and_written_beside_the_run(era5_run, fitted, capsys):
    written = json.loads((era5_run / SCALES_FILE).read_text())
    assert written == fitted
    fit = fitted["fit"]
    assert fit["split"] == "valid" and fit["lead"] == "12h" and fit["members"] == 3
    history = fit["iterations"]
    first = history[0]
    assert set(first["scales"].values()) == {0.2}  # the start, for every channel
    if len(history) == 2:  # unless the start was already within the tolerance
        # the second iteration forecast with the first's scales divided by their ratios
        expected = next_scales(first["scales"], first["spread_skill"], ["z500", "t850"])
        assert history[1]["scales"] == pytest.approx(expected)
    assert fit["channels"] == ["z500", "t850"]
    for entry in history:  # the worst miss counts the fitted channels only
        assert entry["worst"] == pytest.approx(
            max(max(r, 1 / r) for r in map(entry["spread_skill"].get, ("z500", "t850")))
        )
    assert len(fitted["scales"]) == len(first["spread_skill"])  # every channel keeps a scale
    chosen = min(history, key=lambda entry: entry["worst"])
    assert fit["chosen_iteration"] == chosen["iteration"]
    assert fitted["scales"] == chosen["scales"]


def test_forecast_with_gaussian_auto_uses_the_fitted_scales(era5_run, fitted, capsys):
    capsys.readouterr()
    document = dlscale.forecast(
        era5_run, lead="12h", init_count=2, members=3, perturb="gaussian:auto", figures=False
    )
    logged = "".join(capsys.readouterr())
    assert Path(document["output_dir"]).name.endswith("-ens3-gaussianauto")
    recorded = document["ensemble"]["perturbation_scales"]
    assert recorded["scales"] == fitted["scales"] and recorded["file"] == str(era5_run / SCALES_FILE)
    assert "per-channel scales" in document["ensemble"]["perturbation"]
    # the logged noise in each channel's unit is its own scale times its std (not one scale for all)
    std = document["ensemble"]["perturbation_std"]
    ratios = {name: std[name] / fitted["scales"][name] for name in ("z500", "t850")}
    one_scale = {name: std[name] / max(fitted["scales"].values()) for name in ("z500", "t850")}
    assert ratios != one_scale or len(set(fitted["scales"].values())) == 1
    assert "per-channel scales" in logged


def copy_run(era5_run: Path, tmp_path: Path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(era5_run, target, ignore=shutil.ignore_patterns("forecast", SCALES_FILE))
    return target


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["fit-perturbation", "{run}", "--members", "1"], "--members 1: a spread needs"),
        (["fit-perturbation", "{run}", "--init-count", "0"], "--init-count 0"),
        (["fit-perturbation", "{run}", "--start", "50"], "--start 50.0"),
        (["fit-perturbation", "{run}", "--lead", "soon"], "soon"),
        (
            ["fit-perturbation", "{run}", "--channels", "z500,q999", "--init-count", "2"],
            "--channels: q999 not among",
        ),
        (["fit-perturbation", "{run}", "--channels", " , "], "--channels: no channel names"),
        (["fit-perturbation", "{run}", "--out", "{run}/scales.txt"], "ends in .json"),
        (["forecast", "{run}", "--members", "3", "--perturb", "gaussian:auto"], "no such scales file"),
        (["forecast", "{run}", "--members", "3", "--perturb", "gaussian:{run}/other.json"], "other.json"),
        (["forecast", "{run}", "--members", "3", "--perturb", "gaussian:auto:300"], "takes no LENGTH_KM"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(era5_run, tmp_path, capsys, arguments, message):
    target = copy_run(era5_run, tmp_path)
    argv = [part.replace("{run}", str(target)) for part in arguments]
    assert main([*argv, "--lead", "12h"] if "--lead" not in argv else argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "Traceback" not in err and len(err.splitlines()) == 1
    assert not (target / "forecast").exists() and not (target / SCALES_FILE).exists()


def test_scales_for_other_channels_are_refused_before_the_rollout(era5_run, tmp_path, capsys):
    target = copy_run(era5_run, tmp_path)
    other = ChannelScales({"z500": 1.0, "q700": 1.0}).to_json()
    (target / SCALES_FILE).write_text(json.dumps(other))
    assert (
        main(["forecast", str(target), "--lead", "12h", "--members", "3", "--perturb", "gaussian:auto"]) == 2
    )
    err = capsys.readouterr().err
    assert "other channels than the model's" in err and "q700" in err and "Traceback" not in err
    assert not list((target / "forecast").glob("*/scores.json"))


def test_the_fit_never_replaces_a_file_it_did_not_write(era5_run, tmp_path, capsys):
    target = copy_run(era5_run, tmp_path)
    checkpoint = target / "checkpoints" / "ckpt_latest.pt"
    before = checkpoint.read_bytes()
    argv = ["fit-perturbation", str(target), "--lead", "12h", "--members", "3", "--init-count", "2"]
    assert main([*argv, "--out", str(checkpoint)]) == 2
    assert "ends in .json" in capsys.readouterr().err
    summary = target / "summary.json"  # another command's JSON
    summary_before = summary.read_bytes()
    assert main([*argv, "--out", str(summary)]) == 2
    err = capsys.readouterr().err
    assert "exists and is not a perturbation scales file" in err and "Traceback" not in err
    assert checkpoint.read_bytes() == before and summary.read_bytes() == summary_before
    assert not (target / "forecast").exists()
    assert main([*argv, "--out", str(target)]) == 2  # a directory
    assert "is a directory" in capsys.readouterr().err


def test_a_read_only_place_for_the_scales_is_exit_74_before_any_forecast(era5_run, tmp_path, capsys):
    target = copy_run(era5_run, tmp_path)
    place = tmp_path / "place"
    with mounted_tmpfs(place, "ro,size=1m"):
        argv = ["fit-perturbation", str(target), "--lead", "12h", "--members", "3", "--init-count", "2"]
        assert main([*argv, "--out", str(place / "scales.json")]) == 74
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and str(place) in err[0] and "--out" in err[0], err
    assert not (target / "forecast").exists()  # said before the first forecast


def test_a_disk_that_fills_during_the_fit_is_exit_74_and_the_earlier_scales_stay_whole(
    era5_run, fitted, tmp_path, capsys, monkeypatch
):
    import errno

    import dlscale.run.perturbation_fit as fit_module

    target = copy_run(era5_run, tmp_path)
    out = tmp_path / "scales.json"
    out.write_text(json.dumps(fitted))
    before = out.read_bytes()

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(fit_module, "write_text_atomically", full)
    argv = ["fit-perturbation", str(target), "--lead", "12h", "--members", "3", "--init-count", "2"]
    assert main([*argv, "--iterations", "1", "--out", str(out)]) == 74
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(out) in err[0] and "disk is full" in err[0], err
    assert out.read_bytes() == before
