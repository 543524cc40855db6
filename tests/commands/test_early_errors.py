"""A mistake on the command line is reported before torch is imported: one line, exit status 2, in a fraction of
a second rather than after torch's import (6 s on an idle 2-core machine, 17 s on a busy one).

Each bad command runs in a fresh interpreter (this one has long imported torch), which records whether torch
was imported by the time ``main`` returned. The early checks of evaluate, forecast and export repeat checks
made later for the Python API; those must say the same, which the second half compares.
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dlscale.cli import build_parser
from dlscale.commands.options import SYNTH_PRESETS
from dlscale.commands.trained_run_checks import check_checkpoint_target, check_init
from dlscale.errors import DlscaleError

REPO = Path(__file__).resolve().parents[2]
YAML = str(REPO / "configs" / "vit_era5.yaml")

# main() in a fresh interpreter; the last line of stderr says whether torch was imported when it returned.
RUN_MAIN = """
import sys
try:
    import dlscale.cli
    status = dlscale.cli.main(sys.argv[1:])
except SystemExit as exit:  # argparse's own errors
    status = exit.code
print("torch imported" if "torch" in sys.modules else "torch not imported", file=sys.stderr)
sys.exit(status)
"""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory as training leaves one before its first checkpoint: config.yaml and checkpoints/."""
    run = tmp_path_factory.mktemp("runs") / "short" / "00"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("workload: era5_vit\n")
    return run


BAD_COMMANDS = {
    "unknown config": (["train", "--yaml_config", YAML, "--config", "nosuch"], "no config named 'nosuch'"),
    "unknown key": (
        ["train", "--yaml_config", YAML, "--config", "short", "--set", "optim.lrr=1"],
        "unknown key",
    ),
    "bad value": (
        ["train", "--yaml_config", YAML, "--set", "optim.lr=abc", "--dry_run"],
        "expected a number",
    ),
    "rollout keys together": (
        ["train", "--yaml_config", YAML, "--set", "rollout_steps=4", "--set", "rollout_schedule=step 0=2"],
        "train.rollout_steps: 4 and train.rollout_schedule 'step 0=2' are both given",
    ),
    "bad sweep": (["bench", "--yaml_config", YAML, "--sweep", "bad"], "--sweep 'bad': expected KEY=v1,v2"),
    "bad sweep value": (["bench", "--yaml_config", YAML, "--sweep", "optim.lr=a,b"], "--set optim.lr=a"),
    "bad tune budget": (["tune", "--yaml_config", YAML, "--budget", "-1"], "--budget: must be"),
    "bad tune config": (["tune", "--yaml_config", YAML, "--config", "nosuch"], "no config named 'nosuch'"),
    "tune output not YAML": (
        ["tune", "--yaml_config", YAML, "--out", "tuned.txt"],
        "give a name ending in .yaml",
    ),
    "no GPUs": (["plan", "--yaml_config", YAML, "--config", "mp", "--gpus", "0"], "--gpus: must be"),
    "rank beyond the GPUs": (
        ["plan", "--yaml_config", YAML, "--config", "mp", "--gpus", "2", "--check_layout", "--rank", "2"],
        "--rank: must be one of the --gpus 2 ranks, 0..1, got 2",
    ),
    "monitor interval": (["monitor", "--interval", "0", "--once"], "--interval: must be"),
    "unknown preset": (
        ["data", "synth-era5", "--out", "x", "--preset", "nosuch"],
        "invalid choice: 'nosuch'",
    ),
    "unknown mnist preset": (["data", "synth-mnist", "--out", "x", "--preset", "nosuch"], "invalid choice"),
    "missing import source": (["data", "import-era5", "nosuch.zarr", "--out", "era5"], "no such zarr store"),
    "missing run": (["forecast", "runs/nosuch/00"], "runs/nosuch/00 does not exist; dlscale forecast takes"),
    "bad lead": (
        ["forecast", "RUN", "--lead", "3x"],
        "--lead '3x': expected a positive duration with its unit",
    ),
    "bad init": (["forecast", "RUN", "--init", "every:3x"], "--init every: '3x': expected a duration"),
    "bad init date": (["forecast", "RUN", "--init", "2018-13-45"], "--init: '2018-13-45' is neither"),
    "no initial times": (["forecast", "RUN", "--init-count", "0"], "--init-count 0: expected a number"),
    "zero lead": (["forecast", "RUN", "--lead", "0h"], "--lead '0h': expected a positive duration"),
    # --lead 0 asks for a positive duration at once, not for a unit and then, at --lead 0d, for more than 0
    "zero lead without a unit": (
        ["forecast", "RUN", "--lead", "0"],
        "--lead '0': expected a positive duration",
    ),
    "negative lead": (["forecast", "RUN", "--lead=-1d"], "--lead '-1d': expected a positive duration"),
    "huge perturbation": (
        ["forecast", "RUN", "--members", "4", "--perturb", "gaussian:1e30"],
        "SCALE 1e+30 is beyond 10 standard deviations",
    ),
    "tiny perturbation": (
        ["forecast", "RUN", "--members", "4", "--perturb", "gaussian:1e-12"],
        "SCALE 1e-12 is below 1e-06 standard deviations",
    ),
    "perturbation longer than the Earth": (
        ["forecast", "RUN", "--members", "4", "--perturb", "gaussian:0.1:25000"],
        "LENGTH_KM 25000 is beyond half the Earth's",
    ),
    "names without a file": (
        ["forecast", "RUN", "--names", "short"],
        "--names short: names the variables of",
    ),
    "missing forecast": (
        ["score", "nosuch.zarr", "--truth", "era5.zarr"],
        "nosuch.zarr: no such forecast file",
    ),
    "forecast not a store": (["score", "RUN", "--truth", "era5.zarr"], "is a directory but not a zarr store"),
    "missing truth": (["score", YAML, "--truth", "nosuch.zarr"], "--truth nosuch.zarr: no such zarr store"),
    "same labels": (["score", YAML, "--truth", YAML, "--compare", YAML], "two forecasts have the label"),
    "time-mean to score": (
        ["score", YAML, "--truth", YAML, "--climatology", "time-mean"],
        "--climatology time-mean: a scored forecast has no training years",
    ),
    "missing checkpoint": (
        ["evaluate", "RUN", "--checkpoint", "nosuch.pt"],
        "--checkpoint nosuch.pt: does not",
    ),
    "missing evaluated run": (["evaluate", "runs/nosuch/00"], "does not exist; dlscale evaluate takes"),
    "missing exported run": (
        ["export", "runs/nosuch/00", "--out", "exported"],
        "does not exist; dlscale export",
    ),
    "missing exported checkpoint": (
        ["export", "RUN", "--out", "exported", "--checkpoint", "best/nosuch.pt"],
        "--checkpoint best/nosuch.pt: does not exist",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BAD_COMMANDS))
def test_a_bad_command_line_fails_with_one_line_before_torch_is_imported(case, run_dir, tmp_path):
    argv, message = BAD_COMMANDS[case]
    argv = [str(run_dir) if word == "RUN" else word for word in argv]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", RUN_MAIN, *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert lines[-1] == "torch not imported", done.stderr
    assert message in lines[-2] and lines[-2].startswith("dlscale"), done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == [], "a refused command writes nothing"


# ---- the early checks say what the later ones say ---------------------------------------------------------------


def error_of(call) -> str:
    with pytest.raises(DlscaleError) as caught:
        call()
    return str(caught.value)


@pytest.mark.parametrize(
    ("target", "checkpoint"),
    [
        ("runs/nosuch/00", None),
        ("RUN", "nosuch.pt"),
        ("RUN/checkpoints", "nosuch.pt"),
        ("RUN", "~/nosuch.pt"),
    ],
)
@pytest.mark.parametrize("command", ["evaluate", "forecast", "export"])
def test_the_early_checkpoint_checks_say_what_the_checkpoint_choice_says(
    target, checkpoint, command, run_dir
):
    from dlscale.checkpoint.selection import choose_checkpoint

    path = Path(target.replace("RUN", str(run_dir))).expanduser()
    early = error_of(lambda: check_checkpoint_target(path, checkpoint, command))
    assert early == error_of(lambda: choose_checkpoint(path, checkpoint, command))


def test_the_early_checks_pass_what_the_checkpoint_choice_takes(run_dir, tmp_path):
    checkpoint = run_dir / "checkpoints" / "ckpt_step00000010.pt"
    checkpoint.write_bytes(b"")
    elsewhere = tmp_path / "elsewhere.pt"
    elsewhere.write_bytes(b"")
    for target, choice in [
        (run_dir, None),  # the latest: whether there is one is left to the command, which says what is there
        (run_dir, "best"),
        (run_dir, checkpoint.name),  # a name inside checkpoints/
        (run_dir, str(elsewhere)),
        (checkpoint, None),
        (tmp_path, "nosuch.pt"),  # not a run directory: the command says what it is
    ]:
        check_checkpoint_target(target, choice, "evaluate")


@pytest.mark.parametrize(
    ("init", "init_count"), [("every:3x", None), ("every:", None), ("2018-13-45", None), ("every:6h", 0)]
)
def test_a_bad_init_is_refused_as_the_forecast_refuses_it(init, init_count):
    from dlscale.data.trajectories import ForecastStart
    from dlscale.run.forecast_times import choose_starts

    starts = [ForecastStart(0, step, np.datetime64("2018-01-01T00", "m") + 360 * step) for step in range(8)]
    later = error_of(lambda: choose_starts(starts, list(range(7, -1, -1)), 1, 6.0, 6.0, init, init_count))
    args = argparse.Namespace(
        target=".", checkpoint=None, lead="6h", init=init, init_count=init_count, batch_size=None
    )
    from dlscale.commands.trained_run_checks import check_forecast_command

    assert error_of(lambda: check_forecast_command(args)) == later


@pytest.mark.parametrize("init", ["every:12h", "every:4", "2018-01-01T00,2018-01-01T12:00"])
def test_the_documented_inits_pass(init):
    check_init(init)


def test_the_parsers_presets_are_each_generators_presets():
    generators = {
        "synth-era5": "dlscale.data.era5.synth",
        "synth-cosmo": "dlscale.data.cosmo.synth",
        "synth-mnist": "dlscale.data.mnist.synth",
        "synth-cifar": "dlscale.data.cifar.synth",
    }
    parser = build_parser()
    for generator, module in generators.items():
        args = parser.parse_args(["data", generator, "--out", "x"])
        assert args.preset in SYNTH_PRESETS
        assert tuple(importlib.import_module(module).PRESETS) == SYNTH_PRESETS, generator
