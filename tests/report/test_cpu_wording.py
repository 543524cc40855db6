"""A CPU run says what it ran on: no 'per GPU', no 'tf32 on', no NaN summaries of readings nobody took."""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path
from types import SimpleNamespace

from dlscale.perf.bench.report import utilization_line
from dlscale.perf.monitor.observer import CrossRankSummary, RankSpread
from dlscale.report.console import ConsoleReporter, performance_line
from dlscale.run.assembly import describe_execution


def epoch_report(memory: dict[str, float]) -> SimpleNamespace:
    return SimpleNamespace(
        epoch=1,
        train_seconds=2.0,
        samples_per_second=10.0,
        train_loss=0.5,
        validation=SimpleNamespace(loss=0.4, seconds=0.1, lines=[]),
        tflops_per_gpu=0.0123,
        mfu=None,
        peak_memory_gb=memory,
    )


def test_performance_line_names_the_device_it_ran_on():
    cpu = performance_line(epoch_report({"host_rss": 1.5}), on_gpu=False)
    assert "0.0123 TFLOP/s per CPU process" in cpu and "GPU" not in cpu
    gpu = performance_line(epoch_report({"allocated": 1.0, "reserved": 2.0}), on_gpu=True)
    assert "0.0123 TFLOP/s per GPU" in gpu
    assert "TFLOP/s per device" in performance_line(epoch_report({}))  # the caller did not say


def test_console_reporter_asks_the_run_s_device(caplog):
    for is_gpu, expected in ((False, "per CPU process"), (True, "per GPU")):
        trainer = SimpleNamespace(setup=SimpleNamespace(device=SimpleNamespace(is_gpu=is_gpu)))
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="dlscale.train"):
            ConsoleReporter().on_epoch_end(trainer, epoch_report({}))
        assert f"TFLOP/s {expected}" in caplog.text
        assert ("per GPU" in caplog.text) is is_gpu


def test_utilization_line_wording_per_device_and_unchanged_json_keys():
    numbers = {"FULL": {"tflops_per_gpu": 0.5, "mfu": None}}
    assert "FULL 0.500 TFLOP/s per CPU process (x)" in utilization_line(numbers, "x", on_gpu=False)
    assert "FULL 0.500 TFLOP/s per GPU" in utilization_line(numbers, "x", on_gpu=True)
    generic = utilization_line(numbers, "x")
    assert "TFLOP/s per device" in generic and "GPU" not in generic


def test_execution_phrase_names_tf32_only_on_a_gpu(tiny_config):
    cfg = tiny_config("train.tf32=true")
    assert "tf32" not in describe_execution(cfg, on_gpu=False)
    assert "tf32 on" in describe_execution(cfg, on_gpu=True)
    assert "tf32 off" in describe_execution(tiny_config("train.tf32=false"), on_gpu=True)


def test_cross_rank_lines_leave_out_readings_no_rank_took():
    nan = math.nan
    ranks = CrossRankSummary(
        spreads={
            "mean_power_w": RankSpread(nan, nan, nan, [nan, nan]),  # a CPU run: no power reading anywhere
            "input_wait_s_per_step": RankSpread(0.1, 0.3, 0.2, [0.1, 0.3]),
        },
        slowest_rank=1,
        slowest_value=0.3,
        mean_slowness=0.2,
    )
    lines = ranks.spread_lines()
    assert lines == ["across ranks input_wait_s_per_step: min 0.1, max 0.3, mean 0.2"]


def test_a_real_cpu_run_prints_no_gpu_wording_and_no_nan(tiny_config):
    from dlscale.run.training import train

    cfg = tiny_config("train.num_epochs=1", "log.tensorboard=false", "checkpoint.enabled=false")
    assert train(cfg) == 0
    log = (Path(cfg.log.expdir) / cfg.name / cfg.log.run_num / "out.log").read_text()
    assert re.search(r"Performance: \S+ TFLOP/s per CPU process", log), log
    assert "per GPU" not in log and "tf32" not in log
    assert "Execution: amp" in log  # the phrase is still there, without TF32
    assert "Efficiency report" in log and "nan" not in log.lower()


def test_the_tensorboard_tag_of_tflops_is_device_neutral():
    from dlscale.report.metrics_observer import epoch_scalars

    report = epoch_report({"host_rss": 1.5})
    report.learning_rate, report.iterations_per_second = 1e-3, 5.0
    report.validation = SimpleNamespace(
        loss=0.4, seconds=0.1, scalars={}, baseline_name=None, baseline_scalars={}
    )
    values = epoch_scalars(report)
    assert values["Performance/TFLOP/s per device"] == 0.0123
    assert not [tag for tag in values if "GPU" in tag]
