"""The run's metrics CSV files: a row per optimizer step and per epoch, each step once across resumes and
rollbacks; the missing-package error of an optional logger."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import time
from pathlib import Path

import pytest
import torch
from run_configs import tiny_run_config

from dlscale.errors import ConfigError
from dlscale.report import loggers as loggers_module
from dlscale.run.training import train
from dlscale.training.observer import Observer

CONFIG_FILE = Path(__file__).resolve().parents[2] / "configs" / "vit_era5.yaml"
STEPS_PER_EPOCH = 46 // 4


def run_dir(cfg) -> Path:
    return Path(cfg.log.expdir) / cfg.name / cfg.log.run_num


def read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as file:
        return list(csv.DictReader(file))


def steps_of(cfg) -> list[dict[str, str]]:
    return read(run_dir(cfg) / "metrics" / "steps.csv")


def epochs_of(cfg) -> list[dict[str, str]]:
    return read(run_dir(cfg) / "metrics" / "epochs.csv")


def assert_each_step_once(rows: list[dict[str, str]], total: int) -> None:
    assert [int(row["step"]) for row in rows] == list(range(1, total + 1))


class CrashAtStep(Observer):
    """Kills the run without any chance to save, after the metrics of earlier steps were written."""

    def __init__(self, step: int):
        self.step = step
        self.at = 0.0

    def on_step_end(self, trainer, loss) -> None:
        if trainer.progress.global_step == self.step:
            self.at = time.time()
            raise RuntimeError("simulated crash")


class PoisonWeightsOnceAt(Observer):
    """NaN weights before step ``step`` of the first attempt only (a transient blow-up)."""

    def __init__(self, step: int):
        self.step, self.done = step, False

    def on_step_start(self, trainer) -> None:
        if not self.done and trainer.progress.global_step == self.step:
            self.done = True
            with torch.no_grad():
                next(trainer.setup.model.parameters()).fill_(float("nan"))


def test_a_run_writes_a_row_per_step_and_per_epoch(tiny_config):
    cfg = tiny_config()
    assert train(cfg) == 0
    steps = steps_of(cfg)
    assert list(steps[0]) == [
        "step", "epoch", "wall_time", "train_loss", "lr", "samples_per_second", "peak_host_rss_gb",
    ]  # fmt: skip
    assert_each_step_once(steps, 2 * STEPS_PER_EPOCH)
    assert [int(row["epoch"]) for row in steps] == [1] * STEPS_PER_EPOCH + [2] * STEPS_PER_EPOCH
    assert all(
        math.isfinite(float(row["train_loss"])) and float(row["samples_per_second"]) > 0 for row in steps
    )
    wall = [float(row["wall_time"]) for row in steps]
    assert wall == sorted(wall)

    epochs = epochs_of(cfg)
    assert [int(row["step"]) for row in epochs] == [STEPS_PER_EPOCH, 2 * STEPS_PER_EPOCH]
    summary = json.loads((run_dir(cfg) / "summary.json").read_text())
    for row, history in zip(epochs, summary["history"], strict=True):
        assert float(row["Loss/valid"]) == history["val_loss"]
        assert float(row["RMSE(u10m)/valid"]) == history["headline_value"]
        # the steps' losses are the ones the epoch's mean was made of
        epoch_steps = [float(r["train_loss"]) for r in steps if int(r["epoch"]) == history["epoch"]]
        assert sum(epoch_steps) / len(epoch_steps) == pytest.approx(float(row["Loss/train"]), rel=1e-6)
    # the LR column is the schedule's LR of each step; the epoch row's is that of its last step
    assert float(steps[STEPS_PER_EPOCH - 1]["lr"]) == float(epochs[0]["Learning Rate"])

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir(cfg) / "tensorboard")).Reload()
    assert [e.step for e in events.Scalars("Step/train_loss")] == list(range(1, 2 * STEPS_PER_EPOCH + 1))
    assert [e.step for e in events.Scalars("Loss/train")] == [STEPS_PER_EPOCH, 2 * STEPS_PER_EPOCH]


@pytest.mark.slow
def test_a_resumed_run_continues_the_files_with_each_step_once(tiny_era5, tmp_path):
    cfg = tiny_run_config(CONFIG_FILE, tiny_era5, tmp_path / "runs", num_epochs=1)
    train(cfg)
    assert len(steps_of(cfg)) == STEPS_PER_EPOCH
    longer = tiny_run_config(CONFIG_FILE, tiny_era5, tmp_path / "runs", num_epochs=2)
    train(longer)
    assert_each_step_once(steps_of(longer), 2 * STEPS_PER_EPOCH)
    assert [int(row["epoch"]) for row in epochs_of(longer)] == [1, 2]
    lines = (run_dir(cfg) / "metrics" / "steps.csv").read_text().splitlines()
    assert sum(line.startswith("step,") for line in lines) == 1
    assert not (run_dir(cfg) / "tensorboard").exists()  # log.tensorboard: false switches it off


@pytest.mark.slow
def test_a_resume_drops_the_rows_written_after_its_checkpoint(tiny_config):
    cfg = tiny_config()
    crash = CrashAtStep(STEPS_PER_EPOCH + 10)  # after the rows up to step 20 were written; checkpoint at 11
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(cfg, extra_observers=[crash])
    written = [int(row["step"]) for row in steps_of(cfg)]
    assert written[-1] > STEPS_PER_EPOCH  # rows past the checkpoint exist, to be dropped
    train(cfg)
    steps = steps_of(cfg)
    assert_each_step_once(steps, 2 * STEPS_PER_EPOCH)
    # the steps after the checkpoint are the resumed attempt's, not the crashed one's
    assert all(float(row["wall_time"]) > crash.at for row in steps[STEPS_PER_EPOCH:])
    assert all(float(row["wall_time"]) < crash.at for row in steps[:STEPS_PER_EPOCH])
    assert [int(row["step"]) for row in epochs_of(cfg)] == [STEPS_PER_EPOCH, 2 * STEPS_PER_EPOCH]


def test_a_rollback_takes_back_the_rows_of_the_undone_steps(tiny_config):
    cfg = tiny_config("train.on_nonfinite=rollback", "checkpoint.save_every_steps=4")
    assert train(cfg, extra_observers=[PoisonWeightsOnceAt(13)]) == 0
    steps = steps_of(cfg)
    assert_each_step_once(steps, 2 * STEPS_PER_EPOCH)
    assert all(math.isfinite(float(row["train_loss"])) for row in steps)
    # step 13 on was trained again from the checkpoint at step 12, at half the LR
    assert float(steps[12]["lr"]) < 0.6 * float(steps[11]["lr"])


def test_a_missing_logger_package_stops_the_run_before_it_starts(tiny_config, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        loggers_module.importlib.util,
        "find_spec",
        lambda name, *a, **k: None if name == "wandb" else real(name, *a, **k),
    )
    cfg = tiny_config("log.loggers=[tensorboard,wandb]")
    with pytest.raises(ConfigError, match=r"pip install 'dlscale\[wandb\]'"):
        train(cfg)
    metrics = run_dir(cfg) / "metrics"
    assert not (metrics / "steps.csv").exists() and not (run_dir(cfg) / "config.yaml").exists()
