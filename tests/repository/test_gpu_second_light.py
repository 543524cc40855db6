"""benchmarks/gpu_second_light.py: the tutorial's own train.py beside dlscale on one GPU. The tutorial's code is not
part of this repository (the script reads it from an ignored folder), so its pieces are tested here on text shaped
like the tutorial's, and the committed H200 record is rendered again."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
RESULTS = BENCHMARKS / "results"
sys.path.insert(0, str(BENCHMARKS))  # the script imports its sibling modules, as when it runs from there

import attention_ceiling  # noqa: E402
import gpu_second_light as second_light  # noqa: E402

# The keys of the tutorial's config/ViT.yaml that the script rewrites or extends (its layout: absolute paths, an
# anchored `short` section the trial configs merge).
TUTORIAL_YAML = """\
base: &base
  embed_dim: 384
  global_batch_size: 16
  num_iters: 30000
  expdir: '/logs'
  train_data_path:   '/data/train'
  valid_data_path:   '/data/valid'
  global_means_path: '/data/stats/global_means.npy'
  limit_nsamples: None

short: &short_ls
  <<: *base
  limit_nsamples: 512
  num_iters: 128
"""


def test_the_trial_configs_point_at_the_data_and_run_whole_epochs(tmp_path: Path):
    text = second_light.reference_yaml(TUTORIAL_YAML, tmp_path / "era5", tmp_path / "logs", second_light.GPU)
    configs = yaml.safe_load(text)
    for name, steps in (("bench", second_light.GPU.steps), ("bench_fp32", second_light.GPU.fp32_steps)):
        trial = configs[name]
        assert trial["train_data_path"] == f"{tmp_path}/era5/train"
        assert trial["global_means_path"] == f"{tmp_path}/era5/stats/global_means.npy"
        assert trial["expdir"] == f"{tmp_path}/logs"
        assert trial["embed_dim"] == 384  # the rest of `short` comes with the merge key
        # the reference runs num_iters // (limit // batch) epochs: exactly the epochs the trials need
        assert trial["limit_nsamples"] == 16 * steps
        assert trial["num_iters"] // (trial["limit_nsamples"] // 16) == second_light.GPU.epochs
    rehearsal = yaml.safe_load(
        second_light.reference_yaml(TUTORIAL_YAML, tmp_path, tmp_path, second_light.REHEARSAL)
    )
    assert rehearsal["bench"]["img_size"] == [16, 32]


def test_a_tutorial_config_without_those_paths_is_refused(tmp_path: Path):
    with pytest.raises(ValueError, match="no longer has the paths"):
        second_light.reference_yaml(
            TUTORIAL_YAML.replace("'/data/train'", "'/scratch/train'"), tmp_path, tmp_path, second_light.GPU
        )


def test_the_epoch_lines_of_both_tools_become_trials_after_the_warm_up():
    output = [
        "2026-11-28 09:10:12,581 - root - INFO - Time taken for epoch 1 is 60.1 sec, avg 4.2 samples/sec",
        "2026-11-28 09:10:19,289 - root - INFO - Time taken for epoch 2 is 6.707224 sec, avg 38.167804 samples/sec",
        "2026-11-28 09:10:19,289 - dlscale.train - INFO -   Performance: 10.5 TFLOP/s per GPU, MFU 1.1%; "
        "peak memory 12.82 GB allocated, 16.77 GB reserved",
        "2026-11-28 09:10:25,000 - root - INFO - Time taken for epoch 3 is 6.5 sec, avg 39.5 samples/sec",
        "2026-11-28 09:10:25,100 - dlscale.train - INFO -   Performance: 233.4 TFLOP/s per GPU, MFU 23.6%; "
        "peak memory 2.43 GB allocated, 16.77 GB reserved",
        "2026-11-28 09:10:26,100 - dlscale.train - INFO -   Performance: 234.0 TFLOP/s per GPU, MFU 23.8%; "
        "peak memory 2.43 GB allocated, 16.77 GB reserved",
    ]
    found = second_light.epoch_trials(output)
    assert found["trials"] == [38.167804, 39.5]
    assert found["mfu"] == pytest.approx(0.237)  # the epochs after the first
    assert found["peak_memory_gb"] == 12.82  # the highest of all
    assert second_light.epoch_trials(["no epochs here"])["trials"] == []


def rung_row(name: str, reference: list[float], dlscale: list[float] | None) -> dict:
    row = {"rung": name, "description": name, "steps_per_epoch": 16, "reference": {"trials": reference}}
    if dlscale is not None:
        row["dlscale"] = {"trials": dlscale}
    second_light.finish_row(row)
    return row


def record(rows: list[dict]) -> dict:
    return {
        "date": "2026-11-28T09:00:00+00:00",
        "command": "first",
        "budget_s": 480,
        "elapsed_s": 447,
        "parts": {"reference": {"status": "timed out", "rungs": rows, "epochs": 4, "workers": 8}},
    }


def test_a_second_call_fills_the_rungs_the_first_ran_out_of_time_for():
    first = record(
        [
            rung_row("fp32", [14.0, 13.0, 15.0], [14.5, 14.0, 15.0]),
            rung_row("bf16", [36.0, 37.0, 36.5], [41.0, 42.0, 40.0]),
            rung_row("bf16_fused_compile", [38.0, 38.1, 37.9], None),
        ]
    )
    second = {"date": "2026-11-28T09:13:00+00:00", "command": "second", "parts": {"tests": {"status": "ok"}}}
    epochs = "Time taken for epoch {} is 1.0 sec, avg {} samples/sec"
    logs = {
        "bf16_fused_compile": [epochs.format(1, 5.0), epochs.format(2, 44.0), epochs.format(3, 45.0)],
        "best": [
            epochs.format(1, 7.0),
            epochs.format(2, 161.0),
            epochs.format(3, 162.0),
            epochs.format(4, 162.5),
        ],
    }
    merged = second_light.combine_records(first, second, logs, "the second command")
    rows = {row["rung"]: row for row in merged["parts"]["reference"]["rungs"]}
    assert rows["bf16_fused_compile"]["dlscale"]["trials"] == [44.0, 45.0]
    assert rows["bf16_fused_compile"]["ratio"]["ratio"] == pytest.approx(
        (44.0 * 45.0) ** 0.5 / (38.0 * 38.1 * 37.9) ** (1 / 3), rel=1e-9
    )
    best = merged["parts"]["reference"]["dlscale_best"]
    assert best["ratio_to_reference_best"]["ratio"] > 4 and best["call"] == 2
    assert merged["parts"]["tests"]["call"] == 2 and merged["parts"]["reference"]["call"] == 1
    assert merged["calls"][1]["command"] == "the second command"
    found = {t["target"]: t for t in second_light.targets(merged)}
    every = found["dlscale against the reference on every rung it offers"]
    assert not every["met"]  # fp32's interval reaches below 1
    assert found["dlscale's best against the reference's best rung"]["met"]


def test_every_rung_is_met_only_when_each_interval_is_clear_of_one():
    fast = [rung_row(rung.name, [10.0, 10.1, 9.9], [12.0, 12.1, 11.9]) for rung in second_light.RUNGS]
    target = second_light.targets(record(fast))[0]
    assert target["met"]
    missing = second_light.targets(record(fast[:-1]))[0]  # a rung without a comparison is not a pass
    assert not missing["met"]


def test_the_ceiling_adds_the_times_of_the_two_kinds_of_work():
    shapes = {"step_flop": 100e12, "attention_flop": 60e12}
    attention = [
        {"backend": "cudnn", "head_dim": 48, "tflops": 300.0},
        {"backend": "math", "unavailable": "no"},
    ]
    (row,) = attention_ceiling.ceilings(shapes, 500.0, attention, peak=1000.0)
    seconds = 40e12 / 500e12 + 60e12 / 300e12  # GEMMs at their rate, attention at its own
    assert row["step_ms"] == pytest.approx(1e3 * seconds)
    assert row["mfu"] == pytest.approx(100e12 / seconds / 1000e12)


def test_the_committed_h200_record_renders(tmp_path: Path):
    committed = json.loads((RESULTS / "2026-11-28-h200-second-light.json").read_text())
    text = second_light.markdown(committed)
    assert text == (RESULTS / "2026-11-28-h200-second-light.md").read_text()
    assert "| dlscale's best against the reference's best rung | >= 1.3x, interval clear of 1.0 | " in text
    second_light.reference_figure(committed, tmp_path / "reference.png")
    assert (tmp_path / "reference.png").read_bytes().startswith(b"\x89PNG")


def test_the_mixers_ladders_are_reported_beside_the_workloads():
    committed = json.loads((RESULTS / "2026-11-28-h200-second-light.json").read_text())
    ladder = json.loads((RESULTS / "2026-11-26-nvidia-h100-80gb-hbm3-ladder.json").read_text())
    committed["parts"]["mixers"] = {"status": "ok", "by_config": {"afno_short": {"ladder": ladder}}}
    text = second_light.markdown(committed)
    assert "## afno_short: dlscale optimization ladder: NVIDIA H100 80GB HBM3" in text
    assert "| mixers | 1 | ok |" in text
    assert [part.name for part in second_light.PARTS].index("mixers") < [
        part.name for part in second_light.PARTS
    ].index("workloads")  # the models before the other workloads


def ladder_record(*rungs: tuple[str, float, float]) -> dict:
    """The committed H100 ladder record with rungs of the given (name, SYNTHETIC, FULL) means."""
    ladder = json.loads((RESULTS / "2026-11-26-nvidia-h100-80gb-hbm3-ladder.json").read_text())
    template, rows = ladder["rungs"][0], []
    for name, synthetic, full in rungs:
        row = json.loads(json.dumps(template))
        row["rung"] = name
        row["SYNTHETIC"].update(mean=synthetic, trials=[synthetic] * 3)
        row["FULL"].update(mean=full, trials=[full * 0.99, full, full * 1.01])
        row.update(peak_memory_gb=10.0, plan_gb=10.5)
        rows.append(row)
    return {**ladder, "date": "2026-11-28T15:51:20", "rungs": rows}


BENCH_LOG = [
    "2026-11-28 15:52:30 - dlscale.bench - INFO - Overrides: data.root=/d log.run_num=baseline bench.nwarmup=1",
    "2026-11-28 15:52:44 - dlscale.bench - INFO - BENCHY::SYNTHETIC_0::Trial Throughput: 997.8",
    "2026-11-28 15:53:58 - dlscale.bench - INFO - Overrides: data.root=/d log.run_num=fp16_compile bench.nwarmup=1",
    "2026-11-28 15:54:08 - dlscale.bench - INFO - BENCHY::SYNTHETIC_WARMUP_0::Trial Throughput: 1679.4",
    "2026-11-28 15:54:08 - dlscale.bench - INFO - BENCHY::SYNTHETIC_0::Trial Throughput: 1680.8",
    "2026-11-28 15:54:09 - dlscale.bench - INFO - BENCHY::SYNTHETIC_1::Trial Throughput: 1682.4",
    "2026-11-28 15:54:14 - dlscale.bench - INFO - BENCHY::FULL_WARMUP_0::Trial Throughput: 140.7",
    "2026-11-28 15:54:19 - dlscale.bench - INFO - BENCHY::FULL_0::Trial Throughput: 117.7",
    "2026-11-28 15:54:19 - dlscale.bench - INFO - BENCHY::FULL_0::Average Iteration Throughput: 120.7",
    "2026-11-28 15:54:24 - dlscale.bench - INFO - BENCHY::FULL_1::Trial Throughput: 118.7",
]


def test_a_rung_cut_short_keeps_the_trials_it_finished_and_only_its_own():
    found = second_light.partial_rung(BENCH_LOG, "fp16_compile")
    assert found["SYNTHETIC"]["trials"] == [1680.8, 1682.4]  # not the baseline's, not the warm-up
    assert found["FULL"]["trials"] == [117.7, 118.7]
    assert second_light.partial_rung(BENCH_LOG, "cuda_graphs") is None  # never started


def test_later_calls_are_numbered_on_and_keep_the_fuller_ladders(tmp_path: Path):
    first = record([rung_row("fp32", [14.0, 13.0, 15.0], [14.5, 14.0, 15.0])])
    first["parts"]["reference"]["reference"] = {"config": "bench: {}", "environment": {"SLURM_PROCID": 0}}
    first["parts"]["reference"]["dlscale_best"] = {
        "summary": second_light.summarize([160.0, 161.0, 162.0]),
        "mfu": 0.236,
    }
    first["parts"]["workloads"] = {
        "status": "timed out",
        "seconds": 30.0,
        "by_workload": {
            "mnist": {"best": "bf16_graphs", "ladder": ladder_record(("baseline", 90.0, 10.0))},
            "cifar": {"best": "cuda_graphs", "ladder": None},
        },
    }
    third = {
        "date": "2026-11-28T15:42:26+00:00",
        "command": "third",
        "elapsed_s": 518.3,
        "parts": {
            "workloads": {
                "status": "timed out",
                "seconds": 204.1,
                "by_workload": {
                    "cifar": {"best": "cuda_graphs", "ladder": ladder_record(("baseline", 980, 624), ("cuda_graphs", 1179, 1152))},
                    "mnist": {"best": "bf16_graphs", "ladder": None},  # timed out before its record: not a loss
                },
            }
        },
    }  # fmt: skip
    merged = second_light.combine_records(first, third, {}, "")
    # a record without calls was one call: the later one is call 2, then 3 after it
    assert [call["command"] for call in merged["calls"]] == ["first", "third"]
    entries = merged["parts"]["workloads"]["by_workload"]
    assert entries["cifar"]["call"] == 2 and len(entries["cifar"]["ladder"]["rungs"]) == 2
    assert entries["mnist"] == first["parts"]["workloads"]["by_workload"]["mnist"]  # the earlier ladder stays
    assert merged["parts"]["workloads"]["status"] == "timed out (call 1); timed out (call 2)"
    assert merged["parts"]["workloads"]["seconds"] == 234.1
    # a call that ran ladder.py into its results folder (no record of its own)
    folder = tmp_path / "call"
    for name, ladder in (
        ("unet", ladder_record(("baseline", 997.5, 55.6))),
        ("sfno_short", ladder_record(("compile_graphs", 266.6, 237.1))),
    ):
        (folder / f"ladder_{name}").mkdir(parents=True)
        (folder / f"ladder_{name}" / "2026-11-28-nvidia-h200-ladder.json").write_text(json.dumps(ladder))
    (folder / "unet.log").write_text("\n".join(BENCH_LOG))
    out = tmp_path / "merged"
    (tmp_path / "first.json").write_text(json.dumps(merged))
    second_light.combine(
        tmp_path / "first.json", folder, [], "ladders", out, ["a note"], [f"unet={folder / 'unet.log'}"], 193.8
    )  # fmt: skip
    final = json.loads((out / "second_light.json").read_text())
    assert final["calls"][-1] == {"date": "2026-11-28T15:51:20", "command": "ladders", "elapsed_s": 193.8}
    assert final["parts"]["mixers"]["by_config"]["sfno_short"]["call"] == 3
    unet = final["parts"]["workloads"]["by_workload"]["unet"]
    assert unet["best"] == "fp16_compile" and unet["partial_best"]["FULL"]["trials"] == [117.7, 118.7]
    assert final["notes"][-1] == "a note"
    rows = {row["target"].split(":")[0]: row for row in second_light.targets(final)}
    assert rows["unet"]["measured"].startswith(f"{118.2 / 55.6:.2f}x; {118.2 / 1681.6:.2f}; ")
    assert "best rung cut short: 2 SYNTHETIC, 2 FULL trials" in rows["unet"]["measured"]
    assert not rows["unet"]["met"]
    assert rows["cifar"]["measured"].startswith(f"{1152 / 624:.2f}x")
    text = (out / "second_light.md").read_text()
    assert "| attention ViT (`short`) | compile_graphs, training epochs | 161.0 (" in text
    assert "| sfno_short | compile_graphs | 237.1 (" in text  # beside the ViT
    assert "## unet: best rung fp16_compile cut short by call 3's timeout" in text
    assert (out / "models.png").read_bytes().startswith(b"\x89PNG")


def test_tune_is_met_only_when_it_finished_inside_its_box():
    report = record([])
    tune = {"record": {"trials": [], "stop_reason": "the budget (2 min) would be spent by the next trial"}}
    report["parts"]["tune"] = {"budget_minutes": 2.0, "seconds": 88.1, "finished_in_box": True, **tune}
    (row,) = [t for t in second_light.targets(report) if t["target"].startswith("tune")]
    assert row["met"] and "0 trials after its start" in row["measured"] and "next trial" in row["measured"]
    report["parts"]["tune"]["finished_in_box"] = False  # killed at the box's end
    (row,) = [t for t in second_light.targets(report) if t["target"].startswith("tune")]
    assert not row["met"]
