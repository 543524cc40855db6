"""Which weights the end-of-run report describes when the divergence guard distrusts the last ones (the
restored-checkpoint case, which needs a real run, is in tests/e2e/test_divergence.py)."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_divergence_words import guard_of, train_step

from dlscale.errors import CheckpointError
from dlscale.report.summary import RunSummary
from dlscale.training.divergence.final_weights import settle_final_weights


def epoch_row(epoch: int, global_step: int, val_loss: float) -> dict:
    return {
        "epoch": epoch,
        "global_step": global_step,
        "train_loss": 1.0,
        "val_loss": val_loss,
        "headline": "loss",
        "headline_value": val_loss,
        "baseline": None,
        "baseline_loss": None,
        "baseline_headline": None,
        "train_seconds": 1.0,
        "samples_per_second": 10.0,
    }


def trainer_of(guard, recovery=None):
    """A stand-in for the trainer at its end: the guard, its run and (optionally) the run's checkpoints."""
    guard.recovery = recovery
    guard.setup.record = SimpleNamespace(name="tiny", source="tiny.yaml", workload="era5")
    guard.setup.global_batch_size = 4
    guard.setup.plan = SimpleNamespace(total_steps=9)
    guard.setup.process.world_size = 1
    return SimpleNamespace(guard=guard, progress=guard.progress, setup=guard.setup, final_weights=None)


def end_of_epoch(guard, epoch: int, val_loss: float) -> None:
    guard.progress.history.append(epoch_row(epoch, guard.progress.global_step, val_loss))


def report(trainer, outcome: str, tmp_path: Path) -> dict:
    trainer.final_weights = settle_final_weights(trainer, outcome)
    return RunSummary(tmp_path, None, None).summary(trainer, outcome, [])


def skipping_run_that_exploded():
    """Under skip: a healthy epoch, then an update that threw the weights out; every later update skipped, one
    more than train.max_skipped_steps in epoch 3."""
    guard = guard_of(on_nonfinite="skip", max_skipped_steps=3)
    for _ in range(3):
        train_step(guard, 1.0)
    end_of_epoch(guard, 1, 0.9)
    for _ in range(3):
        train_step(guard, 2e10, skipped=True, spiked_here=True)  # steps 3, 4, 5
    end_of_epoch(guard, 2, 1.8e10)
    return guard


def test_without_a_checkpoint_the_exploded_epochs_numbers_stay_but_are_flagged(tmp_path):
    guard = skipping_run_that_exploded()
    train_step(guard, 2e10, skipped=True, spiked_here=True)  # the 4th skip: diverged
    assert guard.divergence is not None
    summary = report(trainer_of(guard), "diverged", tmp_path)
    final = summary["final"]
    assert final["val_loss"] == 1.8e10 and final["epoch"] == 2
    assert final["weights_trusted"] is False
    assert summary["final_weights"].startswith(
        "epoch 2's weights at step 6, which the divergence guard distrusts: they come after the updates "
        "skipped from step 3 on, which ended in the divergence at step 6"
    )


def test_a_run_that_reaches_its_end_while_still_skipping_is_flagged_too(tmp_path):
    guard = skipping_run_that_exploded()
    assert guard.divergence is None and guard.in_trouble()
    summary = report(trainer_of(guard), "finished", tmp_path)
    assert summary["final"]["weights_trusted"] is False
    assert "the run ended before 1 steps had trained normally after the last one" in summary["final_weights"]


def test_an_epoch_validated_before_the_divergence_is_trusted_though_never_saved(tmp_path):
    guard = guard_of(on_nonfinite="stop")
    for _ in range(3):
        train_step(guard, 1.0)
    end_of_epoch(guard, 1, 0.9)
    train_step(guard, 1.0)
    train_step(guard, math.nan)  # step 4 (0-based), with the weights after 4 steps: those are suspect
    assert not guard.check()
    summary = report(trainer_of(guard), "diverged", tmp_path)
    assert summary["final"]["weights_trusted"] is True and summary["final"]["val_loss"] == 0.9
    assert summary["final_weights"] == (
        "epoch 1's weights at step 3, from before the divergence at step 4 "
        "(no checkpoint was saved before it)"
    )


class UnreadableCheckpoint:
    """The run's last good checkpoint, which does not load any more."""

    def last_good(self) -> Path:
        return Path("ckpt_latest.pt")

    def restore(self, path: Path):
        raise CheckpointError(f"{path}: truncated")


def test_a_last_good_checkpoint_that_does_not_load_is_named_and_the_run_ends_as_without_one(tmp_path):
    guard = skipping_run_that_exploded()
    train_step(guard, 2e10, skipped=True, spiked_here=True)
    summary = report(trainer_of(guard, UnreadableCheckpoint()), "diverged", tmp_path)
    assert summary["final"]["weights_trusted"] is False
    assert "(ckpt_latest.pt does not load: ckpt_latest.pt: truncated)" in summary["final_weights"]


class MustNotLoad:
    def last_good(self) -> Path:
        return Path("ckpt_latest.pt")

    def restore(self, path: Path):
        pytest.fail("a stopped run is resumed, not reported from its last checkpoint")


@pytest.mark.parametrize("outcome", ["stopped", "finished"])
def test_a_run_that_ends_healthy_or_is_stopped_reports_its_own_last_weights(tmp_path, outcome):
    guard = skipping_run_that_exploded() if outcome == "stopped" else guard_of(on_nonfinite="skip")
    if outcome == "finished":
        train_step(guard, 1.0)
        end_of_epoch(guard, 1, 0.9)
    summary = report(trainer_of(guard, MustNotLoad()), outcome, tmp_path)
    step = guard.progress.global_step
    assert summary["final_weights"] == f"the weights at the end of training (step {step})"
    assert summary["final"]["weights_trusted"] is True
    assert summary["final"]["val_loss"] == guard.progress.history[-1]["val_loss"]
