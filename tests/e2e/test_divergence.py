"""A diverging run never destroys its good work: the policies stop, skip and rollback, and the data check."""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
from pathlib import Path

import h5py
import pytest
import torch
from nan_data import NAN_TIME, copy_with_nan

from dlscale.checkpoint.directory import CheckpointDir
from dlscale.checkpoint.files import load_checkpoint
from dlscale.errors import DataError, TrainingDiverged
from dlscale.run.training import train
from dlscale.training.observer import Observer


def run_dir(cfg) -> Path:
    return Path(cfg.log.expdir) / cfg.name / cfg.log.run_num


def digests(directory: Path) -> dict[str, str]:
    """sha256 of every checkpoint file in ``directory``."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.glob("*.pt"))}


def strict_json(path: Path) -> dict:
    """The file parsed as strict JSON (NaN and Infinity are errors, as in jq or JavaScript)."""

    def refuse(token: str) -> None:
        raise ValueError(f"{path}: non-standard JSON token {token}")

    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.fixture(scope="module")
def nan_era5(tmp_path_factory, tiny_era5: Path) -> Path:
    """The tiny data set with NaN at one time step of the first training file."""
    return copy_with_nan(tiny_era5, tmp_path_factory.mktemp("nan_data") / "era5")


@pytest.fixture(scope="module")
def nan_valid_era5(tmp_path_factory, tiny_era5: Path) -> Path:
    """The tiny data set with NaN in the validation file (training is clean)."""
    root = tmp_path_factory.mktemp("nan_valid") / "era5"
    shutil.copytree(tiny_era5, root)
    for path in (root / "valid").glob("*.h5"):
        with h5py.File(path, "r+") as f:
            f["fields"][1, 2, 0, 0] = float("inf")
    return root


def steps_with_samples(cfg, samples: set[int], epochs: int) -> list[int]:
    """The global steps (0-based) whose global batch holds one of ``samples``, per the run's sampler."""
    from dlscale.data.loading.sampler import TrainingSampler

    sampler = TrainingSampler(
        46, cfg.train.global_batch_size, shuffle=cfg.loader.shuffle, seed=cfg.train.seed
    )
    steps, batch = [], cfg.train.global_batch_size
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        order = list(sampler)
        for step in range(sampler.steps_per_epoch):
            if samples & set(order[step * batch : (step + 1) * batch]):
                steps.append(epoch * sampler.steps_per_epoch + step)
    return steps


class PoisonOptimizerAt(Observer):
    """After step ``step`` (1-based count), put NaN into Adam's second moment: the next step's loss is still
    finite, but its update makes the weights NaN, so only a check of the saved state can catch it."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, trainer, loss) -> None:
        if trainer.progress.global_step == self.step:
            for state in trainer.setup.optimizer.state.values():
                state["exp_avg_sq"].fill_(float("nan"))


class PoisonWeightsOnceAt(Observer):
    """Make the weights NaN before step ``step`` of the first attempt only (a transient blow-up)."""

    def __init__(self, step: int):
        self.step = step
        self.done = False

    def on_step_start(self, trainer) -> None:
        if not self.done and trainer.progress.global_step == self.step:
            self.done = True
            with torch.no_grad():
                next(trainer.setup.model.parameters()).fill_(float("nan"))


@pytest.mark.slow
def test_nan_data_stops_the_run_and_leaves_the_good_checkpoint_bitwise(tiny_config, nan_era5, tmp_path):
    good = tiny_config("train.num_epochs=1")
    train(good)
    checkpoints = run_dir(good) / "checkpoints"
    before = digests(checkpoints)
    assert set(before) == {"ckpt_latest.pt", "ckpt_best.pt"}

    more_with_nan = tiny_config("train.num_epochs=2", f"data.root={nan_era5}")
    with pytest.raises(TrainingDiverged) as raised:
        train(more_with_nan)
    bad_steps = [s for s in steps_with_samples(good, {NAN_TIME - 1, NAN_TIME}, 2) if s >= 11]
    message = str(raised.value)
    assert f"at step {bad_steps[0]}: the loss is nan" in message
    assert str(checkpoints / "ckpt_latest.pt") in message and "data.check_finite" in message
    assert raised.value.exit_code == 3
    assert digests(checkpoints) == before
    summary = strict_json(run_dir(good) / "summary.json")
    assert summary["outcome"] == "diverged"
    assert summary["divergence"]["step"] == bad_steps[0]
    assert summary["divergence"]["loss"] is None  # NaN is written as null
    assert summary["best"]["epoch"] == 1


@pytest.mark.slow
def test_resuming_a_good_run_with_a_huge_lr_keeps_its_checkpoints_bitwise(tiny_config):
    good = tiny_config("train.num_epochs=1")
    train(good)
    checkpoints = run_dir(good) / "checkpoints"
    before = digests(checkpoints)
    with pytest.raises(TrainingDiverged, match=r"at step 1[1-9]: "):
        train(tiny_config("train.num_epochs=2", "optim.lr=1e6"))
    assert digests(checkpoints) == before
    assert strict_json(run_dir(good) / "summary.json")["outcome"] == "diverged"


def test_a_huge_learning_rate_diverges_without_saving_and_says_what_to_try(tiny_config):
    cfg = tiny_config("optim.lr=1e6", "checkpoint.save_every_steps=2")
    with pytest.raises(
        TrainingDiverged,
        match=r"at step \d+: .* at scheduled lr .*lower learning rate.*"
        r"optim.lr=2.5e\+05, a quarter of optim.lr 1e\+06",
    ):
        train(cfg)
    assert not list((run_dir(cfg) / "checkpoints").glob("*.pt"))
    assert "No checkpoint had been saved yet" in (run_dir(cfg) / "out.log").read_text()


@pytest.mark.parametrize("checkpoint_format", ["file", "dcp"])
def test_nonfinite_weights_are_never_saved_even_with_finite_losses(tiny_config, checkpoint_format):
    cfg = tiny_config("checkpoint.save_every_steps=4", f"checkpoint.format={checkpoint_format}")
    with pytest.raises(TrainingDiverged, match=r"weights hold NaN or infinite values \(.*model(\['|\.)"):
        train(cfg, extra_observers=[PoisonOptimizerAt(7)])
    state = load_checkpoint(CheckpointDir(run_dir(cfg) / "checkpoints").latest_path)
    assert state["progress"]["global_step"] == 4
    assert all(torch.isfinite(t).all() for t in state["model"].values())


@pytest.mark.slow
def test_skip_leaves_out_the_updates_of_nan_batches_and_counts_them(tiny_config, nan_era5):
    cfg = tiny_config(f"data.root={nan_era5}", "train.on_nonfinite=skip")
    assert train(cfg) == 0
    expected = steps_with_samples(cfg, {NAN_TIME - 1, NAN_TIME}, 2)
    summary = strict_json(run_dir(cfg) / "summary.json")
    assert summary["outcome"] == "finished"
    assert summary["skipped_steps"] == len(expected) > 0
    assert all(math.isfinite(row["train_loss"]) for row in summary["history"])
    state = load_checkpoint(run_dir(cfg) / "checkpoints" / "ckpt_latest.pt")
    assert all(torch.isfinite(t).all() for t in state["model"].values())
    log = (run_dir(cfg) / "out.log").read_text()
    assert (
        f"Step {expected[0]}: the loss is nan: update skipped" in log
        and "update skipped (1 of at most 10" in log
    )


def test_skip_has_a_limit(tiny_config, nan_era5):
    cfg = tiny_config(f"data.root={nan_era5}", "train.on_nonfinite=skip", "train.max_skipped_steps=0")
    with pytest.raises(
        TrainingDiverged, match=r"1 updates skipped .* more than 0 \(train.max_skipped_steps\)"
    ):
        train(cfg)


# A background save of step 12 may still be in flight at the blow-up: the rollback waits for it.
@pytest.mark.slow
@pytest.mark.parametrize("checkpoint", [(), ("checkpoint.async_save=true",)], ids=["file", "dcp-async"])
def test_rollback_recovers_from_a_transient_blow_up_with_a_lower_lr(tiny_config, checkpoint):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = tiny_config("train.on_nonfinite=rollback", "checkpoint.save_every_steps=4", *checkpoint)
    assert train(cfg, extra_observers=[PoisonWeightsOnceAt(13)]) == 0
    summary = strict_json(run_dir(cfg) / "summary.json")
    assert summary["outcome"] == "finished" and summary["rollbacks"] == 1
    state = load_checkpoint(CheckpointDir(run_dir(cfg) / "checkpoints").latest_path)
    assert state["scheduler"]["scale"] == 0.5 and state["progress"]["rollbacks"] == 1
    assert all(torch.isfinite(t).all() for t in state["model"].values())
    log = (run_dir(cfg) / "out.log").read_text()
    assert "Rolled back to" in log and "(global step 12)" in log
    events = EventAccumulator(str(run_dir(cfg) / "tensorboard")).Reload()
    assert [e.step for e in events.Scalars("Loss/valid")] == [11, 22]


class PoisonWeightsAtEachAttempt(Observer):
    """Make the weights NaN once per attempt, one step later after each rollback (a blow-up that a lower LR
    does not cure, at another batch each time)."""

    def __init__(self, first_step: int):
        self.step, self.poisoned = first_step, False

    def on_step_start(self, trainer) -> None:
        if not self.poisoned and trainer.progress.global_step == self.step:
            self.poisoned = True
            with torch.no_grad():
                next(trainer.setup.model.parameters()).fill_(float("nan"))

    def on_rollback(self, trainer, divergence) -> None:
        self.step, self.poisoned = self.step + 1, False


def test_rollback_starts_from_a_checkpoint_and_gives_up_after_its_limit(tiny_config):
    cfg = tiny_config("train.on_nonfinite=rollback", "train.max_rollbacks=2")
    with pytest.raises(TrainingDiverged, match=r"after 2 rollbacks \(train.max_rollbacks 2\)") as raised:
        train(cfg, extra_observers=[PoisonWeightsAtEachAttempt(3)])
    state = load_checkpoint(run_dir(cfg) / "checkpoints" / "ckpt_latest.pt")
    assert state["progress"]["global_step"] == 0  # the initial weights, saved so that a rollback has a target
    assert all(torch.isfinite(t).all() for t in state["model"].values())
    # The advice starts from the LR that diverged last (scaled twice by 0.5), never above it.
    message = str(raised.value)
    tried = cfg.optim.lr * 0.25
    lowered = f"optim.lr {cfg.optim.lr:.3g} lowered by the rollbacks to {tried:.3g}"
    assert f"--set optim.lr={tried / 4:.3g}, a quarter of {lowered}" in message
    assert message.index("lower learning rate") < message.index("data.check_finite")


def test_rollback_does_not_retry_a_batch_that_diverged_twice_and_points_at_the_data(tiny_config, nan_era5):
    cfg = tiny_config(f"data.root={nan_era5}", "train.on_nonfinite=rollback", "train.max_rollbacks=3")
    with pytest.raises(TrainingDiverged) as raised:
        train(cfg)
    first_bad = steps_with_samples(cfg, {NAN_TIME - 1, NAN_TIME}, 2)[0]
    message = str(raised.value)
    assert f"the same batch (step {first_bad}) diverged again after a rollback" in message
    assert message.index("Check the data first: --set data.check_finite=true") < message.index(
        "learning rate"
    )
    summary = strict_json(run_dir(cfg) / "summary.json")
    assert summary["rollbacks"] == 1  # the second failure of that batch spends no second rollback
    assert summary["divergence"]["suspect_data"] is True


class LossesSeen(Observer):
    def __init__(self):
        self.losses: list[float] = []

    def on_step_end(self, trainer, loss) -> None:
        self.losses.append(float(loss))


def test_a_finite_explosion_stops_the_run_before_any_save(tiny_config):
    # lr 1e6: the second step's loss is finite but about 1e12 (NaN comes steps later); the save due after it
    # must not happen, in the default policy.
    cfg = tiny_config("optim.lr=1e6", "checkpoint.save_every_steps=2")
    seen = LossesSeen()
    with pytest.raises(TrainingDiverged, match=r"at step 1: the loss \S+ is more than 100x the median"):
        train(cfg, extra_observers=[seen])
    assert math.isfinite(seen.losses[1]) and seen.losses[1] > 100 * seen.losses[0]
    assert not list((run_dir(cfg) / "checkpoints").glob("*.pt"))


def test_the_spike_check_can_be_switched_off(tiny_config):
    cfg = tiny_config("optim.lr=1e6", "checkpoint.save_every_steps=2", "train.loss_spike_factor=0")
    with pytest.raises(TrainingDiverged) as raised:
        train(cfg)
    assert "more than 100x" not in str(raised.value)
    assert raised.value.exit_code == 3


@pytest.mark.slow
def test_skip_never_saves_the_exploded_weights_over_the_good_checkpoint(tiny_config):
    # The case: a good run resumed with a huge LR under skip. Its first step is finite but throws the
    # weights out; every later step spikes or is NaN and is skipped (10 by the end of epoch 2, within the limit);
    # epoch 2's save must not go ahead, and epoch 3's first step goes over the limit.
    good = tiny_config("train.num_epochs=1")
    train(good)
    checkpoints = run_dir(good) / "checkpoints"
    before = digests(checkpoints)
    more = tiny_config("train.num_epochs=3", "optim.lr=1e5", "train.on_nonfinite=skip")
    with pytest.raises(TrainingDiverged) as raised:
        train(more)
    assert digests(checkpoints) == before
    assert str(checkpoints / "ckpt_latest.pt") in str(raised.value)
    log = (run_dir(good) / "out.log").read_text()
    assert "update skipped (10 of at most 10" in log and "update skipped (11 of at most 10" in log
    assert "Checkpoint at step 22 not written: 0 of the 1 normal steps" in log  # epoch 2's save, held back
    # Each skip says which rule fired: the losses are finite spikes (their gradients overflow as well).
    assert re.search(r"Step 12: the loss \S+ is more than 100x the median \S+ of the losses before it", log)
    # The report describes the weights the run leaves behind: the checkpoint of step 11 validated again, not
    # epoch 2's exploded weights (kept in the history, and never the best).
    summary = strict_json(run_dir(good) / "summary.json")
    epoch_1, epoch_2 = summary["history"]
    assert epoch_2["val_loss"] > 1e6 * epoch_1["val_loss"]
    assert summary["final_weights"].startswith(f"{checkpoints / 'ckpt_latest.pt'} (step 11, the last good")
    final = summary["final"]
    assert (final["epoch"], final["global_step"], final["weights_trusted"]) == (1, 11, True)
    assert final["val_loss"] == pytest.approx(epoch_1["val_loss"], rel=1e-6)
    assert final["metrics"][final["headline"]] == pytest.approx(epoch_1["headline_value"], rel=1e-6)
    assert summary["best"]["epoch"] == 1
    assert f"Final validation, of {checkpoints / 'ckpt_latest.pt'} (step 11" in log
    assert log.count("resuming with a changed config") == 1  # the final validation's load does not repeat it


def test_a_skipping_run_that_reaches_its_end_on_exploded_weights_flags_its_report(tiny_config):
    # A fresh run: its first update throws the weights out, and the 10 steps after it are skipped, within the
    # limit, so the run "finishes" on weights never saved, with no checkpoint before them to report instead.
    cfg = tiny_config("train.num_epochs=1", "optim.lr=1e5", "train.on_nonfinite=skip")
    assert train(cfg) == 0
    summary = strict_json(run_dir(cfg) / "summary.json")
    assert (summary["outcome"], summary["skipped_steps"]) == ("finished", 10)
    assert not list((run_dir(cfg) / "checkpoints").glob("*.pt"))
    (epoch_1,) = summary["history"]
    final = summary["final"]
    assert final["weights_trusted"] is False and final["val_loss"] == epoch_1["val_loss"] > 1e6
    assert summary["final_weights"].startswith(
        "epoch 1's weights at step 11, which the divergence guard distrusts"
    )
    assert summary["best"] == {"epoch": None, "val_loss": None}  # exploded weights are never the best
    assert "Final validation, of epoch 1's weights at step 11" in (run_dir(cfg) / "out.log").read_text()


@pytest.mark.slow
def test_skip_saves_again_once_the_run_is_healthy(tiny_config, nan_era5):
    # NaN data skips one or two steps; the run goes on healthy and its later checkpoints are written.
    cfg = tiny_config(
        f"data.root={nan_era5}",
        "train.on_nonfinite=skip",
        "checkpoint.save_every_steps=1",
        "train.healthy_steps_before_save=3",
    )
    assert train(cfg) == 0
    skipped = steps_with_samples(cfg, {NAN_TIME - 1, NAN_TIME}, 2)
    log = (run_dir(cfg) / "out.log").read_text()
    held = [int(m) for m in re.findall(r"Checkpoint at step (\d+) not written", log)]
    saved = [int(m) for m in re.findall(r"Saved checkpoint \S+ at step (\d+)", log)]
    for step in held:  # held back only within 3 healthy steps after a skipped one
        assert any(0 < step - s <= 3 for s in skipped), (step, skipped)
    assert held and max(saved) == 22
    state = load_checkpoint(run_dir(cfg) / "checkpoints" / "ckpt_latest.pt")
    assert state["progress"]["global_step"] == 22


def test_a_nan_validation_loss_is_never_the_best(tiny_config, nan_valid_era5):
    cfg = tiny_config(f"data.root={nan_valid_era5}")
    assert train(cfg) == 0
    summary = strict_json(run_dir(cfg) / "summary.json")
    assert summary["best"] == {"epoch": None, "val_loss": None}
    assert [row["val_loss"] for row in summary["history"]] == [None, None]
    assert not (run_dir(cfg) / "checkpoints" / "ckpt_best.pt").exists()
    assert "the validation loss is nan although training is finite" in (run_dir(cfg) / "out.log").read_text()


def test_the_data_check_names_the_file_and_the_sample(tiny_config, nan_era5):
    cfg = tiny_config(f"data.root={nan_era5}", "data.check_finite=true")
    first_file = sorted((nan_era5 / "train").glob("*.h5"))[0]
    with pytest.raises(DataError) as raised:
        train(cfg)
    message = str(raised.value)
    assert f"file {first_file}" in message
    assert re.search(rf"sample ({NAN_TIME - 1}|{NAN_TIME}) ", message)
    assert "NaN" in message and "channel 0" in message


def test_the_data_check_also_reads_the_validation_set(tiny_config, nan_valid_era5):
    cfg = tiny_config(f"data.root={nan_valid_era5}", "data.check_finite=true")
    with pytest.raises(DataError, match=r"the validation (inputs|targets) of sample [01] .*\+inf"):
        train(cfg)


class PositionAtEnd(Observer):
    """Keeps the run's position and outcome when it ends."""

    def on_train_end(self, trainer, outcome: str) -> None:
        self.global_step, self.outcome = trainer.progress.global_step, outcome


def test_the_run_stops_within_the_check_interval_even_without_checkpoints(tiny_config, nan_era5):
    cfg = tiny_config(f"data.root={nan_era5}", "checkpoint.enabled=false", "train.nonfinite_check_every=2")
    end = PositionAtEnd()
    with pytest.raises(TrainingDiverged, match="Checkpoints are disabled"):
        train(cfg, extra_observers=[end])
    first_bad = steps_with_samples(cfg, {NAN_TIME - 1, NAN_TIME}, 2)[0]
    assert end.outcome == "diverged"
    assert first_bad < end.global_step <= first_bad + 2
    if first_bad + 2 < 11:  # it stopped inside epoch 1: that epoch was never validated
        assert "Time taken for epoch 1" not in (run_dir(cfg) / "out.log").read_text()


@pytest.mark.slow
def test_before_its_first_save_a_resumed_run_rolls_back_to_the_checkpoint_it_came_from(tiny_config, tmp_path):
    from test_training_run import StopAtStep

    first = tiny_config(expdir=tmp_path / "first")
    train(first, extra_observers=[StopAtStep(5)])
    source = run_dir(first) / "checkpoints" / "ckpt_latest.pt"
    second = tiny_config(
        "train.on_nonfinite=rollback", expdir=tmp_path / "second", **{"checkpoint.resume": str(source)}
    )
    assert train(second, extra_observers=[PoisonWeightsOnceAt(8)]) == 0
    assert f"Rolled back to {source} (global step 5)" in (run_dir(second) / "out.log").read_text()
    assert strict_json(run_dir(second) / "summary.json")["rollbacks"] == 1


@pytest.mark.slow
def test_a_weights_only_start_rolls_back_to_its_own_first_checkpoint(tiny_config, tmp_path):
    source_cfg = tiny_config("train.num_epochs=1", expdir=tmp_path / "source")
    train(source_cfg)
    source = run_dir(source_cfg) / "checkpoints" / "ckpt_latest.pt"
    tuned = tiny_config(
        "train.on_nonfinite=rollback",
        "train.num_epochs=1",
        expdir=tmp_path / "tuned",
        **{"checkpoint.resume": str(source), "checkpoint.resume_weights_only": True},
    )
    assert train(tuned, extra_observers=[PoisonWeightsOnceAt(3)]) == 0
    own = run_dir(tuned) / "checkpoints" / "ckpt_latest.pt"
    assert f"Rolled back to {own} (global step 0)" in (run_dir(tuned) / "out.log").read_text()
    state = load_checkpoint(own)
    assert state["progress"]["global_step"] == 11 and state["progress"]["rollbacks"] == 1
    assert all(torch.isfinite(t).all() for t in state["optimizer"]["state"][0].values())
