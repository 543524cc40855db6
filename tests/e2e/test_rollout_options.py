"""``train.rollout_steps`` and ``train.rollout_schedule`` given together are refused in one line; schedule entries
that a run never reaches are named in a warning when it starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlscale.cli import main
from dlscale.config import load_run_config

CONFIG_FILE = Path(__file__).resolve().parents[2] / "configs" / "vit_era5.yaml"
TRAIN = ["train", "--yaml_config", str(CONFIG_FILE), "--config", "tiny"]


@pytest.mark.parametrize("steps", [4, 3])  # 4: the schedule's largest K, which used to pass silently
def test_rollout_steps_and_a_schedule_together_exit_2_naming_both(steps, tmp_path, capsys):
    schedule = "step 0=2, 100=4"
    argv = [*TRAIN, "--set", f"train.rollout_steps={steps}", "--set", f"train.rollout_schedule={schedule}"]
    assert main([*argv, "--expdir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dlscale: error: ") and "\n" not in err
    assert f"train.rollout_steps: {steps} and train.rollout_schedule '{schedule}' are both given" in err
    assert "set train.rollout_steps=1 or drop train.rollout_schedule" in err
    assert list(tmp_path.iterdir()) == []
    # rollout_steps at its default leaves K to the schedule.
    cfg = load_run_config(
        CONFIG_FILE, "tiny", ["train.rollout_steps=1", f"train.rollout_schedule={schedule}"]
    )
    assert cfg.train.max_rollout_steps == 4


def test_schedule_entries_the_run_never_reaches_are_named_when_it_starts(tiny_era5, tmp_path, capsys):
    settings = [
        f"data.root={tiny_era5}",
        "log.tensorboard=false",
        "train.rollout_schedule=epoch 0=1, 1=2, 3=3",
    ]
    argv = [*TRAIN, "--num_epochs", "1", "--expdir", str(tmp_path), "--progress", "none"]
    for setting in settings:
        argv += ["--set", setting]
    assert main(argv) == 0
    warnings = [line for line in capsys.readouterr().out.splitlines() if "will not be reached" in line]
    assert len(warnings) == 1, warnings
    assert "WARNING" in warnings[0]
    assert "entries 1=2, 3=3 will not be reached: this run trains 10 steps" in warnings[0]
    assert "its last epoch is 0" in warnings[0] and "K stays 1 to the end" in warnings[0]
    assert "samples are still read for K = 3" in warnings[0]
