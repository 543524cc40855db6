"""Skill per channel against the workload's baseline (1 - error / baseline's error): the numbers, which channels
are flagged, how the end of a run reports them (log, summary.json) and the figure."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_hex

from dlscale.report.figures import LOWEST_SKILL_SHOWN, skill_figure, validation_figures
from dlscale.report.summary import report_skill
from dlscale.runtime.strict_json import to_json
from dlscale.scoring.evaluator import ChannelSkill, EvalSummary

RED, BLUE = to_hex("C3"), to_hex("C0")


def skill_of(model, baseline, channels=None, **changes) -> ChannelSkill:
    channels = channels or tuple(f"c{i}" for i in range(len(model)))
    return ChannelSkill(
        metric="RMSE",
        baseline_name="persistence",
        channels=tuple(channels),
        model=np.asarray(model, dtype=np.float64),
        baseline=np.asarray(baseline, dtype=np.float64),
        **changes,
    )


def test_skill_is_one_minus_the_error_ratio_and_flags_what_does_not_beat_the_baseline():
    skill = skill_of([0.5, 2.0, 3.0, np.nan, 1.0], [2.0, 2.0, 1.5, 1.0, 0.0])
    scores = skill.skill()
    np.testing.assert_allclose(scores[:3], [0.75, 0.0, -1.0])
    assert np.isnan(scores[3]) and np.isnan(scores[4])  # no error known; a perfect baseline leaves no skill
    # equal is not better; NaN is not better; nothing beats an exact baseline
    assert skill.not_beating() == ["c1", "c2", "c3", "c4"]


def test_the_summary_record_holds_every_channel_and_stays_strict_json():
    skill = skill_of([0.5, 3.0, np.nan], [2.0, 1.5, 1.0], channels=("u10", "sp", "t2m"))
    record = json.loads(to_json(skill.to_dict()))
    assert record["not_beating_baseline"] == ["sp", "t2m"]
    assert record["channels"]["u10"] == {"model": 0.5, "baseline": 2.0, "skill": 0.75, "beats_baseline": True}
    assert record["channels"]["sp"]["skill"] == -1.0 and not record["channels"]["sp"]["beats_baseline"]
    assert record["channels"]["t2m"]["model"] is None and record["channels"]["t2m"]["skill"] is None
    assert record["baseline"] == "persistence" and record["metric"] == "RMSE"


def test_the_end_of_a_run_warns_about_each_losing_channel_in_its_unit(caplog):
    skill = skill_of(
        [0.0702, 0.0467],
        [0.3210, 0.0391],
        channels=("u10", "sp"),
        units=("m/s", "Pa"),
        scales=np.array([3.8, 5720.0]),
    )
    with caplog.at_level(logging.INFO, logger="dlscale.train"):
        report_skill(skill)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "does not beat persistence on 1 of 2 channels" in warnings[0]
    assert "sp 0.0467 vs 0.0391 (267 Pa vs 224 Pa)" in warnings[0]
    assert "u10" not in warnings[0]
    infos = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.INFO)
    assert "u10 +0.78" in infos and "sp -0.19" in infos


def test_a_model_that_beats_the_baseline_everywhere_gets_no_warning(caplog):
    with caplog.at_level(logging.INFO, logger="dlscale.train"):
        report_skill(skill_of([0.1, 0.2], [0.3, 0.4]))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "beats persistence on every channel (2)" in caplog.text


def bars(figure):
    axis = figure.axes[0]
    return axis, list(axis.patches)


def test_the_figure_draws_a_bar_per_channel_as_a_fraction_red_where_the_baseline_wins():
    skill = skill_of([0.5, 3.0, 1.0], [2.0, 1.5, 4.0], channels=("u10", "sp", "t2m"))
    axis, drawn = bars(skill_figure(skill, "epoch 6"))
    assert [round(bar.get_height(), 6) for bar in drawn] == [0.75, -1.0, 0.75]
    assert [to_hex(bar.get_facecolor()) for bar in drawn] == [BLUE, RED, BLUE]
    assert [label.get_text() for label in axis.get_xticklabels()] == ["u10", "sp", "t2m"]
    assert sorted(text.get_text() for text in axis.texts) == ["+0.75", "+0.75", "-1.00"]  # as the log writes
    assert "1 of 3 channels does not beat persistence" in axis.get_title()
    assert axis.get_ylim()[1] == 1.0 and "%" not in axis.get_ylabel() + axis.get_title()


def test_a_very_bad_channel_is_cut_at_the_axis_with_its_value_written():
    axis, drawn = bars(skill_figure(skill_of([10.0, 1.0], [1.0, 2.0])))
    assert axis.get_ylim()[0] == LOWEST_SKILL_SHOWN
    assert drawn[0].get_height() == LOWEST_SKILL_SHOWN
    assert "-9.00" in [text.get_text() for text in axis.texts]


@pytest.mark.parametrize("with_skill", [True, False])
def test_validation_figures_include_the_skill_figure_when_the_workload_reports_skill(with_skill):
    skill = skill_of([0.5], [1.0]) if with_skill else None
    drawn = validation_figures(EvalSummary(0.0, {}, "loss", channel_skill=skill), "epoch 2")
    assert list(drawn) == (["skill_vs_persistence"] if with_skill else [])


@pytest.mark.slow
def test_a_finished_run_reports_the_skill_of_its_last_validation(tiny_config):
    from dlscale.run.training import train

    cfg = tiny_config("train.num_epochs=1")
    assert train(cfg) == 0
    summaries = list(Path(cfg.log.expdir).rglob("summary.json"))
    assert len(summaries) == 1
    summary = json.loads(summaries[0].read_text())
    record = summary["final"]["channel_skill"]
    metrics, baseline = summary["final"]["metrics"], summary["final"]["baseline_metrics"]
    assert list(record["channels"]) == [
        name.removeprefix("RMSE/") for name in metrics if name.startswith("RMSE/")
    ]
    for name, values in record["channels"].items():
        assert values["model"] == metrics[f"RMSE/{name}"] and values["baseline"] == baseline[f"RMSE/{name}"]
        assert values["beats_baseline"] == (name not in record["not_beating_baseline"])
    assert "Skill per channel against persistence" in (summaries[0].parent / "out.log").read_text()
    assert (summaries[0].parent / "figures" / "skill_vs_persistence.png").is_file()
