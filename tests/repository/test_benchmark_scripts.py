"""The committed benchmark scripts still import (they run on a lent GPU machine, where a broken import would
cost the session), the ladder draws its committed results, and the rollout-cost cases train what they name."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    sys.path.insert(0, str(BENCHMARKS))  # a script may import a sibling script
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


@pytest.mark.parametrize("name", sorted(p.stem for p in BENCHMARKS.glob("*.py")))
def test_each_benchmark_script_imports(name):
    assert load(name).__doc__


def test_the_ladder_draws_intervals_from_its_trials_and_the_std_from_an_older_record(tmp_path):
    ladder = load("ladder")
    (committed,) = sorted((BENCHMARKS / "results").glob("*-ladder.json"))[:1]
    result = json.loads(committed.read_text())
    row = next(r for r in result["rungs"] if "skipped" not in r)
    assert ladder.error_bar(row["FULL"], with_trials=False) == (row["FULL"]["mean"], row["FULL"]["std"])
    mean, half = ladder.error_bar({"mean": 101.0, "std": 1.0, "trials": [100.0, 102.0]}, with_trials=True)
    assert mean == 101.0 and half == pytest.approx(12.706)  # t(1) x 1 (the standard error)
    ladder.plot(result, tmp_path / "ladder.png")
    assert (tmp_path / "ladder.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("script", "stem"),
    [
        ("workload_plan_report", "2026-11-24-cpu-plan-vs-measured-workloads"),
        ("plan_vs_measured", "2026-11-22-cpu-plan-vs-measured"),
        ("forecast_throughput", "2026-11-25-cpu-2-threads-forecast-throughput"),
        ("rollout_training_cost", "2026-11-27-cpu-2-threads-rollout-training-cost"),
        ("multistep_forecast_skill", "2026-11-27-cpu-multistep-forecast-skill"),
        ("ensemble_forecast_skill", "2026-11-27-cpu-ensemble-forecast-skill"),
        ("unet_memory_layout", "2026-11-28-cpu-unet-memory-layout"),
        ("mixer_skill", "2026-11-28-cpu-mixer-skill"),
        ("crps_calibration", "2026-11-28-cpu-crps-calibration"),
        ("channel_perturbation_skill", "2026-11-28-cpu-channel-perturbation-skill"),
    ],
)
def test_the_plan_reports_rewrite_their_committed_markdown_from_their_json(script, stem):
    results = BENCHMARKS / "results"
    record = json.loads((results / f"{stem}.json").read_text())
    assert load(script).markdown(record) == (results / f"{stem}.md").read_text()


def test_the_rollout_cost_cases_train_the_k_and_checkpointing_they_are_named_for():
    """Each case's step rolls out its K (K = 2 holds twice K = 1's activations after the forward) and
    checkpoints when it says so (then it holds far less); the report compares checkpointing with its own K."""
    cost = load("rollout_training_cost")
    measured = [
        cost.measure_case(cost.Settings("tiny", steps_k, checkpointing, "cpu", trials=2, steps=1, warmup=0))
        for steps_k, checkpointing in cost.cases([1, 2])
    ]
    assert [(case["rollout_steps"], case["checkpointing"]) for case in measured] == [
        (1, False),
        (2, False),
        (2, True),
    ]
    one, two, checkpointed = (case["memory"]["held_after_forward_bytes"] for case in measured)
    # K = 2 holds two steps' tensors, and the second step's input (K = 1's input is the batch, not counted)
    state = measured[0]["estimate"]["state_bytes"]
    assert two - 2 * one == pytest.approx(state, abs=64)
    assert checkpointed < 0.5 * two
    record = cost.summarize({"ks": [1, 2], "cases": measured})
    assert [case["time_vs_no_checkpointing"] is None for case in record["cases"]] == [True, True, False]
    # Ratios of geometric means: checkpointing's, taken against the same K, is its ratio to K = 1 over the plain K's.
    plain, with_checkpoints = record["cases"][1:]
    expected = with_checkpoints["time_vs_k1"]["ratio"] / plain["time_vs_k1"]["ratio"]
    assert with_checkpoints["time_vs_no_checkpointing"]["ratio"] == pytest.approx(expected, rel=1e-9)


def test_the_mixer_skill_budget_is_whole_epochs_and_its_verdicts_follow_the_paired_intervals():
    skill = load("mixer_skill")
    assert skill.curriculum(400) == "step 0=2, 100=4, 200=8"  # the docs' recipe at its own length
    assert skill.curriculum(252) == "step 0=2, 63=4, 126=8"
    calibration = {"seconds_per_step": 0.228, "steps": 63}  # 14.4 s an epoch
    assert skill.epochs_for(240, calibration) == 17  # 16.7 epochs: the nearest whole one
    assert skill.epochs_for(1, calibration) == 1  # at least one
    record = json.loads((BENCHMARKS / "results" / "2026-11-28-cpu-mixer-skill.json").read_text())
    found = skill.targets(record)
    afno = found["five_days"]["afno"]
    assert afno["channels"]["z500"]["interval_below"] and afno["channels"]["z500"]["high"] < 0
    assert not afno["channels"]["u10"]["point_below"] and not afno["beats_on_all_point"]
    # moving the u10 blocks of afno below the climatology's makes it beat on all four
    five = skill.skill.lead_index(record, 5)
    for block in record["runs"]["afno"]["blocks"]:
        block["model"]["rmse"]["u10"][five] = block["climatology"]["rmse"]["u10"][five] - 0.1
    assert skill.targets(record)["five_days"]["afno"]["beats_on_all_interval"]
