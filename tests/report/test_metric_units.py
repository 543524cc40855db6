"""One convention for the units of validation metrics: an error is shown in its channel's physical unit where
the evaluator knows the unit and the standard deviation that normalized it (ERA5's RMSEs), with the unit named;
"normalized" where that is all that is known; skill scores are fractions
(tests/report/test_channel_skill.py)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
import pytest
import torch

from dlscale.config import load_run_config
from dlscale.data.era5.dataset import ERA5Dataset
from dlscale.report.evaluation_report import evaluation_document, metrics_csv
from dlscale.report.figures import loss_curve_figure
from dlscale.scoring.evaluator import EvalSummary
from dlscale.workloads.era5_metrics import ERA5Evaluator

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def history(unit: list | None) -> list[dict]:
    rows = [
        {"global_step": 10 * i, "train_loss": 1.0 / i, "val_loss": 1.1 / i, "headline": "RMSE(u10m)",
         "headline_value": 0.5 / i, "baseline": "persistence", "baseline_loss": 0.3, "baseline_headline": 0.32}
        for i in (1, 2)
    ]  # fmt: skip
    if unit is not None:
        for row in rows:
            row["headline_unit"] = unit
    return rows


def test_the_loss_figures_headline_is_in_its_unit_where_the_rows_say_it():
    metric_axis = loss_curve_figure(history(["m/s", 4.0])).axes[1]
    model, baseline = metric_axis.get_lines()
    assert list(model.get_ydata()) == pytest.approx([2.0, 1.0])
    assert list(baseline.get_ydata()) == pytest.approx([1.28, 1.28])
    assert metric_axis.get_ylabel() == "RMSE(u10m) [m/s]"


def test_the_loss_figure_says_normalized_or_nothing_where_that_is_what_is_known():
    normalized = loss_curve_figure(history(["normalized", 1.0])).axes[1]
    assert normalized.get_ylabel() == "RMSE(u10m) (normalized)"
    assert list(normalized.get_lines()[0].get_ydata()) == pytest.approx([0.5, 0.25])
    older = loss_curve_figure(history(None)).axes[1]  # rows of a run from before the rows said it
    assert older.get_ylabel() == "RMSE(u10m)"


def test_metrics_csv_gives_each_metric_in_its_unit_and_names_it():
    validation = EvalSummary(
        loss=0.2,
        scalars={"RMSE(u10m)": 0.5, "RMSE/u10": 0.5, "RMSE/q": 0.25, "relative": 0.1},
        headline="RMSE(u10m)",
        baseline_name="persistence",
        baseline_scalars={"RMSE(u10m)": 1.0, "RMSE/u10": 1.0, "loss": 0.4},
        units={"RMSE(u10m)": ("m/s", 3.0), "RMSE/u10": ("m/s", 3.0), "RMSE/q": ("normalized", 1.0)},
    )
    document = evaluation_document(validation, {"split": "test"})
    assert document["metrics"]["RMSE/u10"] == 0.5  # the JSON keeps what the loggers and summary.json have
    assert document["units"]["RMSE/u10"] == {"unit": "m/s", "scale": 3.0}
    rows = {row[0]: row[1:] for row in csv.reader(io.StringIO(metrics_csv(document)))}
    assert rows["metric"] == ["value", "baseline", "unit"]
    assert rows["loss"] == ["0.2", "0.4", ""]
    assert rows["RMSE(u10m)"] == ["1.5", "3.0", "m/s"]
    assert rows["RMSE/u10"] == ["1.5", "3.0", "m/s"]
    assert rows["RMSE/q"] == ["0.25", "", "normalized"]
    assert rows["relative"] == ["0.1", "", ""]


def test_the_era5_evaluator_states_each_rmse_in_its_channels_unit(tiny_era5):
    cfg = load_run_config(CONFIGS / "vit_era5.yaml", "tiny", [f"data.root={tiny_era5}"]).data
    dataset = ERA5Dataset(cfg, "valid")
    stds = np.load(Path(cfg.root) / cfg.global_stds_path).reshape(-1)
    evaluator = ERA5Evaluator(dataset)
    inputs, targets = (torch.stack(pair) for pair in zip(dataset[0], dataset[1], strict=True))
    evaluator.update(inputs, targets, targets + 0.25)  # a uniform normalized error of 0.25 everywhere
    summary = evaluator.summary()
    u10 = dataset.channel_names.index("u10")
    unit, scale = summary.units["RMSE/u10"]
    assert unit == "m/s" and scale == pytest.approx(float(stds[u10]))
    assert summary.units["RMSE(u10m)"] == summary.units["RMSE/u10"]
    assert summary.units["RMSE/z500"] == (
        "m^2/s^2",
        pytest.approx(float(stds[dataset.channel_names.index("z500")])),
    )
    assert summary.scalars["RMSE/u10"] == pytest.approx(0.25, rel=1e-5)
    assert f"Val RMSE(u10m)={0.25 * stds[u10]:.3g} m/s (0.2500 normalized)" in summary.lines[0]
