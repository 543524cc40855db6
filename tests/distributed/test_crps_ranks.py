"""CRPS training on several ranks: each sample's members draw the noise of their place in the global batch, so
DDP trains like one process, and an FSDP2 run of rollouts stopped mid-run continues in one process to the
uninterrupted run's weights. Each run forks 2 gloo ranks on the tiny ERA5 data."""

from __future__ import annotations

import numpy as np
import pytest
from forked_ranks import run_ranks
from test_data_parallel import checkpoint, tiny
from test_model_parallel import TOLERANCE, history, model_weights, train_layout

from dlscale.run.training import train

CRPS = ("log.tensorboard=false", "model.noise_channels=2", "train.loss=crps", "train.ensemble_members=3")
# 22 Adam steps on a loss with kinks (|x_m - y| and the members' order): a rounding difference of the gradients
# (the ranks' all-reduce sums in another order) that flips the sign of a member's error at one point moves a
# weight by up to ~2e-5 (head.weight with torch 2.13's CPU kernels; the median weight by 1e-6), while the losses
# agree to 1e-7. A member drawing another sample's noise moves the losses by 1e-3 and more.
WEIGHT_ATOL = 5e-5


def assert_close_weights(expected: dict, actual: dict, what: str) -> None:
    assert expected.keys() == actual.keys()
    for key in expected:
        np.testing.assert_allclose(
            actual[key], expected[key], rtol=1e-4, atol=WEIGHT_ATOL, err_msg=f"{what}: {key}"
        )


@pytest.mark.slow
def test_ddp_trains_the_members_like_one_process(tiny_era5, tmp_path):
    assert train(tiny(tiny_era5, tmp_path / "serial", *CRPS)) == 0
    expected = history(tmp_path / "serial")
    assert run_ranks(2, train_layout, tiny_era5, tmp_path / "ddp", CRPS) == [0, 0]
    assert_close_weights(model_weights(tmp_path / "serial"), model_weights(tmp_path / "ddp"), "DDP vs serial")
    for serial_row, ddp_row in zip(expected, history(tmp_path / "ddp"), strict=True):
        assert ddp_row["train_loss"] == pytest.approx(serial_row["train_loss"], rel=TOLERANCE)
        assert ddp_row["val_loss"] == pytest.approx(serial_row["val_loss"], rel=TOLERANCE)


@pytest.mark.slow
def test_fsdp2_rollouts_stopped_mid_run_continue_in_one_process_like_the_uninterrupted_run(
    tiny_era5, tmp_path
):
    rollouts = (*CRPS, "train.rollout_steps=2", "parallel.stop_check_every=1")
    assert train(tiny(tiny_era5, tmp_path / "serial", *rollouts)) == 0
    expdir = tmp_path / "fsdp"
    fsdp = (*rollouts, "parallel.data_parallel=fsdp")
    assert run_ranks(2, train_layout, tiny_era5, expdir, fsdp, 7) == [0, 0]
    assert checkpoint(expdir)["progress"]["global_step"] == 7
    assert train(tiny(tiny_era5, expdir, *rollouts)) == 0
    assert checkpoint(expdir)["progress"]["completed"]
    assert_close_weights(model_weights(tmp_path / "serial"), model_weights(expdir), "FSDP2 stopped -> serial")
    assert [row["val_loss"] for row in history(expdir)] == pytest.approx(
        [row["val_loss"] for row in history(tmp_path / "serial")], rel=TOLERANCE
    )
