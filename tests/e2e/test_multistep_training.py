"""Multi-step training end to end on the tiny ERA5 data, in-process: a curriculum resumed mid-way is bit for bit
the uninterrupted run, validation reports the K-step loss, a trained run is fine-tuned with one command, and what
cannot be trained on rollouts is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from run_configs import tiny_run_config
from test_training_run import StopAtStep

from dlscale.checkpoint.files import load_checkpoint
from dlscale.errors import ConfigError
from dlscale.run.training import train

CONFIG_FILE = Path(__file__).resolve().parents[2] / "configs" / "vit_era5.yaml"
CURRICULUM = ("train.rollout_schedule=step 0=1, 6=2, 15=3",)


def tiny(data, expdir, *overrides, **flags):
    return tiny_run_config(CONFIG_FILE, data, expdir, *overrides, **flags)


def latest(cfg) -> dict:
    return load_checkpoint(
        Path(cfg.log.expdir) / cfg.name / cfg.log.run_num / "checkpoints" / "ckpt_latest.pt"
    )


@pytest.mark.slow
def test_a_curriculum_stopped_mid_way_resumes_bit_for_bit(tiny_era5, tmp_path):
    whole = tiny(tiny_era5, tmp_path / "whole", *CURRICULUM)
    assert train(whole) == 0
    interrupted = tiny(tiny_era5, tmp_path / "parts", *CURRICULUM)
    train(interrupted, extra_observers=[StopAtStep(8)])  # K = 2 since step 6
    assert latest(interrupted)["progress"]["global_step"] == 8
    assert train(interrupted) == 0
    expected, got = latest(whole), latest(interrupted)
    assert got["progress"]["global_step"] == expected["progress"]["global_step"] == 20  # 2 epochs of 10 steps
    for key, value in expected["model"].items():
        assert torch.equal(got["model"][key], value), key
    assert [row["train_loss"] for row in got["progress"]["history"]] == [
        row["train_loss"] for row in expected["progress"]["history"]
    ]


def test_validation_reports_the_k_step_loss_beside_the_first_steps(tiny_era5, tmp_path):
    cfg = tiny(tiny_era5, tmp_path, "train.rollout_steps=3", "train.amp_mode=bf16", "train.num_epochs=1")
    assert train(cfg) == 0
    run = tmp_path / "tiny" / "00"
    log_text = (run / "out.log").read_text()
    assert "3-step rollout loss " in log_text and "multi-step training (K=3)" in log_text
    assert "samples of 4 consecutive states from the train split" in log_text
    summary = json.loads((run / "summary.json").read_text())
    rollout = summary["final"]["metrics"]["loss(3-step rollout)"]
    assert rollout > 0 and rollout != summary["final"]["val_loss"]


@pytest.mark.slow
def test_a_trained_run_is_fine_tuned_on_rollouts_with_one_command(tiny_era5, tmp_path):
    base = tiny(tiny_era5, tmp_path, "train.num_epochs=1")
    assert train(base) == 0
    base_checkpoint = tmp_path / "tiny" / "00" / "checkpoints" / "ckpt_latest.pt"
    tuned = tiny(
        tiny_era5,
        tmp_path,
        "train.rollout_steps=2",
        "train.num_epochs=1",
        **{
            "checkpoint.resume": str(base_checkpoint),
            "checkpoint.resume_weights_only": True,
            "log.run_num": "ft",
        },
    )
    assert train(tuned) == 0
    log_text = (tmp_path / "tiny" / "ft" / "out.log").read_text()
    assert f"Initial weights from {base_checkpoint}" in log_text and "2-step rollout loss" in log_text
    assert latest(tuned)["progress"]["global_step"] == 11  # 44 samples of 3 states, batches of 4


def test_a_k_the_files_cannot_hold_is_refused_before_training(tiny_era5, tmp_path):
    # The tiny data's valid year holds 24 states: a 30-step rollout needs 31.
    with pytest.raises(
        ConfigError, match=r"train.rollout_steps 30: no trajectory of the train split holds 31"
    ):
        train(tiny(tiny_era5, tmp_path, "train.rollout_steps=30"))
    assert not list((tmp_path / "tiny" / "00").rglob("ckpt_*"))
