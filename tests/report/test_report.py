"""Reporting pieces: progress display, figures, the run summary's throughput."""

from __future__ import annotations

import io
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dlscale.report.figures import figure_to_rgb, loss_curve_figure, prediction_figure, save_png
from dlscale.report.progress_display import ProgressReporter, choose_progress_mode, format_duration
from dlscale.report.summary import mean_throughput
from dlscale.scoring.evaluator import ExampleImage
from dlscale.training.schedule import EpochPlan
from dlscale.training.train_progress import TrainProgress


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def fake_trainer(epoch: int = 0, step_in_epoch: int = 0, global_step: int = 0) -> SimpleNamespace:
    plan = EpochPlan(steps_per_epoch=10, num_epochs=3, total_steps=30, explanation="")
    setup = SimpleNamespace(plan=plan, global_batch_size=4)
    progress = TrainProgress(epoch=epoch, step_in_epoch=step_in_epoch, global_step=global_step)
    return SimpleNamespace(setup=setup, progress=progress)


def test_auto_progress_is_a_bar_on_a_terminal_and_lines_in_a_log_file():
    assert choose_progress_mode("auto", FakeTerminal()) == "bar"
    assert choose_progress_mode("auto", io.StringIO()) == "lines"
    assert choose_progress_mode("none", FakeTerminal()) == "none"


@pytest.mark.parametrize(("seconds", "text"), [(6.4, "6s"), (245, "4m05s"), (3723, "1h02m03s"), (-1, "0s")])
def test_durations_read_like_a_clock(seconds, text):
    assert format_duration(seconds) == text


def test_status_line_reports_position_rate_and_eta():
    reporter = ProgressReporter("lines")
    trainer = fake_trainer()
    reporter.on_train_start(trainer)
    trainer.progress.epoch, trainer.progress.step_in_epoch, trainer.progress.global_step = 1, 5, 15
    line = reporter.status_line(trainer, loss=0.25, now=reporter._started + 30.0)
    # 15 steps in 30 s = 0.5 steps/s = 2 samples/s; 15 steps left = 30 s.
    assert line == ("epoch 2/3, step 5/10 (50%), loss 0.2500, 2 samples/s overall, run 50% done, ETA 30s")


def test_lines_mode_prints_at_most_one_line_per_interval(caplog):
    reporter = ProgressReporter("lines", interval_s=3600)
    trainer = fake_trainer()
    reporter.on_train_start(trainer)
    with caplog.at_level("INFO", logger="dlscale.train"):
        for _ in range(5):
            trainer.progress.global_step += 1
            reporter.on_step_end(trainer, torch.tensor(0.5))
        assert not caplog.records
        reporter._last_line -= 3600
        reporter.on_step_end(trainer, torch.tensor(0.5))
    assert len(caplog.records) == 1 and "loss 0.5000" in caplog.records[0].getMessage()


def test_bar_mode_draws_on_the_stream_and_closes_at_epoch_end():
    terminal = FakeTerminal()
    reporter = ProgressReporter("bar", stream=terminal)
    trainer = fake_trainer(step_in_epoch=3)  # a resumed epoch starts the bar at its position
    reporter.on_train_start(trainer)
    reporter.on_epoch_start(trainer)
    assert reporter.bar.n == 3 and reporter.bar.total == 10
    for _ in range(7):
        reporter.on_step_end(trainer, torch.tensor(0.5))
    assert reporter.bar.n == 10
    reporter.on_epoch_end(trainer, report=None)
    assert reporter.bar is None
    assert "epoch 1/3" in terminal.getvalue()


def test_prediction_figure_has_a_panel_per_field_and_renders(tmp_path):
    field = np.linspace(0, 1, 32 * 64).reshape(32, 64)
    example = ExampleImage("t2m", field, field + 0.1, baseline=field - 0.2, baseline_name="persistence")
    figure = prediction_figure(example, "title")
    assert [a.get_title() for a in figure.axes if a.get_title()] == [
        "t2m: prediction",
        "t2m: target",
        "t2m: prediction - target",
        "t2m: persistence - target",
    ]
    assert figure_to_rgb(figure).shape[2] == 3
    assert save_png(figure, tmp_path / "f" / "p.png").read_bytes()[:4] == b"\x89PNG"
    without_baseline = prediction_figure(ExampleImage("u10", field, field))
    assert len([a for a in without_baseline.axes if a.get_title()]) == 3


def test_loss_curves_plot_train_validation_and_the_baseline():
    history = [
        {"global_step": 10 * i, "train_loss": 1.0 / i, "val_loss": 1.1 / i, "headline": "RMSE(u10m)",
         "headline_value": 0.5 / i, "baseline": "persistence", "baseline_loss": 0.3, "baseline_headline": 0.32}
        for i in (1, 2, 3)
    ]  # fmt: skip
    figure = loss_curve_figure(history)
    loss_axis, metric_axis = figure.axes
    assert [line.get_label() for line in loss_axis.get_lines()] == [
        "train loss",
        "validation loss",
        "persistence (validation)",
    ]
    assert list(loss_axis.get_lines()[1].get_ydata()) == [1.1, 0.55, 1.1 / 3]
    assert metric_axis.get_ylabel() == "RMSE(u10m)"


def test_mean_throughput_leaves_out_the_warm_up_epoch():
    rows = [{"samples_per_second": rate} for rate in (10.0, 40.0, 50.0)]
    assert mean_throughput(rows) == 45.0
    assert mean_throughput(rows[:1]) == 10.0
    assert mean_throughput([{"samples_per_second": 0.0}]) is None


def test_final_line_names_the_workloads_baseline_and_leaves_out_what_it_lacks():
    from dlscale.report.summary import final_line

    era5 = {"val_loss": 0.0743, "headline": "RMSE(u10m)", "headline_value": 0.0702, "baseline": "persistence",
            "baseline_loss": 0.3195, "baseline_headline": 0.321}  # fmt: skip
    assert final_line(era5) == "loss 0.0743, RMSE(u10m) 0.0702; persistence: loss 0.3195, RMSE(u10m) 0.3210"
    # with the headline's unit: in it, as the epoch lines give it, and normalized beside it
    in_unit = final_line({**era5, "headline_unit": ["m/s", 3.79]})
    assert in_unit == (
        "loss 0.0743, RMSE(u10m) 0.266 m/s (0.0702 normalized); "
        "persistence: loss 0.3195, RMSE(u10m) 1.22 m/s (0.3210 normalized)"
    )
    classifier = {"val_loss": 0.25, "headline": "accuracy", "headline_value": 0.91, "baseline": "majority class",
                  "baseline_loss": None, "baseline_headline": 0.11}  # fmt: skip
    assert final_line(classifier) == "loss 0.2500, accuracy 0.9100; majority class: accuracy 0.1100"
    assert final_line({**classifier, "baseline": None}) == "loss 0.2500, accuracy 0.9100"
    # the default evaluator's headline is the loss itself: said once, and small losses do not print as 0
    loss_only = {"val_loss": 7.3e-6, "headline": "loss", "headline_value": 7.3e-6, "baseline": None}
    assert final_line(loss_only) == "loss 7.3e-06"
