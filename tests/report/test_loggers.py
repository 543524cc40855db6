"""The metric loggers: CSV files that survive a resume, the log.loggers key, optional backends, the loss figure."""

from __future__ import annotations

import errno
import importlib.util
import math
import os

import numpy as np
import pytest
import torch

from dlscale.errors import ConfigError, InvalidValue, StorageError
from dlscale.report import loggers as loggers_module
from dlscale.report.figures import loss_curve_figure, smoothed, spans_decades
from dlscale.report.log_config import LogConfig
from dlscale.report.loggers import CsvLogger, MetricLogger, missing_logger_package, read_csv_columns
from dlscale.report.metrics_observer import StepLosses


def rows(path) -> list[str]:
    return path.read_text().splitlines()


# ------------------------------------------------------------------------------------------------ CSV files


def test_csv_writes_the_header_once_and_a_whole_row_per_call(tmp_path):
    path = tmp_path / "metrics" / "steps.csv"
    logger = CsvLogger(path)
    assert isinstance(logger, MetricLogger)
    logger.log_scalars(1, {"epoch": 1, "train_loss": 0.5, "lr": 1e-3}, 100.0)
    logger.log_scalars(2, {"epoch": 1, "train_loss": float("nan"), "lr": 1e-3}, 101.5)
    # every row is on disk before close: a killed run loses nothing it logged
    assert rows(path) == [
        "step,epoch,wall_time,train_loss,lr",
        "1,1,100.0,0.5,0.001",
        "2,1,101.5,nan,0.001",
    ]
    logger.close()
    columns = read_csv_columns(path)
    assert columns["step"] == [1.0, 2.0] and math.isnan(columns["train_loss"][1])


def test_reopening_at_a_step_drops_later_rows_and_keeps_one_header(tmp_path):
    path = tmp_path / "steps.csv"
    first = CsvLogger(path)
    for step in range(1, 8):
        first.log_scalars(step, {"train_loss": 1.0 / step}, float(step))
    first.close()
    resumed = CsvLogger(path, start_step=4)  # the checkpoint is at step 4
    for step in range(5, 9):
        resumed.log_scalars(step, {"train_loss": 10.0 + step}, 100.0 + step)
    resumed.close()
    lines = rows(path)
    assert lines[0] == "step,wall_time,train_loss" and lines.count(lines[0]) == 1
    steps = [int(line.split(",")[0]) for line in lines[1:]]
    assert steps == list(range(1, 9))
    assert read_csv_columns(path)["train_loss"][4:] == [15.0, 16.0, 17.0, 18.0]  # the resumed attempt's


def test_a_torn_last_line_is_dropped_on_reopening(tmp_path):
    path = tmp_path / "steps.csv"
    path.write_text("step,wall_time,train_loss\n1,1.0,0.5\n2,2.0,0.4\n3,3.0,0.")  # killed mid-write
    logger = CsvLogger(path, start_step=None)
    logger.log_scalars(3, {"train_loss": 0.3}, 3.5)
    logger.close()
    assert rows(path) == ["step,wall_time,train_loss", "1,1.0,0.5", "2,2.0,0.4", "3,3.5,0.3"]


def test_a_new_name_widens_the_header_and_pads_the_earlier_rows(tmp_path):
    path = tmp_path / "epochs.csv"
    logger = CsvLogger(path)
    logger.log_scalars(11, {"epoch": 1, "Loss/valid": 0.9}, 1.0)
    logger.log_scalars(22, {"epoch": 2, "Loss/valid": 0.8, "Performance/MFU": 0.3}, 2.0)
    logger.close()
    assert rows(path) == [
        "step,epoch,wall_time,Loss/valid,Performance/MFU",
        "11,1,1.0,0.9,",
        "22,2,2.0,0.8,0.3",
    ]


def test_rewinding_takes_back_the_rows_after_the_step(tmp_path):
    path = tmp_path / "steps.csv"
    logger = CsvLogger(path)
    for step in (1, 2, 3):
        logger.log_scalars(step, {"train_loss": 1.0}, 0.0)
    logger.rewind(1)
    logger.log_scalars(2, {"train_loss": 2.0}, 0.0)
    logger.close()
    assert rows(path)[1:] == ["1,0.0,1.0", "2,0.0,2.0"]


# ---------------------------------------------------------------------------------------- log.loggers key


class FullDiskFile:
    """A file whose writes fail as a full disk's do: OSError(ENOSPC) naming no file."""

    def __init__(self, real):
        self.real = real

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_a_full_disk_under_the_csv_file_is_one_line_naming_it(tmp_path):
    path = tmp_path / "metrics" / "steps.csv"
    logger = CsvLogger(path)
    logger.log_scalars(1, {"train_loss": 0.5}, 100.0)
    logger._file = FullDiskFile(logger._file)
    with pytest.raises(StorageError) as raised:
        logger.log_scalars(2, {"train_loss": 0.4}, 101.0)
    message = str(raised.value)
    assert (
        message.startswith(f"{path}: cannot write: No space left on device (ENOSPC)") and "\n" not in message
    )
    logger.close()  # the failure was reported once; closing does not raise it again
    assert rows(path) == ["step,wall_time,train_loss", "1,100.0,0.5"]  # the rows written before are kept


def test_the_loggers_key_accepts_the_backends_and_refuses_anything_else():
    assert LogConfig().loggers == ("tensorboard",) and LogConfig().writes_tensorboard
    assert LogConfig(loggers=("csv", "wandb", "mlflow")).writes_tensorboard is False
    assert LogConfig(tensorboard=False).writes_tensorboard is False  # log.tensorboard: false still wins
    with pytest.raises(InvalidValue, match=r"unknown logger 'neptune'; choose from csv, tensorboard, wandb"):
        LogConfig(loggers=("tensorboard", "neptune"))
    with pytest.raises(InvalidValue, match="'wandb' is listed more than once"):
        LogConfig(loggers=("wandb", "tensorboard", "wandb"))


def test_an_unknown_logger_in_a_config_names_the_key(tiny_config):
    with pytest.raises(ConfigError, match=r"loggers.*unknown logger 'tb'"):
        tiny_config("log.loggers=[tb]")
    assert tiny_config("log.loggers=[tensorboard,wandb]").log.loggers == ("tensorboard", "wandb")


def without(*modules: str):
    """importlib.util.find_spec as if ``modules`` were not installed."""
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name in modules else real(name, *args, **kwargs)

    return find_spec


def test_a_missing_package_is_an_error_that_names_the_extra_to_install(monkeypatch):
    monkeypatch.setattr(loggers_module.importlib.util, "find_spec", without("wandb", "mlflow"))
    assert missing_logger_package(["csv", "tensorboard"]) is None
    error = missing_logger_package(["tensorboard", "mlflow"])
    assert isinstance(error, ConfigError)
    assert str(error) == (
        "log.loggers names 'mlflow', but the mlflow package is not installed: pip install 'dlscale[mlflow]' "
        "(or remove 'mlflow' from log.loggers)"
    )
    assert "pip install 'dlscale[wandb]'" in str(missing_logger_package(["wandb"]))


# ------------------------------------------------------------------------------- per-step losses, no sync


def test_step_losses_are_copied_not_referenced():
    buffer, static_output = StepLosses(capacity=4), torch.zeros(())
    for value in (0.5, 0.25, 0.125):  # a CUDA-graph step writes every loss into the same tensor
        static_output.fill_(value)
        buffer.add(static_output)
    assert buffer.read() == [0.5, 0.25, 0.125]
    assert buffer.read() == []
    for _ in range(4):
        buffer.add(torch.tensor(1.0))
    assert buffer.full


# ------------------------------------------------------------------------------------------------ figure


HISTORY = [
    {"global_step": 10 * i, "train_loss": 1.0 / i, "val_loss": 1.1 / i, "headline": "RMSE(u10m)",
     "headline_value": 0.5 / i, "baseline": "persistence", "baseline_loss": 0.3, "baseline_headline": 0.32}
    for i in (1, 2, 3)
]  # fmt: skip


def test_the_loss_figure_draws_every_step_and_each_epochs_validation():
    steps = list(range(1, 31))
    losses = [1.0 / step**0.5 for step in steps]
    losses[7] = float("inf")  # a skipped step: a gap, not a broken axis
    figure = loss_curve_figure(HISTORY, "t", (steps, losses), loss_name="relative L2 error")
    loss_axis = figure.axes[0]
    lines = {line.get_label(): line for line in loss_axis.get_lines()}
    assert list(lines) == [
        "train loss (per step)",
        "train loss (smoothed)",
        "validation loss",
        "persistence (validation)",
    ]
    per_step = lines["train loss (per step)"]
    assert list(per_step.get_xdata()) == steps and len(per_step.get_ydata()) == 30
    assert math.isnan(per_step.get_ydata()[7])
    assert list(lines["validation loss"].get_xdata()) == [10, 20, 30]
    assert loss_axis.get_xlabel() == "optimizer step"
    assert loss_axis.get_ylabel() == "loss (relative L2 error)"
    assert loss_axis.get_yscale() == "linear"  # 0.18 .. 1.1: within a decade


def test_the_loss_axis_is_logarithmic_when_the_losses_span_decades():
    steps = list(range(1, 101))
    figure = loss_curve_figure(HISTORY, step_losses=(steps, [10.0 * 0.9**s for s in steps]))
    assert figure.axes[0].get_yscale() == "log"
    assert figure.axes[0].get_ylabel() == "loss"
    assert spans_decades([0.01, 1.0]) and not spans_decades([0.2, 1.0]) and not spans_decades([-1.0, 100.0])


def test_without_step_losses_the_figure_shows_the_epoch_means():
    loss_axis = loss_curve_figure(HISTORY).axes[0]
    assert [line.get_label() for line in loss_axis.get_lines()][0] == "train loss"


def test_smoothing_follows_a_constant_and_keeps_gaps():
    values = np.array([2.0, 2.0, np.nan, 2.0, 2.0])
    out = smoothed(values)
    assert np.isnan(out[2]) and np.allclose(out[[0, 1, 3, 4]], 2.0)
