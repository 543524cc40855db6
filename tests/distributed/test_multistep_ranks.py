"""Multi-step training on several ranks: DDP, FSDP2 and tensor parallelism train K-step rollouts (with
activation checkpointing, through a curriculum) like one process does, and a run stopped mid-curriculum
continues in another layout on the curriculum's step. Each run forks 2 gloo ranks on the tiny ERA5 data."""

from __future__ import annotations

import pytest
from forked_ranks import run_ranks
from test_data_parallel import assert_close_weights, checkpoint, tiny
from test_model_parallel import TOLERANCE, history, model_weights, train_layout

from dlscale.run.training import train

# K = 1 for the first epoch, 2 for the second (the tiny data has 11 steps of 4 samples of 3 states an epoch).
CURRICULUM = (
    "log.tensorboard=false",
    "train.rollout_schedule=epoch 0=1, 1=2",
    "train.rollout_checkpointing=true",
)


def serial_history(data, expdir):
    train(tiny(data, expdir, *CURRICULUM))
    return history(expdir)


@pytest.mark.slow
def test_ddp_trains_the_curriculum_like_one_process(tiny_era5, tmp_path):
    expected = serial_history(tiny_era5, tmp_path / "serial")
    assert len(expected) == 2 and expected[1]["global_step"] == 22
    results = run_ranks(2, train_layout, tiny_era5, tmp_path / "ddp", CURRICULUM)
    assert results == [0, 0]
    assert_close_weights(model_weights(tmp_path / "serial"), model_weights(tmp_path / "ddp"), "DDP vs serial")
    for serial_row, ddp_row in zip(expected, history(tmp_path / "ddp"), strict=True):
        assert ddp_row["train_loss"] == pytest.approx(serial_row["train_loss"], rel=TOLERANCE)
        assert ddp_row["val_loss"] == pytest.approx(serial_row["val_loss"], rel=TOLERANCE)


@pytest.mark.slow
def test_fsdp2_stopped_mid_curriculum_continues_with_tensor_parallelism_like_one_process(tiny_era5, tmp_path):
    expected = serial_history(tiny_era5, tmp_path / "serial")
    expdir = tmp_path / "layouts"
    fsdp = (*CURRICULUM, "parallel.data_parallel=fsdp", "parallel.stop_check_every=1")
    assert run_ranks(2, train_layout, tiny_era5, expdir, fsdp, 14) == [0, 0]  # K = 2 since step 11
    assert checkpoint(expdir)["progress"]["global_step"] == 14
    assert run_ranks(2, train_layout, tiny_era5, expdir, (*CURRICULUM, "parallel.tensor_parallel=2")) == [
        0,
        0,
    ]
    resumed = checkpoint(expdir)
    assert resumed["progress"]["completed"] and resumed["meta"]["layout"].startswith("dp=1 x tp=2")
    assert_close_weights(model_weights(tmp_path / "serial"), model_weights(expdir), "FSDP2 -> tp vs serial")
    assert [row["val_loss"] for row in history(expdir)] == pytest.approx(
        [row["val_loss"] for row in expected], rel=TOLERANCE
    )
