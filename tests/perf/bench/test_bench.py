"""Throughput trials (benchy's IO / SYNTHETIC / FULL): mechanics, output, verdict, the command and sweeps."""

from __future__ import annotations

import json
import logging
import re
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from bench_records import only_bench_record

from dlscale.cli import main
from dlscale.config import load_run_config
from dlscale.errors import ConfigError, DataError
from dlscale.models.vit import vit_flops_per_sample
from dlscale.parallel.mesh import MeshShape, ParallelMesh
from dlscale.perf.bench.report import (
    BOUND_MARGIN,
    OVERHEAD_MARGIN,
    TrialSeries,
    decide_bottleneck,
    decide_from_trials,
    interval_line,
    summary_record,
)
from dlscale.perf.bench.sweep_points import SweepSpec, flags_not_swept, parse_sweep, sweep_points
from dlscale.perf.bench.trials import run_trials
from dlscale.run.bench import default_bench_path, run_benchmark, switched_on_knobs
from dlscale.runtime.device import Device
from dlscale.runtime.launch import ProcessInfo

CONFIG_FILE = Path(__file__).resolve().parents[3] / "configs" / "vit_era5.yaml"
SUMMARY = {
    "IO": re.compile(r"^BENCHY::SUMMARY::IO average trial throughput: \d+\.\d{3} \+/- \d+\.\d{3}$"),
    "SYNTHETIC": re.compile(
        r"^BENCHY::SUMMARY:: SYNTHETIC average trial throughput: \d+\.\d{3} \+/- \d+\.\d{3}$"
    ),
    "FULL": re.compile(r"^BENCHY::SUMMARY::FULL average trial throughput: \d+\.\d{3} \+/- \d+\.\d{3}$"),
}


class FakeClock:
    """Seconds that pass only when the fake loader or step says so: deterministic timings."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class CountingLoader:
    """``num_batches`` distinct batches per pass; ``cost()`` runs before each (it advances a fake clock)."""

    def __init__(self, num_batches: int, batch_size: int = 4, cost=lambda: None):
        self.num_batches, self.batch_size, self.cost = num_batches, batch_size, cost
        self.fetched = 0
        self.passes = 0

    def __iter__(self):
        self.passes += 1
        for _ in range(self.num_batches):
            self.cost()
            self.fetched += 1
            yield torch.full((self.batch_size, 3), float(self.fetched)), torch.zeros(self.batch_size, 3)


class CountingStep:
    """Records every (inputs, targets, global_step) it trains on; ``cost()`` is the step's work."""

    def __init__(self, cost=lambda: None):
        self.cost = cost
        self.calls: list[tuple[torch.Tensor, torch.Tensor, int]] = []

    def __call__(self, inputs, targets, global_step):
        self.calls.append((inputs, targets, global_step))
        self.cost()
        return torch.zeros(())


class RecordingSampler:
    def __init__(self) -> None:
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        self.epochs.append(epoch)


def bench_config(*overrides: str):
    """The shipped tiny config (no data needed: the fake setups bring their own loader)."""
    return load_run_config(CONFIG_FILE, "tiny", ["bench.report_freq=2", *overrides])


def fake_setup(cfg, loader, step, world_size: int = 1, local_batch: int = 4, utilization=None):
    return SimpleNamespace(
        config=cfg,
        train_loader=loader,
        train_sampler=RecordingSampler(),
        step=step,
        device=Device("cpu"),
        process=ProcessInfo(rank=0, world_size=world_size),
        model=torch.nn.Linear(3, 3),
        local_batch_size=local_batch,
        global_batch_size=local_batch * world_size,
        utilization=utilization,
        mesh=ParallelMesh(MeshShape(dp=world_size), rank=0),
    )


@pytest.fixture
def bench_lines():
    """The messages logged on dlscale.bench during the test."""
    logger = logging.getLogger("dlscale.bench")
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    previous_level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    yield lines
    logger.removeHandler(handler)
    logger.setLevel(previous_level)


# ---- the verdict, from numbers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("io", "synthetic", "full", "kind"),
    [
        (100, 1000, 95, "IO-bound"),
        (1000, 100, 95, "compute-bound"),
        (100, 105, 95, "balanced"),
        (100, 1000, 70, "overhead"),  # FULL well below the slower part: no overlap
        (1000, 100, 50, "overhead"),
        # thresholds: IO-bound needs IO < 90 % of SYNTHETIC; overhead needs FULL < 80 % of min(IO, SYNTHETIC)
        (90, 100, 90, "balanced"),
        (89.9, 100, 89, "IO-bound"),
        (100, 89.9, 89, "compute-bound"),
        (100, 1000, 80, "IO-bound"),
        (100, 1000, 79.9, "overhead"),
        (100, 1000, None, "IO-bound"),  # no FULL: the ranking holds, overhead is unknown
        (100, None, 95, "IO-bound"),  # FULL at the loader's rate
        (100, None, 50, "inconclusive"),  # compute or overhead: needs SYNTHETIC
        (None, 100, 95, "compute-bound"),
        (None, 100, 50, "inconclusive"),
        (None, None, 100, "inconclusive"),
        (100, None, None, "inconclusive"),
    ],
)
def test_verdict_branches_and_thresholds(io, synthetic, full, kind):
    assert (BOUND_MARGIN, OVERHEAD_MARGIN) == (0.10, 0.20)
    verdict = decide_bottleneck(io, synthetic, full)
    assert verdict.kind == kind
    assert verdict.line().startswith(f"BENCHY::VERDICT::{kind}: ")


def test_verdicts_name_the_knobs_to_try_and_what_is_missing():
    assert "--num_data_workers N (more loader processes)" in decide_bottleneck(100, 1000, 95).knobs
    assert "--amp_mode bf16" in decide_bottleneck(1000, 100, 95).knobs
    assert any("--data_loader_config gpu" in knob for knob in decide_bottleneck(100, 1000, 50).knobs)
    assert "overhead unknown" in decide_bottleneck(100, 1000, None).reason
    only_full = decide_bottleneck(None, None, 100)
    assert "needs IO and SYNTHETIC" in only_full.reason and only_full.knobs == ()


def series(name: str, *trials: float) -> TrialSeries:
    return TrialSeries(name, trial_throughput=list(trials))


def test_a_verdict_holds_only_beyond_the_noise():
    # The busy-machine case of docs/speed.md: FULL scattered by 20% around a mean just under 80% of SYNTHETIC.
    noisy = {
        "IO": series("IO", 2900, 2950, 2920),
        "SYNTHETIC": series("SYNTHETIC", 20.0, 20.2, 19.9),
        "FULL": series("FULL", 12.5, 19.5, 15.0),
    }
    assert decide_bottleneck(2923, 20.03, 15.67).kind == "overhead"  # the means alone
    # FULL cannot tell overlap from noise, but the step is clearly the limit: the documented verdict, with a note
    verdict = decide_from_trials(noisy)
    assert verdict.kind == "compute-bound" and verdict.knobs
    assert (
        "scatters too much to tell whether reading and computing overlap (FULL / SYNTHETIC = "
        in verdict.reason
    )
    # ... and when IO against SYNTHETIC cannot name a limit either, nothing is named
    unclear = {**noisy, "IO": series("IO", 21.0, 20.9, 21.1)}
    assert decide_bottleneck(21.0, 20.03, 15.67).kind == "overhead"
    verdict = decide_from_trials(unclear)
    assert verdict.kind == "within noise" and verdict.knobs == ()
    assert "the means say overhead" in verdict.reason and "--ntrials" in verdict.reason
    # The same means with tight trials stand.
    quiet = {
        "IO": series("IO", 2920, 2921, 2922),
        "SYNTHETIC": series("SYNTHETIC", 20.0, 20.1, 20.0),
        "FULL": series("FULL", 15.6, 15.7, 15.7),
    }
    assert decide_from_trials(quiet).kind == "overhead"
    # IO-bound needs IO's whole interval below 90% of SYNTHETIC's lowest value.
    close = {"IO": series("IO", 80, 95, 88), "SYNTHETIC": series("SYNTHETIC", 100, 100.5, 99.5)}
    assert decide_bottleneck(87.7, 100, None).kind == "IO-bound"
    assert decide_from_trials(close).kind == "within noise"
    assert decide_from_trials({**close, "IO": series("IO", 60, 61, 60.5)}).kind == "IO-bound"


def test_one_trial_needs_more_trials_and_balanced_needs_no_interval():
    single = {"IO": series("IO", 5000), "SYNTHETIC": series("SYNTHETIC", 100), "FULL": series("FULL", 95)}
    verdict = decide_from_trials(single)
    assert verdict.kind == "needs more trials" and "--ntrials 2" in verdict.reason
    balanced = {"IO": series("IO", 100), "SYNTHETIC": series("SYNTHETIC", 101), "FULL": series("FULL", 99)}
    assert decide_from_trials(balanced).kind == "balanced"


def test_full_faster_than_synthetic_beyond_the_noise_is_called_a_disturbed_measurement():
    tests = {
        "IO": series("IO", 5000, 5010, 4990),
        "SYNTHETIC": series("SYNTHETIC", 24.5, 24.4, 24.6),
        "FULL": series("FULL", 29.0, 29.1, 28.9),
    }
    verdict = decide_from_trials(tests)
    assert verdict.kind == "compute-bound" and "cannot be: the trials were disturbed" in verdict.reason
    within = {**tests, "FULL": series("FULL", 20.0, 29.0, 25.0)}
    assert "disturbed" not in decide_from_trials(within).reason


def test_interval_line_and_record_give_each_tests_interval():
    tests = {"IO": series("IO", 10, 12, 14), "FULL": series("FULL", 7)}
    line = interval_line(tests)
    assert line.startswith("BENCHY::INTERVAL::IO 12.0 +- 5.0 samples/s (95% CI, 3 trials)")
    assert "FULL 7.0 samples/s (1 trial: no interval)" in line
    low, high = summary_record(tests)["IO"]["ci95"]
    assert low == pytest.approx(12 - 4.303 * 2 / 3**0.5, abs=1e-3) and high == pytest.approx(
        12 + 4.303 * 2 / 3**0.5, abs=1e-3
    )


def test_verdicts_leave_out_knobs_the_run_already_uses_or_cannot_use(tiny_config):
    compute_bound = decide_bottleneck(1000, 100, 95)
    cfg = tiny_config("train.amp_mode=bf16", "optim.enable_fused=true")
    on_cpu = compute_bound.for_run(switched_on_knobs(cfg), on_gpu=False)
    assert "--enable_jit" in on_cpu.knobs
    assert not any(
        k.startswith(("--amp_mode", "--enable_fused", "--cuda_graphs", "--tf32")) for k in on_cpu.knobs
    )
    on_gpu = compute_bound.for_run(switched_on_knobs(tiny_config("train.tf32=false")), on_gpu=True)
    assert (
        "--cuda_graphs" in on_gpu.knobs and "--tf32 on" in on_gpu.knobs and "--amp_mode bf16" in on_gpu.knobs
    )
    assert "--tf32 on" not in compute_bound.for_run(switched_on_knobs(tiny_config()), on_gpu=True).knobs
    # mixed precision is emulated on a CPU, and slower: never suggested there, even to a run in fp32
    fp32_on_cpu = compute_bound.for_run(switched_on_knobs(tiny_config("train.amp_mode=none")), on_gpu=False)
    assert not any(k.startswith("--amp_mode") for k in fp32_on_cpu.knobs)
    assert "--enable_jit" in fp32_on_cpu.knobs


def test_summary_statistics_are_benchys_mean_and_population_std():
    series = TrialSeries("IO", trial_throughput=[1.0, 3.0])
    assert series.mean == 2.0
    assert series.std == 1.0  # np.std, not the sample std (1.414)


# ---- trial mechanics on a fake setup ----------------------------------------------------------------------


def test_io_trials_drain_the_loader_restarting_it_with_new_epochs_and_never_train():
    loader, step = CountingLoader(num_batches=3), CountingStep()
    cfg = bench_config("run_synthetic=false", "run_full=false", "nwarmup=1", "ntrials=2", "nbatches=5")
    setup = fake_setup(cfg, loader, step)
    tests = run_trials(setup, setup.config.bench)
    assert loader.fetched == (1 + 2) * 5
    assert step.calls == []
    assert loader.passes == 5 and setup.train_sampler.epochs == [0, 1, 2, 3, 4]
    assert set(tests) == {"IO"} and len(tests["IO"].trial_throughput) == 2


def test_synthetic_trials_fetch_one_batch_and_train_on_that_same_tensor():
    loader, step = CountingLoader(num_batches=3), CountingStep()
    cfg = bench_config("run_io=false", "run_full=false", "nwarmup=1", "ntrials=2", "nbatches=5")
    setup = fake_setup(cfg, loader, step)
    run_trials(setup, setup.config.bench)
    assert loader.fetched == 1
    assert len(step.calls) == (1 + 2) * (5 + 1)  # the first step of each trial is untimed
    first_inputs = step.calls[0][0]
    assert all(inputs is first_inputs for inputs, _, _ in step.calls)
    assert [s for _, _, s in step.calls] == list(range(len(step.calls)))


def test_full_trials_train_on_distinct_fresh_batches():
    loader, step = CountingLoader(num_batches=4), CountingStep()
    cfg = bench_config("run_io=false", "run_synthetic=false", "nwarmup=1", "ntrials=2", "nbatches=5")
    setup = fake_setup(cfg, loader, step)
    run_trials(setup, setup.config.bench)
    assert len(step.calls) == (1 + 2) * 5 == loader.fetched
    assert len({inputs[0, 0].item() for inputs, _, _ in step.calls}) == len(step.calls)
    assert len({id(inputs) for inputs, _, _ in step.calls}) == len(step.calls)


def test_an_empty_loader_is_an_error_not_an_endless_loop():
    setup = fake_setup(
        bench_config("run_synthetic=false", "run_full=false"), CountingLoader(0), CountingStep()
    )
    with pytest.raises(DataError, match="no batches"):
        run_trials(setup, setup.config.bench)


# ---- output: lines, JSON, global samples/s ----------------------------------------------------------------


def fake_clock_setup(world_size: int = 1, utilization=None, *overrides: str):
    """IO costs 0.01 s per batch, a step 0.03 s, on a fake clock."""
    clock = FakeClock()
    loader = CountingLoader(num_batches=3, cost=lambda: clock.advance(0.01))
    step = CountingStep(cost=lambda: clock.advance(0.03))
    cfg = bench_config("nwarmup=1", "ntrials=2", "nbatches=4", *overrides)
    return fake_setup(cfg, loader, step, world_size=world_size, utilization=utilization), clock


def test_output_lines_and_json_follow_benchy(tmp_path, bench_lines):
    setup, clock = fake_clock_setup()
    results = run_benchmark(setup.config, setup, tmp_path, clock=clock, command="dlscale bench --config tiny")

    summary = [line for line in bench_lines if line.startswith("BENCHY::SUMMARY::")]
    assert len(summary) == 3
    for line, name in zip(summary, ("IO", "SYNTHETIC", "FULL"), strict=True):
        assert SUMMARY[name].match(line), line
    assert summary[0] == "BENCHY::SUMMARY::IO average trial throughput: 400.000 +/- 0.000"  # 4 x 4 / 0.04 s
    for label in ("IO_WARMUP_0", "IO_0", "IO_1", "SYNTHETIC_WARMUP_0", "SYNTHETIC_1", "FULL_0", "FULL_1"):
        assert f"BENCHY::{label}::Trial Throughput: " in "\n".join(bench_lines)
        assert f"BENCHY::{label}::Average Iteration Throughput: " in "\n".join(bench_lines)
    # report_freq 2 of 4 batches: two iteration lines per trial, 3 trials per test, 3 tests
    assert sum("::Iteration Throughput: " in line for line in bench_lines) == 2 * 3 * 3
    # IO 400, SYNTHETIC 133, FULL 100 (reading and computing one after the other)
    assert [line for line in bench_lines if line.startswith("BENCHY::VERDICT::")] == [results.verdict.line()]
    assert results.verdict.kind == "overhead"

    assert only_bench_record(tmp_path, ".png").read_bytes().startswith(b"\x89PNG")  # the trials, as a picture
    path = only_bench_record(tmp_path)
    assert results.output_path == path
    assert f"BENCHY::INFO::Message: Writing JSON output to {path}." in bench_lines
    record = json.loads(path.read_text())
    assert record["nranks"] == 1
    for name in ("IO", "SYNTHETIC", "FULL"):
        assert set(record[name]) == {"rates", "avg_iter_throughput", "trial_throughput", "trial_time"}
        assert len(record[name]["trial_throughput"]) == 2 and len(record[name]["rates"]) == 2
        assert all(len(rates) == 4 for rates in record[name]["rates"])
    assert record["FULL"]["trial_time"] == pytest.approx([0.16, 0.16])
    assert record["summary"]["SYNTHETIC"]["mean"] == pytest.approx(16 / 0.12)
    assert record["verdict"]["kind"] == "overhead"
    assert record["config"]["name"] == "tiny" and record["command"] == "dlscale bench --config tiny"
    assert record["batch"] == {
        "local": 4,
        "global": 4,
        "world_size": 1,
        "layout": "dp=1 x tp=1 x cp=1 (order tp-cp-dp)",
    }
    knobs = {"amp_mode", "tf32", "enable_jit", "cuda_graphs", "enable_fused", "data_loader_config"}
    assert set(record["knobs"]) == knobs | {"num_data_workers", "noddp"}
    assert record["knobs"]["noddp"] is False
    assert record["device"].startswith("cpu") and record["torch_version"] == torch.__version__
    for key in ("dlscale_version", "date", "utilization"):
        assert key in record


def test_throughput_counts_samples_of_all_ranks(tmp_path):
    setup1, clock1 = fake_clock_setup(world_size=1)
    setup2, clock2 = fake_clock_setup(world_size=2)
    one = run_benchmark(setup1.config, setup1, tmp_path / "one", clock=clock1)
    two = run_benchmark(setup2.config, setup2, tmp_path / "two", clock=clock2)
    for name in ("IO", "SYNTHETIC", "FULL"):
        assert two.tests[name].trial_throughput == pytest.approx(
            [2 * x for x in one.tests[name].trial_throughput]
        )
    assert json.loads(only_bench_record(tmp_path / "two").read_text())["nranks"] == 2


def test_skipped_tests_print_nothing_and_keep_empty_json_entries(tmp_path, bench_lines):
    setup, clock = fake_clock_setup(1, None, "run_io=false")
    run_benchmark(setup.config, setup, tmp_path, output_path=tmp_path / "out" / "bench.json", clock=clock)
    assert not any(line.startswith("BENCHY::IO") or "::IO average" in line for line in bench_lines)
    record = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert record["IO"] == {"rates": [], "avg_iter_throughput": [], "trial_throughput": [], "trial_time": []}
    assert len(record["FULL"]["trial_throughput"]) == 2


def test_utilization_of_synthetic_and_full_is_per_gpu_and_printed_after_the_summary(tmp_path, bench_lines):
    utilization = SimpleNamespace(
        tflops=lambda per_gpu: per_gpu / 1000,
        mfu=lambda per_gpu: per_gpu / 10000,
        describe=lambda: "fake peak",
    )
    setup, clock = fake_clock_setup(2, utilization)
    results = run_benchmark(setup.config, setup, tmp_path, clock=clock)
    full_per_gpu = results.tests["FULL"].mean / 2
    expected = {"tflops_per_gpu": full_per_gpu / 1000, "mfu": full_per_gpu / 10000}
    assert results.utilization["FULL"] == pytest.approx(expected)
    assert set(results.utilization) == {"SYNTHETIC", "FULL"}
    last_summary = max(i for i, line in enumerate(bench_lines) if line.startswith("BENCHY::SUMMARY::"))
    assert bench_lines[last_summary + 1].startswith("BENCHY::UTILIZATION::SYNTHETIC ")
    assert "fake peak" in bench_lines[last_summary + 1]


# ---- the verdict from measured timings (on the fake clock, so a loaded machine cannot flip it) -----------


def slow_part_setup(batch_s: float, step_s: float):
    """A batch costs ``batch_s`` and a step ``step_s`` seconds of a fake clock; 2 trials of 5 batches."""
    clock = FakeClock()
    loader = CountingLoader(num_batches=50, cost=lambda: clock.advance(batch_s))
    step = CountingStep(cost=lambda: clock.advance(step_s))
    return fake_setup(bench_config("nwarmup=0", "ntrials=2", "nbatches=5"), loader, step), clock


def test_a_slow_dataset_is_reported_io_bound(tmp_path):
    setup, clock = slow_part_setup(batch_s=0.01, step_s=0.001)
    results = run_benchmark(setup.config, setup, tmp_path, clock=clock)
    assert results.verdict.kind == "IO-bound", results.verdict.line()
    assert json.loads(only_bench_record(tmp_path).read_text())["verdict"]["kind"] == "IO-bound"


def test_a_slow_model_is_reported_compute_bound(tmp_path):
    setup, clock = slow_part_setup(batch_s=0.001, step_s=0.01)
    results = run_benchmark(setup.config, setup, tmp_path, clock=clock)
    assert results.verdict.kind == "compute-bound", results.verdict.line()


# ---- sweep parsing ----------------------------------------------------------------------------------------


def test_sweep_values_parse_and_combine():
    assert parse_sweep("num_data_workers=0, 2,4") == SweepSpec("num_data_workers", ("0", "2", "4"))
    assert parse_sweep("optim.betas=[0.9,0.95],[0.9,0.99]").values == ("[0.9,0.95]", "[0.9,0.99]")
    points = sweep_points([parse_sweep("num_data_workers=0,2"), parse_sweep("amp_mode=none,bf16")])
    assert points == [
        (("num_data_workers", "0"), ("amp_mode", "none")),
        (("num_data_workers", "0"), ("amp_mode", "bf16")),
        (("num_data_workers", "2"), ("amp_mode", "none")),
        (("num_data_workers", "2"), ("amp_mode", "bf16")),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("num_data_workers", "expected KEY=v1,v2"),
        ("=1,2", "expected KEY=v1,v2"),
        ("num_data_workers=", "non-empty"),
        ("num_data_workers=0,,2", "non-empty"),
        ("amp_mode=none,none", "twice"),
    ],
)
def test_bad_sweeps_are_clear_errors(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_sweep(text)


def test_a_key_swept_twice_is_rejected_and_a_swept_key_wins_over_its_flag():
    with pytest.raises(ConfigError, match="same key"):
        sweep_points([parse_sweep("num_data_workers=0,1"), parse_sweep("loader.num_data_workers=2")])
    flags = {"loader.num_data_workers": 4, "train.amp_mode": "bf16"}
    assert flags_not_swept(flags, [parse_sweep("num_data_workers=0,1")]) == {"train.amp_mode": "bf16"}


# ---- the command, for real, on the tiny config ------------------------------------------------------------


def tiny_command(tiny_era5: Path, tmp_path: Path, *extra: str, config: str = "tiny") -> list[str]:
    return ["bench", "--yaml_config", str(CONFIG_FILE), "--config", config, "--set", f"data.root={tiny_era5}",
            "--set", f"log.expdir={tmp_path}", "--set", "log.tensorboard=false", "--progress", "none",
            "--nbatches", "3", "--ntrials", "1", "--nwarmup", "0", *extra]  # fmt: skip


# The ViT with each of its token mixers (model.mixer: attention, afno, sfno).
@pytest.mark.slow
@pytest.mark.parametrize("config", ["tiny", "afno_tiny", "sfno_tiny"])
def test_dlscale_bench_runs_the_three_tests_and_writes_the_json(config, tiny_era5, tmp_path, capsys):
    assert main(tiny_command(tiny_era5, tmp_path, config=config)) == 0
    out = capsys.readouterr().out
    summary = [line.split(" - ")[-1] for line in out.splitlines() if "BENCHY::SUMMARY::" in line]
    assert len(summary) == 3
    for name, line in zip(("IO", "SYNTHETIC", "FULL"), summary, strict=True):
        assert SUMMARY[name].match(line), line
    assert "BENCHY::VERDICT::" in out
    run_dir = tmp_path / config / "00"
    record = json.loads(only_bench_record(run_dir).read_text())
    assert record["config"]["name"] == config
    assert len(record["FULL"]["trial_throughput"]) == 1 and record["batch"]["local"] == 4
    assert record["command"].startswith("dlscale bench --yaml_config ")
    assert "--progress none --nwarmup 0 --ntrials 1 --nbatches 3" in record["command"]
    assert not (run_dir / "checkpoints").exists()  # the bench never writes training checkpoints
    # TFLOP/s and MFU count three times the model's analytic forward: the FFTs and transforms of AFNO and SFNO
    # too (tests/models/test_afno.py and test_sfno.py hold that count to what runs), which a counter misses.
    cfg = load_run_config(CONFIG_FILE, config)
    forward = vit_flops_per_sample(
        cfg.model, cfg.data.img_size, cfg.data.n_in_channels, cfg.data.n_out_channels
    )
    assert f"mixer {cfg.model.mixer}" in out
    assert f"FLOPs: {3 * forward / 1e9:.4g} GFLOP per training sample" in out


@pytest.mark.slow
def test_dlscale_bench_sweep_writes_a_table_and_a_plot(tiny_era5, tmp_path, capsys):
    assert main(tiny_command(tiny_era5, tmp_path, "--sweep", "num_data_workers=0,1")) == 0
    out = capsys.readouterr().out
    (sweep_dir,) = (tmp_path / "tiny" / "00" / "bench").glob("*-sweep-num_data_workers")
    assert (sweep_dir / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (sweep_dir / "sweep.md").read_text()
    assert "| num_data_workers | IO samples/s | SYNTHETIC samples/s | FULL samples/s |" in table
    assert re.search(r"^\| 0 \| .+$", table, re.M) and re.search(r"^\| 1 \| .+$", table, re.M)
    assert "| num_data_workers | IO samples/s" in out
    combined = json.loads((sweep_dir / "sweep.json").read_text())
    assert [p["overrides"] for p in combined["points"]] == [["num_data_workers=0"], ["num_data_workers=1"]]
    assert all(Path(p["json"]).is_file() for p in combined["points"])
    # the same sweep again goes to a folder of its own
    assert main(tiny_command(tiny_era5, tmp_path, "--sweep", "num_data_workers=0,1")) == 0
    assert len(list((tmp_path / "tiny" / "00" / "bench").glob("*-sweep-num_data_workers"))) == 2


def test_each_test_reports_the_energy_and_power_of_the_gpu(tmp_path, bench_lines, monkeypatch):
    """With a GPU backend (a fake one here: 350 W of 700 W, 90% utilization), every test gets its energy."""
    from dlscale.runtime.gpu_metrics import GpuReading

    class ConstantGpu:
        name = "fake"
        closed = False

        def read(self):
            return [GpuReading(0, "Fake H100", 90.0, 10.0, 80.0, 350.0, 700.0, None, 60.0, 1980.0)]

        def close(self):
            ConstantGpu.closed = True

    monkeypatch.setattr("dlscale.perf.bench.trials.open_gpu_backend", lambda indices: ConstantGpu())
    setup, clock = fake_clock_setup()  # the power sampler keeps its own real clock: energy needs only time
    setup.device = SimpleNamespace(
        is_gpu=True,
        name="Fake H100",
        torch=torch.device("cpu"),
        synchronize=lambda: None,
        reset_peak_memory=lambda: None,
        peak_memory_gb=lambda: None,
        move=lambda t: t,
    )
    results = run_benchmark(setup.config, setup, tmp_path, clock=clock)
    for name, series in results.tests.items():
        energy = series.energy
        # recorded trials x batches x local batch; SYNTHETIC also trains one untimed step per trial
        samples = 2 * (4 + (name == "SYNTHETIC")) * 4
        assert energy["mean_power_w"] == pytest.approx(350.0) and energy["power_limit_w"] == 700.0, name
        assert energy["energy_j"] > 0 and energy["joules_per_sample"] * samples == pytest.approx(
            energy["energy_j"]
        )
        assert energy["samples_per_joule"] == pytest.approx(1 / energy["joules_per_sample"])
    assert ConstantGpu.closed
    (line,) = [line for line in bench_lines if line.startswith("BENCHY::ENERGY::")]
    assert "FULL" in line and "350 W of 700 W" in line and "90% utilization" in line
    record = json.loads(only_bench_record(tmp_path).read_text())
    assert record["summary"]["FULL"]["energy"]["mean_power_w"] == pytest.approx(350.0)


def test_each_bench_gets_a_file_of_its_own_in_the_run_directorys_bench_folder(tmp_path):
    cfg = bench_config()
    moment = datetime(2026, 11, 24, 3, 4, 5)
    first = default_bench_path(tmp_path, cfg.bench, moment)
    assert first == tmp_path / "bench" / "20261124-030405-benchy_result.json"
    first.parent.mkdir(parents=True)
    first.write_text("{}")
    second = default_bench_path(tmp_path, cfg.bench, moment)  # the same second: never over the first
    assert second == tmp_path / "bench" / "20261124-030405-2-benchy_result.json"
    absolute = bench_config(f"output_filename={tmp_path / 'mine.json'}")
    assert default_bench_path(tmp_path, absolute.bench, moment) == tmp_path / "mine.json"


def test_the_documented_bench_on_a_busy_machine_stays_compute_bound():
    # Measured on this 2-core machine with the test suite running beside it (FULL's second trial disturbed).
    busy = {
        "IO": series("IO", 27446.5, 33401.1),
        "SYNTHETIC": series("SYNTHETIC", 159.6, 160.4),
        "FULL": series("FULL", 162.6, 95.3),
    }
    verdict = decide_from_trials(busy)
    assert verdict.kind == "compute-bound" and "disturbed" not in verdict.reason
    # With the loader only a little faster than the step and scattered, the same means cannot be told apart.
    close = {**busy, "IO": series("IO", 150.0, 210.0)}
    within = decide_from_trials(close)
    assert within.kind == "within noise" and "SYNTHETIC / IO = " in within.reason and "0.90" in within.reason


def test_compute_bound_needs_the_whole_ratio_interval_under_the_margin():
    io = series("IO", 100, 100.5, 99.5)
    # SYNTHETIC / IO = 0.867 on the means, 95% interval 0.83-0.91: reaches past 0.90
    assert decide_from_trials({"IO": io, "SYNTHETIC": series("SYNTHETIC", 85, 88, 87)}).kind == "within noise"
    # the same mean with tight trials: 0.85-0.88
    assert (
        decide_from_trials({"IO": io, "SYNTHETIC": series("SYNTHETIC", 86, 87, 86.5)}).kind == "compute-bound"
    )
