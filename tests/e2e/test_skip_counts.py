"""``train.on_nonfinite=skip`` counts its skipped steps right: each epoch's average train loss leaves out that
epoch's skipped steps only, and ``train.max_skipped_steps`` is the most skips a run may make, not one fewer."""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path

import pytest
from nan_data import NAN_TIME, copy_with_nan
from test_divergence import run_dir, steps_with_samples, strict_json

from dlscale.errors import TrainingDiverged
from dlscale.run.training import train

# The samples whose input or target is the NaN time step of the poisoned training file (see test_divergence).
NAN_SAMPLES = {NAN_TIME - 1, NAN_TIME}


@pytest.fixture(scope="module")
def nan_era5(tmp_path_factory, tiny_era5: Path) -> Path:
    """The tiny data set with NaN at time step NAN_TIME of the first training file, as test_divergence makes it."""
    return copy_with_nan(tiny_era5, tmp_path_factory.mktemp("nan_data") / "era5")


def step_losses_by_epoch(cfg) -> dict[int, list[float]]:
    """Every step's logged loss (NaN for a skipped step), by 1-based epoch, from the run's steps.csv."""
    losses: dict[int, list[float]] = defaultdict(list)
    with (run_dir(cfg) / "metrics" / "steps.csv").open(newline="") as file:
        for row in csv.DictReader(file):
            losses[int(row["epoch"])].append(float(row["train_loss"] or "nan"))
    return losses


def skipped_steps_per_epoch(cfg, epochs: int) -> list[int]:
    """How many steps of each epoch hold a NaN sample, per the run's sampler (so are skipped under skip)."""
    steps_per_epoch = 46 // cfg.train.global_batch_size  # the tiny data set's 46 training samples
    bad_steps = steps_with_samples(cfg, NAN_SAMPLES, epochs)
    return [sum(1 for step in bad_steps if step // steps_per_epoch == epoch) for epoch in range(epochs)]


@pytest.mark.slow
def test_each_epochs_train_loss_is_the_mean_of_its_own_unskipped_steps(tiny_config, nan_era5):
    cfg = tiny_config(f"data.root={nan_era5}", "train.on_nonfinite=skip", "train.num_epochs=2")
    skipped = skipped_steps_per_epoch(cfg, 2)
    # Skips in the first epoch are what a count carried over into the second would wrongly subtract again.
    assert skipped[0] > 0
    assert train(cfg) == 0

    history = strict_json(run_dir(cfg) / "summary.json")["history"]
    losses = step_losses_by_epoch(cfg)
    assert sorted(losses) == [1, 2]
    for epoch, row in enumerate(history, start=1):
        kept = [loss for loss in losses[epoch] if math.isfinite(loss)]
        assert len(losses[epoch]) - len(kept) == skipped[epoch - 1]
        assert row["train_loss"] == pytest.approx(sum(kept) / len(kept), rel=1e-6), f"epoch {epoch}"


def test_a_run_may_skip_exactly_max_skipped_steps(tiny_config, nan_era5):
    probe = tiny_config(f"data.root={nan_era5}", "train.num_epochs=1")
    limit = skipped_steps_per_epoch(probe, 1)[0]
    assert limit >= 1  # a limit of 0 is the existing test's case: this one needs skips to count
    cfg = tiny_config(
        f"data.root={nan_era5}",
        "train.on_nonfinite=skip",
        "train.num_epochs=1",
        f"train.max_skipped_steps={limit}",
    )
    assert train(cfg) == 0
    summary = strict_json(run_dir(cfg) / "summary.json")
    assert summary["outcome"] == "finished" and summary["skipped_steps"] == limit


def test_one_skip_more_than_max_skipped_steps_diverges_at_that_step(tiny_config, nan_era5):
    probe = tiny_config(f"data.root={nan_era5}", "train.num_epochs=2")
    bad_steps = steps_with_samples(probe, NAN_SAMPLES, 2)
    limit = skipped_steps_per_epoch(probe, 1)[0]
    assert 1 <= limit < len(bad_steps)  # the second epoch brings the skip past the limit
    cfg = tiny_config(
        f"data.root={nan_era5}",
        "train.on_nonfinite=skip",
        "train.num_epochs=2",
        f"train.max_skipped_steps={limit}",
    )
    with pytest.raises(
        TrainingDiverged,
        match=rf"at step {bad_steps[limit]}: {limit + 1} updates skipped .* more than {limit} "
        r"\(train.max_skipped_steps\)",
    ):
        train(cfg)
    summary = strict_json(run_dir(cfg) / "summary.json")
    assert summary["outcome"] == "diverged" and summary["skipped_steps"] == limit + 1
