"""ckpt_best.pt holds the epoch with the lowest validation loss, and summary.json names that same epoch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_training_run import assert_bitwise_equal, run_dir

from dlscale.checkpoint.files import load_checkpoint
from dlscale.run.training import train
from dlscale.training.observer import Observer


class SpoilWeightsFrom(Observer):
    """From epoch ``first_spoiled`` (1-based) on, shifts every weight by a constant before the epoch trains.

    Eleven small Adam steps cannot undo a shift of every weight, so each spoiled epoch validates far worse
    than the last unspoiled one: the best epoch is ``first_spoiled - 1`` by construction, not by luck.
    """

    def __init__(self, first_spoiled: int, shift: float = 0.5):
        self.first_spoiled, self.shift = first_spoiled, shift

    def on_epoch_start(self, trainer) -> None:
        if trainer.progress.epoch + 1 >= self.first_spoiled:
            with torch.no_grad():
                for parameter in trainer.setup.model.parameters():
                    parameter.add_(self.shift)


class KeepWeightsAfterEachEpoch(Observer):
    """A copy of the model's weights at the end of every epoch, by 1-based epoch."""

    def __init__(self):
        self.weights: dict[int, dict[str, torch.Tensor]] = {}

    def on_epoch_end(self, trainer, report) -> None:
        state = trainer.setup.model.state_dict()
        self.weights[report.epoch] = {k: v.detach().clone() for k, v in state.items()}


def summary_of(cfg) -> dict:
    return json.loads((run_dir(cfg) / "summary.json").read_text())


def checkpoints_of(cfg) -> tuple[Path, Path]:
    directory = run_dir(cfg) / "checkpoints"
    return directory / "ckpt_best.pt", directory / "ckpt_latest.pt"


def assert_best_is_the_lowest_val_loss(summary: dict) -> dict:
    """summary["best"] names the history row with the lowest val_loss; returns that row."""
    history = summary["history"]
    lowest = min(history, key=lambda row: row["val_loss"])
    assert summary["best"] == {"epoch": lowest["epoch"], "val_loss": lowest["val_loss"]}
    return lowest


@pytest.mark.slow
def test_the_best_checkpoint_keeps_an_earlier_epoch_when_later_ones_validate_worse(tiny_config):
    epochs, first_spoiled = 4, 3
    cfg = tiny_config(num_epochs=epochs)
    kept = KeepWeightsAfterEachEpoch()
    assert train(cfg, extra_observers=[SpoilWeightsFrom(first_spoiled), kept]) == 0

    summary = summary_of(cfg)
    assert [row["epoch"] for row in summary["history"]] == list(range(1, epochs + 1))
    best_row = assert_best_is_the_lowest_val_loss(summary)
    assert best_row["epoch"] == first_spoiled - 1

    best_path, latest_path = checkpoints_of(cfg)
    best, latest = load_checkpoint(best_path), load_checkpoint(latest_path)
    # The best checkpoint is the position right after its epoch, not the run's last one.
    assert best["progress"]["epoch"] == best_row["epoch"]
    assert best["progress"]["global_step"] == best_row["global_step"]
    assert best["progress"]["best_epoch"] == best_row["epoch"]
    assert best["progress"]["best_val_loss"] == best_row["val_loss"]
    assert [row["epoch"] for row in best["progress"]["history"]] == list(range(1, best_row["epoch"] + 1))
    assert latest["progress"]["epoch"] == epochs and latest["progress"]["completed"]
    # ... and holds that epoch's weights, which the spoiled later epochs changed.
    assert_bitwise_equal(kept.weights[best_row["epoch"]], best["model"], "best model")
    assert_bitwise_equal(kept.weights[epochs], latest["model"], "latest model")
    assert any(not torch.equal(best["model"][k], latest["model"][k]) for k in latest["model"])


def test_when_the_last_epoch_is_best_the_best_checkpoint_is_the_latest(tiny_config):
    cfg = tiny_config()
    assert train(cfg) == 0
    summary = summary_of(cfg)
    best_row = assert_best_is_the_lowest_val_loss(summary)
    last_row = summary["history"][-1]
    # A precondition, not the behaviour under test: the tiny run still improves in its second epoch.
    assert best_row is last_row, [row["val_loss"] for row in summary["history"]]

    best_path, latest_path = checkpoints_of(cfg)
    assert best_path.read_bytes() == latest_path.read_bytes()
    progress = load_checkpoint(best_path)["progress"]
    assert (progress["epoch"], progress["global_step"]) == (last_row["epoch"], last_row["global_step"])
    assert progress["completed"]
