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
        ("crps_calibration", "2026-11-28-cpu-crps-rollout-calibration"),
        ("crps_calibration", "2026-11-28-cpu-crps-rollout20-calibration"),
        ("crps_calibration", "2026-11-28-cpu-crps-rollout20-valid"),
        ("crps_calibration", "2026-11-28-cpu-crps-rollout-valid"),
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


def test_the_crps_record_names_its_recipe_times_its_phases_and_reuses_only_the_same_gaussians(tmp_path):
    """A second CRPS model's record says how it was trained, adds the phase timing (each phase of a real step
    on the tiny config), and takes the gaussian ensembles of an earlier record only where they are the same."""
    calibration = load("crps_calibration")
    record = json.loads((BENCHMARKS / "results" / "2026-11-28-cpu-crps-calibration.json").read_text())
    run = tmp_path / "crps_demo" / "ft-roll"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(
        "# Resolved dlscale config\ncrps_demo:\n  model: {noise_channels: 4}\n  optim: {lr: 0.0003}\n"
        "  train: {ensemble_members: 4, rollout_steps: 1, rollout_schedule: 'step 0=2, 100=4, 200=8'}\n"
    )
    record["recipe"] = calibration.recipe(run)
    assert record["recipe"] == {"ensemble_members": 4, "noise_channels": 4, "rollout_steps": 1,
                                "rollout_schedule": "step 0=2, 100=4, 200=8", "lr": 3e-4}  # fmt: skip
    split = calibration.time_split(2, "crps_tiny", repeats=1)
    assert split["members"] == 2 and set(split["ms_per_sample"]) == set(calibration.PHASES)
    assert all(value > 0 for value in split["ms_per_sample"].values())
    record["time_split"], record["cost"] = [split], []
    text = calibration.markdown(record)
    assert "rollouts `step 0=2, 100=4, 200=8`" in text and "## Where a one-step CRPS" in text
    assert "## Cost of a training step" not in text  # no cost trials, no table
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps(record))
    blocks = [[record["blocks"][0][0], "x", record["blocks"][0][2]]]
    args = calibration.parse_args(["--gaussian-from", str(earlier), "--members", "16", "32"])
    same_blocks = [[first] + ["y"] * (count - 2) + [last] for first, last, count in record["blocks"]]
    assert calibration.earlier_gaussians(args, same_blocks, record["lead_hours"]) == record
    with pytest.raises(SystemExit, match="its blocks"):
        calibration.earlier_gaussians(args, blocks, record["lead_hours"])
    with pytest.raises(SystemExit, match="lacks the sizes"):
        calibration.earlier_gaussians(
            calibration.parse_args(["--gaussian-from", str(earlier), "--members", "8"]),
            same_blocks,
            record["lead_hours"],
        )


def test_two_crps_records_compare_paired_by_block_and_only_on_the_same_blocks():
    calibration = load("crps_calibration")
    results = BENCHMARKS / "results"
    long, short = (json.loads((results / f"2026-11-28-cpu-{name}.json").read_text())
                   for name in ("crps-rollout20-valid", "crps-rollout-valid"))  # fmt: skip
    forward, backward = calibration.paired_lines(long, short), calibration.paired_lines(short, long)
    assert len(forward) == len(long["days"]) and forward[2].startswith("16 members, 5d: z500 -61.2")
    assert backward[2].startswith("16 members, 5d: z500 61.2")  # the same pairs, the other sign
    short["blocks"] = short["blocks"][1:]
    with pytest.raises(SystemExit, match="same blocks"):
        calibration.paired_lines(long, short)
