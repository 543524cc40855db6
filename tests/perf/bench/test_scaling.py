"""``dlscale scaling``: reading bench records, weak/strong scaling arithmetic, outputs and the command."""

from __future__ import annotations

import functools
import json
import logging
import math
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest

from dlscale.cli import main
from dlscale.config import load_run_config
from dlscale.parallel.mesh import MeshShape, ParallelMesh
from dlscale.perf.bench.report import TrialSeries, decide_bottleneck
from dlscale.perf.bench.scaling import (
    SCALING_KIND,
    ScalingInputError,
    analyse_scaling,
    detect_mode,
    load_bench_runs,
    read_bench_run,
    scaling_table,
    write_scaling_outputs,
)
from dlscale.run.bench import build_record
from dlscale.runtime.device import Device
from dlscale.runtime.launch import ProcessInfo

CONFIG_FILE = Path(__file__).resolve().parents[3] / "configs" / "vit_era5.yaml"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# Weak scaling, local batch 4: DDP loses 5, 10, 20 % against ideal; without gradient sync less.
WEAK_DDP = {1: 100.0, 2: 190.0, 4: 360.0, 8: 640.0}
WEAK_NODDP = {1: 100.0, 2: 200.0, 4: 390.0, 8: 760.0}


@pytest.fixture(scope="module")
def tiny_config():
    return load_run_config(CONFIG_FILE, "tiny")


@functools.cache
def noddp_config():
    """The tiny config with parallel.noddp on, as ``dlscale bench --noddp`` resolves it."""
    return load_run_config(CONFIG_FILE, "tiny", ["parallel.noddp=true"])


def bench_record(cfg, world_size: int, local_batch: int, full: list[float], noddp: bool = False) -> dict:
    """A bench JSON record built by the bench's own record builder (the format ``dlscale scaling`` reads)."""
    setup = SimpleNamespace(
        config=noddp_config() if noddp else cfg,
        process=ProcessInfo(rank=0, world_size=world_size),
        local_batch_size=local_batch,
        global_batch_size=local_batch * world_size,
        mesh=ParallelMesh(MeshShape(dp=world_size), rank=0),
        device=Device("cpu"),
        utilization=None,
    )
    tests = {"FULL": TrialSeries("FULL", trial_throughput=list(full))}
    verdict = decide_bottleneck(None, None, tests["FULL"].mean)
    return json.loads(
        json.dumps(build_record(setup.config, setup, tests, verdict, {}, command="dlscale bench"))
    )


def write_record(folder: Path, name: str, record: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(record))
    return path


def weak_study_files(folder: Path, cfg, noddp: bool = True) -> Path:
    """One record per GPU count (and a --noddp one per count), local batch 4, two trials each."""
    for gpus, rate in WEAK_DDP.items():
        write_record(
            folder / f"n{gpus}", "benchy_result.json", bench_record(cfg, gpus, 4, [rate - 1, rate + 1])
        )
        if noddp:
            record = bench_record(cfg, gpus, 4, [WEAK_NODDP[gpus]] * 2, noddp=True)
            write_record(folder / f"n{gpus}", "noddp.json", record)
    return folder


# ---- the record the bench writes --------------------------------------------------------------------------


def test_bench_record_carries_what_scaling_needs(tiny_config):
    record = bench_record(tiny_config, 2, 4, [10.0, 12.0])
    assert record["nranks"] == 2 and record["FULL"]["trial_throughput"] == [10.0, 12.0]
    assert record["batch"] == {
        "local": 4,
        "global": 8,
        "world_size": 2,
        "layout": "dp=2 x tp=1 x cp=1 (order tp-cp-dp)",
    }
    assert record["knobs"]["noddp"] is False
    assert bench_record(tiny_config, 2, 4, [10.0], noddp=True)["knobs"]["noddp"] is True


def test_reader_takes_the_bench_record_apart(tmp_path, tiny_config):
    path = write_record(tmp_path, "b.json", bench_record(tiny_config, 4, 8, [300.0, 500.0], noddp=True))
    run = read_bench_run(path)
    assert (run.world_size, run.noddp, run.local_batch, run.global_batch) == (4, True, 8, 32)
    assert run.full_trials == (300.0, 500.0)
    assert run.setup["config"] == "tiny" and run.setup["device"].startswith("cpu")
    assert "noddp" not in run.setup["knobs"]  # noddp pairs are compared, not refused as a different setup


# ---- the arithmetic ---------------------------------------------------------------------------------------


def test_weak_scaling_efficiency_speedup_ideal_and_communication_overhead(tmp_path, tiny_config):
    study = analyse_scaling(load_bench_runs([weak_study_files(tmp_path, tiny_config)]))
    assert study.mode == "weak" and study.config == "tiny" and study.baseline_gpus == 1
    assert [p.gpus for p in study.points] == [1, 2, 4, 8]
    for point in study.points:
        real, noddp = WEAK_DDP[point.gpus], WEAK_NODDP[point.gpus]
        assert point.ddp.mean == pytest.approx(real) and point.ddp.std == pytest.approx(1.0)
        assert point.ideal == pytest.approx(100.0 * point.gpus)
        assert point.efficiency == pytest.approx(real / (100.0 * point.gpus))
        assert point.speedup == pytest.approx(real / 100.0)
        assert point.noddp_efficiency == pytest.approx(noddp / (100.0 * point.gpus))
        if point.gpus == 1:  # one rank communicates nothing: no overhead figure, whatever the noise says
            assert point.comm_overhead is None
        else:
            assert point.comm_overhead == pytest.approx(1 - real / noddp)
    assert study.points[-1].efficiency == pytest.approx(0.8)
    assert study.points[1].comm_overhead == pytest.approx(0.05)


def test_ideal_line_is_normalised_per_gpu_from_the_smallest_count(tmp_path, tiny_config):
    for gpus, rate in {2: 180.0, 4: 340.0, 8: 600.0}.items():
        write_record(tmp_path, f"b{gpus}.json", bench_record(tiny_config, gpus, 4, [rate]))
    study = analyse_scaling(load_bench_runs([tmp_path]))
    assert study.baseline_gpus == 2
    assert [p.ideal for p in study.points] == pytest.approx([180.0, 360.0, 720.0])
    assert [p.speedup for p in study.points] == pytest.approx([1.0, 340 / 180, 600 / 180])
    assert all(p.noddp is None and p.comm_overhead is None for p in study.points)


def test_strong_scaling_is_detected_from_a_constant_global_batch(tmp_path, tiny_config):
    for gpus, rate in {1: 100.0, 2: 180.0, 4: 300.0}.items():
        write_record(tmp_path, f"s{gpus}.json", bench_record(tiny_config, gpus, 32 // gpus, [rate]))
    study = analyse_scaling(load_bench_runs([tmp_path]))
    assert study.mode == "strong" and study.title.startswith("strong scaling: tiny on cpu")
    assert [p.global_batch for p in study.points] == [32, 32, 32]
    assert [p.local_batch for p in study.points] == [32, 16, 8]
    assert study.points[-1].efficiency == pytest.approx(0.75)


def test_mode_detection_and_forcing(tmp_path, tiny_config):
    for gpus, local in ((1, 4), (2, 8), (4, 4)):  # neither the local nor the global batch is constant
        write_record(tmp_path, f"m{gpus}.json", bench_record(tiny_config, gpus, local, [100.0 * gpus]))
    runs = load_bench_runs([tmp_path])
    with pytest.raises(ScalingInputError, match=r"neither the local batch .* pass --mode"):
        detect_mode(runs)
    mode, notes = detect_mode(runs, "strong")
    assert mode == "strong" and "--mode strong forced, but the batch sizes do not fit it" in notes[0]
    single = [r for r in runs if r.world_size == 1]
    assert detect_mode(single) == ("weak", [])
    with pytest.raises(ScalingInputError, match="expected one of auto, weak, strong"):
        detect_mode(runs, "medium")


def test_plain_benchy_records_need_a_forced_mode(tmp_path):
    for gpus in (1, 2):
        write_record(
            tmp_path, f"benchy{gpus}.json", {"nranks": gpus, "FULL": {"trial_throughput": [50.0 * gpus]}}
        )
    runs = load_bench_runs([tmp_path])
    with pytest.raises(ScalingInputError, match="records without batch sizes"):
        analyse_scaling(runs)
    study = analyse_scaling(runs, mode="weak")
    assert study.points[1].efficiency == pytest.approx(1.0) and study.points[0].local_batch is None


def test_several_records_at_one_count_are_pooled_and_noted(tmp_path, tiny_config):
    write_record(tmp_path, "a.json", bench_record(tiny_config, 1, 4, [100.0, 100.0]))
    write_record(tmp_path, "b.json", bench_record(tiny_config, 2, 4, [180.0, 180.0]))
    write_record(tmp_path, "c.json", bench_record(tiny_config, 2, 4, [200.0, 200.0]))
    study = analyse_scaling(load_bench_runs([tmp_path]))
    two = study.points[1]
    assert two.ddp.runs == 2 and two.ddp.mean == pytest.approx(190.0) and two.ddp.std == pytest.approx(10.0)
    assert any("2 GPU(s) ddp: averaged 2 runs" in note and "c.json" in note for note in study.notes)
    # pooled trials 180, 180, 200, 200: standard error 5.774, t(3) = 3.182, so +- 18.4
    assert two.ddp.low == pytest.approx(190.0 - 3.182 * 20 / 3**0.5 / 2, abs=0.01)
    # the speed-up's interval is Welch's on the logarithms over the exact baseline (t(3) again), never negative;
    # the efficiency's is the same scaled by B / N
    logs = [math.log(v) for v in (180.0, 180.0, 200.0, 200.0)]
    half = 3.182 * math.sqrt(statistics.variance(logs) / 4)
    speedup = (math.exp(statistics.mean(logs) - half) / 100, math.exp(statistics.mean(logs) + half) / 100)
    assert two.speedup_interval == pytest.approx(speedup, abs=1e-4)
    assert two.efficiency_interval == pytest.approx((speedup[0] / 2, speedup[1] / 2), abs=1e-4)
    row = (
        f"| 2 | 4 | 8 | 2 | 190.0 +- 18.4 (95% CI, 4 trials) | 200.0 | 1.90x ({speedup[0]:.2f}x to {speedup[1]:.2f}x) | "
        f"95.0% ({speedup[0] / 2:.1%} to {speedup[1] / 2:.1%}) |"
    )
    assert row in scaling_table(study)


def test_records_of_different_configs_or_devices_are_refused_unless_allowed(tmp_path, tiny_config):
    write_record(tmp_path, "a.json", bench_record(tiny_config, 1, 4, [100.0]))
    other = bench_record(tiny_config, 2, 4, [190.0])
    other["config"]["name"], other["device"] = "short", "NVIDIA H100 80GB HBM3"
    write_record(tmp_path, "b.json", other)
    runs = load_bench_runs([tmp_path])
    with pytest.raises(
        ScalingInputError, match=r"config: .*tiny.*a\.json.*short.*b\.json.*allow-mixed"
    ) as error:
        analyse_scaling(runs)
    assert "device: " in str(error.value)
    study = analyse_scaling(runs, allow_mixed=True)
    assert study.config == "tiny / short" and any(
        n.startswith("mixed setups allowed: config") for n in study.notes
    )


# ---- bad input --------------------------------------------------------------------------------------------


def test_unreadable_json_and_records_without_full_name_the_file(tmp_path, tiny_config):
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ScalingInputError, match=r"broken\.json: cannot read it as JSON"):
        load_bench_runs([tmp_path])
    broken.unlink()
    record = bench_record(tiny_config, 1, 4, [100.0])
    record["FULL"]["trial_throughput"] = []  # bench.run_full=false
    write_record(tmp_path, "nofull.json", record)
    with pytest.raises(ScalingInputError, match=r"nofull\.json: bench record without FULL results"):
        load_bench_runs([tmp_path])
    with pytest.raises(ScalingInputError, match=r"missing\.json: no such file or directory"):
        load_bench_runs([tmp_path / "missing.json"])


def test_other_json_is_skipped_with_a_warning_naming_it(tmp_path, tiny_config, caplog):
    write_record(tmp_path, "b.json", bench_record(tiny_config, 1, 4, [100.0]))
    write_record(tmp_path / "deep", "sweep.json", {"points": []})
    with caplog.at_level(logging.WARNING, logger="dlscale.scaling"):
        runs = load_bench_runs([tmp_path])
    assert [r.path.name for r in runs] == ["b.json"]
    assert any("sweep.json" in m and "not a bench record" in m for m in caplog.messages)
    (tmp_path / "b.json").unlink()
    with pytest.raises(ScalingInputError, match="no bench records among 1 JSON file"):
        load_bench_runs([tmp_path])


# ---- outputs and the command ------------------------------------------------------------------------------


def test_outputs_table_json_and_png(tmp_path, tiny_config):
    study = analyse_scaling(load_bench_runs([weak_study_files(tmp_path / "runs", tiny_config)]))
    paths = write_scaling_outputs(study, tmp_path / "out")
    assert {p.name for p in paths.values()} == {"scaling.md", "scaling.json", "scaling.png"}
    table = paths["md"].read_text()
    assert table.startswith("# weak scaling: tiny on cpu")
    # on a CPU a rank is a process, not a GPU
    header = "| processes | local batch | global batch | runs | samples/s (95% CI) | ideal samples/s | speed-up (95% CI)"
    assert header in table
    assert "| 8 | 4 | 32 | 1 + 1 noddp | 640.0 +- " in table and " | 800.0 | 6.40x (" in table
    assert "| 760.0 +- 0.0 (95% CI, 2 trials) | 95.0% | 15.8% |" in table
    document = json.loads(paths["json"].read_text())
    assert document["kind"] == SCALING_KIND and document["mode"] == "weak"
    assert document["points"][3]["comm_overhead"] == pytest.approx(1 - 640 / 760)
    assert len(document["files"]) == 8
    png = paths["png"].read_bytes()
    assert png.startswith(PNG_SIGNATURE) and len(png) > 1000


def test_a_single_gpu_count_still_gives_a_table_and_says_why_it_shows_no_scaling(tmp_path, tiny_config):
    write_record(tmp_path, "one.json", bench_record(tiny_config, 1, 4, [100.0]))
    study = analyse_scaling(load_bench_runs([tmp_path]))
    assert len(study.points) == 1 and study.points[0].efficiency == pytest.approx(1.0)
    assert any("only 1 GPU(s) measured" in note for note in study.notes)
    assert write_scaling_outputs(study, tmp_path)["png"].read_bytes().startswith(PNG_SIGNATURE)


def test_command_writes_beside_the_records_and_skips_its_own_output_on_a_rerun(
    tmp_path, tiny_config, capsys, caplog
):
    runs = weak_study_files(tmp_path / "runs", tiny_config, noddp=False)
    assert main(["scaling", str(runs)]) == 0
    printed = capsys.readouterr().out
    assert (
        "weak scaling: tiny on cpu" in printed
        and "| 4 | 4 | 16 | 1 | 360.0 +- " in printed
        and " | 400.0 | 3.60x (" in printed
    )
    assert f"plot {runs / 'scaling.png'}" in printed
    assert (runs / "scaling.png").read_bytes().startswith(PNG_SIGNATURE)
    with caplog.at_level(logging.WARNING, logger="dlscale.scaling"):
        assert main(["scaling", str(runs), "--mode", "weak", "--out", str(tmp_path / "elsewhere")]) == 0
    assert not caplog.messages  # the first run's scaling.json is recognised, not warned about
    assert (tmp_path / "elsewhere" / "scaling.md").is_file()


def test_command_reports_a_bad_file_as_an_error(tmp_path, capsys):
    (tmp_path / "bad.json").write_text("[1, 2")
    assert main(["scaling", str(tmp_path / "bad.json"), "--out", str(tmp_path / "out")]) == 2
    assert "bad.json: cannot read it as JSON" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_log_ticks_read_as_numbers_across_a_narrow_range():
    from dlscale.perf.bench.scaling import log_ticks

    ticks = log_ticks(95, 180)
    assert len(ticks) >= 3 and ticks == sorted(set(ticks))  # more than one tick within one power of two
    assert all(95 <= t <= 180 for t in ticks)
    assert all(float(f"{t:.2g}") == t for t in ticks)
    assert log_ticks(5, 5) == [5]


def test_a_gpu_study_counts_gpus():
    from dlscale.perf.bench.scaling import rank_word

    assert rank_word("NVIDIA H100 80GB HBM3") == "GPUs" and rank_word("cpu (2 threads)") == "processes"
