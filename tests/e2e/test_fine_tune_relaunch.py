"""A multi-step fine-tune (``--resume RUN --resume_weights_only``) stopped by SIGTERM or killed with SIGKILL
continues when the identical command is launched again (a Slurm requeue does exactly that), and ends bit for bit
where the uninterrupted fine-tune ends; a run directory holding another run is still refused."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch
from killed_runs import kill_during_saves_then_resume
from run_configs import run_settings, tiny_run_config

from dlscale.checkpoint.files import load_checkpoint
from dlscale.cli import main
from dlscale.run.training import train
from dlscale.training.observer import Observer

CONFIG_FILE = Path(__file__).resolve().parents[2] / "configs" / "vit_era5.yaml"
SCHEDULE = "train.rollout_schedule=step 0=1, 4=2"  # one epoch of 11 steps, K = 2 from step 4


class SigtermAtStep(Observer):
    """Sends this process a real SIGTERM at the end of a global step (Slurm's preemption warning)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, trainer, loss) -> None:
        if trainer.progress.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.fixture(scope="module")
def base_runs(tiny_era5, tmp_path_factory) -> tuple[Path, Path]:
    """The latest checkpoints of two one-epoch, one-step runs of different seeds."""
    expdir = tmp_path_factory.mktemp("bases")
    latest = []
    for seed in (0, 1):
        settings = ("train.num_epochs=1", f"train.seed={seed}")
        cfg = tiny_run_config(CONFIG_FILE, tiny_era5, expdir, *settings, **{"log.run_num": f"seed{seed}"})
        assert train(cfg) == 0
        latest.append(expdir / "tiny" / f"seed{seed}" / "checkpoints" / "ckpt_latest.pt")
    return latest[0], latest[1]


def fine_tune(data: Path, expdir: Path, source: Path, run_num: str = "ft"):
    """The docs' fine-tune on the tiny data: a curriculum, from ``source``'s weights only."""
    flags = {"checkpoint.resume": str(source), "checkpoint.resume_weights_only": True, "log.run_num": run_num}
    return tiny_run_config(CONFIG_FILE, data, expdir, SCHEDULE, "train.num_epochs=1", **flags)


def latest(expdir: Path, run_num: str = "ft") -> dict:
    return load_checkpoint(expdir / "tiny" / run_num / "checkpoints" / "ckpt_latest.pt")


def assert_same_run(expected: dict, got: dict) -> None:
    assert got["progress"]["global_step"] == expected["progress"]["global_step"] == 11
    for key, value in expected["model"].items():
        assert torch.equal(got["model"][key], value), key
    assert [row["train_loss"] for row in got["progress"]["history"]] == [
        row["train_loss"] for row in expected["progress"]["history"]
    ]


def digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.mark.slow
def test_a_fine_tune_stopped_by_sigterm_continues_with_the_same_command_bit_for_bit(
    base_runs, tiny_era5, tmp_path
):
    source = tmp_path / "base.pt"  # the base run's latest checkpoint, which goes on changing below
    shutil.copyfile(base_runs[0], source)
    assert train(fine_tune(tiny_era5, tmp_path / "whole", source)) == 0

    parts = tmp_path / "parts"
    assert train(fine_tune(tiny_era5, parts, source), extra_observers=[SigtermAtStep(6)]) == 0
    assert latest(parts)["progress"]["global_step"] == 6
    # The base run trains on meanwhile: its latest checkpoint now holds other weights.
    shutil.copyfile(base_runs[1], source)
    assert train(fine_tune(tiny_era5, parts, source)) == 0  # the identical command

    assert_same_run(latest(tmp_path / "whole"), latest(parts))
    log = (parts / "tiny" / "ft" / "out.log").read_text()
    own = parts / "tiny" / "ft" / "checkpoints" / "ckpt_latest.pt"
    assert f"continues from its own checkpoint {own} (global step 6)" in log
    assert f"the weights-only source {source} was not reloaded" in log
    assert f"{source} has changed since this run took its weights from it" in log
    assert "Resuming from" in log
    assert "will not be reached" not in log  # every entry of the schedule is reached


@pytest.mark.slow
def test_a_fine_tune_killed_after_a_save_continues_with_the_same_command_bit_for_bit(
    base_runs, tiny_era5, tmp_path
):
    reference = fine_tune(tiny_era5, tmp_path / "reference", base_runs[0])
    assert train(reference) == 0
    args = [
        "train", "--yaml_config", str(CONFIG_FILE), "--config", "tiny", "--set", SCHEDULE,
        "--num_epochs", "1", "--resume", str(base_runs[0]), "--resume_weights_only", "--run_num", "ft",
        "--set", "checkpoint.save_every_steps=1",  # saves to be killed after
    ]  # fmt: skip
    for setting in run_settings(tiny_era5, tmp_path / "killed"):
        args += ["--set", setting]
    run = tmp_path / "killed" / "tiny" / "ft"
    relaunched = kill_during_saves_then_resume(args, run, saves=3)
    assert relaunched.returncode == 0, relaunched.stderr
    assert "continues from its own checkpoint" in relaunched.stdout
    assert_same_run(latest(tmp_path / "reference"), latest(tmp_path / "killed"))


@pytest.mark.slow
def test_a_directory_holding_another_run_is_still_refused(base_runs, tiny_era5, tmp_path, capsys):
    expdir = base_runs[0].parents[3]
    plain = base_runs[1].parent  # an ordinary run's checkpoints (seed1)
    before = digests(plain)
    command = [
        "train", "--yaml_config", str(CONFIG_FILE), "--config", "tiny", "--set", SCHEDULE, "--num_epochs", "1",
        "--resume_weights_only", "--set", f"data.root={tiny_era5}", "--progress", "none",
    ]  # fmt: skip
    assert main([*command, "--resume", str(base_runs[0]), "--expdir", str(expdir), "--run_num", "seed1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dlscale: error: ") and "\n" not in err
    assert "already holds this run's own checkpoint" in err and "another --run_num" in err
    assert digests(plain) == before

    # A fine-tune from the seed-1 weights, stopped after its first step, is not continued from other weights.
    tuned = fine_tune(tiny_era5, tmp_path, base_runs[1])
    assert train(tuned, extra_observers=[SigtermAtStep(1)]) == 0
    checkpoints = tmp_path / "tiny" / "ft" / "checkpoints"
    before = digests(checkpoints)
    assert main([*command, "--resume", str(base_runs[0]), "--expdir", str(tmp_path), "--run_num", "ft"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"took its weights from {base_runs[1]} at its global step 11, not from" in err
    assert f"--resume {base_runs[1]} --resume_weights_only" in err
    assert digests(checkpoints) == before

    # The same weights under another name are the same start: it continues.
    moved = tmp_path / "moved" / "ckpt_latest.pt"
    moved.parent.mkdir()
    shutil.copyfile(base_runs[1], moved)
    assert main([*command, "--resume", str(moved), "--expdir", str(tmp_path), "--run_num", "ft"]) == 0
    assert "continues from its own checkpoint" in capsys.readouterr().out
    assert load_checkpoint(checkpoints / "ckpt_latest.pt")["progress"]["global_step"] == 11
