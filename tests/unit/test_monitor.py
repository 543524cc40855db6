"""The monitor with a scripted GPU backend: sampling, energy, summary, report and verdicts, cross-rank spread,
CSV and TensorBoard output, the training observer, and `dlscale monitor` without a GPU."""

from __future__ import annotations

import csv
import json
import logging
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from dlscale.cli import main
from dlscale.parallel.parallel_config import ParallelConfig
from dlscale.perf.monitor import (
    NO_GPU_MESSAGE,
    GpuStats,
    MetricsSampler,
    Sample,
    build_report,
    gpu_energy_j,
    summarize,
    verdict,
)
from dlscale.perf.monitor_config import MonitorConfig
from dlscale.perf.monitor_observer import MetricsCsv, MonitorObserver, gather_across_ranks, write_tensorboard
from dlscale.report.log_config import LogConfig
from dlscale.runtime.gpu_metrics import GpuReading, HostReading
from dlscale.runtime.local_ranks import run_ranks

HOST = HostReading(cpu_pct=25.0, memory_used_gb=4.0, memory_total_gb=16.0)


def reading(power_w, energy_j=None, utilization=90.0, memory=10.0, index=0) -> GpuReading:
    return GpuReading(index, "Fake H100", utilization, memory, 80.0, power_w, 700.0, energy_j, 60.0, 1980.0)


class FakeGpuBackend:
    """Returns the scripted readings in turn (the last one again when they run out)."""

    name = "fake"

    def __init__(self, script: list[list[GpuReading]]):
        self.script, self.calls, self.closed = script, 0, False

    def read(self) -> list[GpuReading]:
        self.calls += 1
        return self.script[min(self.calls, len(self.script)) - 1]

    def close(self) -> None:
        self.closed = True


class FakeClock:
    def __init__(self, step_s: float):
        self.now, self.step_s = 0.0, step_s

    def __call__(self) -> float:
        self.now += self.step_s
        return self.now


def sampled(script, step_s: float = 1.0) -> list[Sample]:
    sampler = MetricsSampler(FakeGpuBackend(script), clock=FakeClock(step_s), read_host_metrics=lambda: HOST)
    return [sampler.sample_once() for _ in script]


def test_sampler_thread_samples_and_stops_cleanly():
    backend = FakeGpuBackend([[reading(100.0)]])
    with MetricsSampler(backend, interval_s=0.01, read_host_metrics=lambda: HOST) as sampler:
        while len(sampler.samples) < 5:
            threading.Event().wait(0.005)
    assert not any(t.name == "dlscale-monitor" for t in threading.enumerate())
    count = len(sampler.samples)
    sampler.stop()  # idempotent
    assert len(sampler.samples) == count and backend.calls == count
    assert sampler.samples[0].gpus[0].power_w == 100.0 and sampler.samples[0].host == HOST
    assert 0 < sampler.overhead_fraction < 0.5  # a fake read is cheap next to 10 ms intervals


def test_energy_from_counter_and_from_power_integral():
    with_counter = summarize(
        sampled([[reading(100.0, 1000.0)], [reading(300.0, 1250.0)], [reading(200.0, 1400.0)]])
    )
    assert with_counter.gpus[0].energy_j == pytest.approx(400.0)
    assert with_counter.gpus[0].energy_source == "counter"
    # Trapezoids over 2 s steps: (100+300)/2*2 + (300+200)/2*2 = 900 J.
    without = summarize(sampled([[reading(100.0)], [reading(300.0)], [reading(200.0)]], step_s=2.0))
    assert without.gpus[0].energy_j == pytest.approx(900.0)
    assert without.gpus[0].energy_source == "power integral"
    # A counter that goes back (driver reload) is not trusted.
    reset = summarize(sampled([[reading(100.0, 1000.0)], [reading(100.0, 5.0)]]))
    assert reset.gpus[0].energy_j == pytest.approx(100.0) and reset.gpus[0].energy_source == "power integral"


def test_summary_and_report_arithmetic():
    summary = summarize(
        sampled(
            [[reading(100.0, 0.0, 80.0, 10.0)], [reading(300.0, 600.0, 100.0, 30.0)], [reading(200.0, 900.0)]]
        )
    )
    gpu = summary.gpus[0]
    assert gpu.mean_power_w == pytest.approx(200.0) and gpu.peak_power_w == 300.0
    assert gpu.mean_utilization_pct == pytest.approx(90.0) and gpu.peak_memory_gb == 30.0
    assert gpu.power_fraction == pytest.approx(200.0 / 700.0)
    assert summary.duration_s == pytest.approx(2.0) and summary.host_mean_cpu_pct == 25.0
    report = build_report(summary, samples_trained=300, samples_per_epoch=100)
    assert report.joules_per_sample == pytest.approx(3.0) and report.joules_per_epoch == pytest.approx(300.0)
    text = "\n".join(report.lines())
    assert "3.00 J per training sample" in text and "300 J per epoch" in text and "of 700 W limit" in text
    assert json.loads(json.dumps(report.to_json()))["joules_per_sample"] == pytest.approx(3.0)


def stats(utilization, power, limit=700.0) -> GpuStats:
    return GpuStats(0, "Fake", power, power, limit, utilization, 1.0, 80.0, 60.0, 1900.0, 0.0, "none")


def test_verdicts():
    assert verdict(stats(98.0, 180.0)).startswith(
        "GPU 0 averaged 180 W of 700 W while reporting 98% utilization: likely waiting on data"
    )
    assert "idle much of the time" in verdict(stats(30.0, 150.0))
    assert "GPU busy" in verdict(stats(95.0, 600.0))
    assert "moderately loaded" in verdict(stats(70.0, 400.0))
    assert "power unknown" in verdict(stats(95.0, 600.0, limit=None))


def test_no_gpu_degrades_to_host_only(caplog):
    samples = [MetricsSampler(None, read_host_metrics=lambda: HOST).sample_once() for _ in range(2)]
    summary = summarize(samples)
    assert summary.gpus == [] and summary.host_peak_memory_gb == 4.0
    assert build_report(summary, 10, 1).lines()[0] == NO_GPU_MESSAGE


def test_cross_rank_single_process_is_identity():
    result = gather_across_ranks({"power": 200.0, "missing": None}, slowness=0.5)
    assert result.spreads["power"].minimum == result.spreads["power"].maximum == 200.0
    assert result.slowest_rank == 0 and result.spreads["power"].per_rank == [200.0]


def gather_rank(rank: int) -> dict:
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=3)
    try:
        result = gather_across_ranks(
            {"power": 100.0 * (rank + 1), "util": None if rank == 1 else 50.0}, [0.1, 0.9, 0.2][rank]
        )
        return {"spreads": {k: vars(v) for k, v in result.spreads.items()}, "slowest": result.slowest_rank}
    finally:
        dist.destroy_process_group()


def test_cross_rank_min_max_mean_and_straggler():
    results = run_ranks(3, gather_rank, timeout_s=60)
    for result in results:
        power = result["spreads"]["power"]
        assert (power["minimum"], power["maximum"], power["mean"]) == (100.0, 300.0, pytest.approx(200.0))
        assert result["spreads"]["util"]["mean"] == 50.0  # the rank without a reading is left out
        assert result["slowest"] == 1


def test_csv_rows(tmp_path):
    samples = sampled(
        [[reading(100.0, 5.0), reading(50.0, index=1)], [reading(120.0, 7.0), reading(60.0, index=1)]]
    )
    path = tmp_path / "m.csv"
    MetricsCsv(path).append(samples)
    MetricsCsv(path).append([MetricsSampler(None, read_host_metrics=lambda: HOST).sample_once()])
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == 5 and [r["gpu"] for r in rows] == ["0", "1", "0", "1", ""]
    assert rows[2]["power_w"] == "120.0" and rows[1]["energy_j"] == "" and rows[2]["elapsed_s"] == "1.000"
    assert rows[4]["host_memory_used_gb"] == "4.0"


def test_tensorboard_tags(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path))
    write_tensorboard(
        writer, sampled([[reading(100.0), reading(50.0, index=1)], [reading(120.0), reading(60.0, index=1)]])
    )
    writer.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"GPU0/power_W", "GPU1/utilization_pct", "GPU0/memory_GB", "Host/cpu_pct"} <= tags
    assert [e.value for e in events.Scalars("GPU0/power_W")] == [100.0, 120.0]


def fake_trainer(run_dir: Path, gpu: bool):
    setup = SimpleNamespace(
        run_dir=run_dir,
        process=SimpleNamespace(rank=0, world_size=1, local_rank=0),
        device=SimpleNamespace(is_gpu=gpu, torch=SimpleNamespace(index=0) if gpu else "cpu"),
        plan=SimpleNamespace(steps_per_epoch=25),
        global_batch_size=4,
    )
    return SimpleNamespace(setup=setup, progress=SimpleNamespace(samples_seen=0), last_fetch_seconds=0.002)


@pytest.mark.parametrize("gpu", [True, False])
def test_observer_writes_csv_and_efficiency_json(tmp_path, caplog, gpu):
    backend = FakeGpuBackend([[reading(350.0, 0.0)], [reading(350.0, 700.0)], [reading(350.0, 1400.0)]])
    observer = MonitorObserver(
        MonitorConfig(monitor_interval_s=0.01),
        all_local_gpus=ParallelConfig().data_parallel == "dataparallel",
        tensorboard=LogConfig().tensorboard,
        backend_opener=lambda indices: backend if gpu else None,
    )
    trainer = fake_trainer(tmp_path, gpu)
    with caplog.at_level(logging.INFO, logger="dlscale.monitor"):
        observer.on_train_start(trainer)
        for _ in range(3):
            observer.on_step_start(trainer)
            observer.on_step_end(trainer, None)
        while len(observer.sampler.samples) < 3:
            threading.Event().wait(0.005)
        trainer.progress.samples_seen = 100
        observer.on_epoch_end(trainer, SimpleNamespace(epoch=1))
        observer.on_train_end(trainer, "finished")
    rows = list(csv.DictReader((tmp_path / "monitor" / "rank0.csv").open()))
    assert len(rows) == len(observer.sampler.samples) >= 4  # + the last sample at stop
    document = json.loads((tmp_path / "monitor" / "efficiency.json").read_text())
    assert document["samples_trained"] == 100 and document["samples_per_epoch"] == 100
    assert (NO_GPU_MESSAGE in caplog.text) is not gpu
    assert "Efficiency report" in caplog.text
    if gpu:
        assert document["energy_j"] == pytest.approx(1400.0) and backend.closed
        assert document["joules_per_sample"] == pytest.approx(14.0)
        assert document["joules_per_epoch"] == pytest.approx(1400.0)  # 25 steps x 4 samples x 14 J
        assert list((tmp_path / "tensorboard" / "monitor").glob("events.out.tfevents.*"))


def test_monitor_once_without_gpu(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr("dlscale.commands.monitor.open_gpu_backend", lambda: None)
    monkeypatch.setattr("dlscale.commands.monitor.CPU_WINDOW_S", 0.01)
    assert main(["monitor", "--once", "--csv", str(tmp_path / "once.csv")]) == 0
    out = capsys.readouterr().out
    assert NO_GPU_MESSAGE in out and "host CPU" in out and "memory" in out
    assert len(list(csv.DictReader((tmp_path / "once.csv").open()))) == 1


def test_monitor_live_count_with_fake_gpu(capsys, monkeypatch):
    monkeypatch.setattr(
        "dlscale.commands.monitor.open_gpu_backend", lambda: FakeGpuBackend([[reading(180.0)]])
    )
    monkeypatch.setattr("dlscale.commands.monitor.CPU_WINDOW_S", 0.01)
    assert main(["monitor", "--count", "2", "--interval", "0.01"]) == 0
    out = capsys.readouterr().out
    assert out.count("Fake H100") == 2 and "180/700" in out and "(fake)" in out


def test_a_board_without_power_or_energy_readings_has_no_energy_not_zero():
    assert gpu_energy_j([0.0, 1.0, 2.0], [None, None, None], [None, None, None]) == (0.0, "none")
    assert gpu_energy_j([0.0, 1.0], [100.0, 300.0], [None, None]) == (200.0, "power integral")
