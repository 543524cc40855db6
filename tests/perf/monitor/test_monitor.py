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
from fake_trainers import fake_trainer

from dlscale.cli import main
from dlscale.parallel.parallel_config import ParallelConfig
from dlscale.perf.monitor.config import MonitorConfig
from dlscale.perf.monitor.observer import MetricsCsv, MonitorObserver, gather_across_ranks, write_tensorboard
from dlscale.perf.monitor.sampler import (
    NO_GPU_MESSAGE,
    GpuStats,
    MetricsSampler,
    Sample,
    build_report,
    gpu_energy_j,
    summarize,
    verdict,
)
from dlscale.report.log_config import LogConfig
from dlscale.runtime.gpu_metrics import GpuReading, HostReading
from dlscale.runtime.local_ranks import run_ranks

HOST = HostReading(cpu_pct=25.0, process_memory_gb=0.75, memory_used_gb=4.0, memory_total_gb=16.0)


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


def sampled(script, step_s: float = 1.0, steps: list[int] | None = None) -> list[Sample]:
    """One sample per entry of ``script``, labelled with ``steps`` (training steps) when given."""
    labels = iter(steps if steps is not None else [None] * len(script))
    sampler = MetricsSampler(
        FakeGpuBackend(script),
        clock=FakeClock(step_s),
        read_host_metrics=lambda: HOST,
        current_step=lambda: next(labels),
    )
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
    assert summary.gpus == [] and summary.process_peak_memory_gb == 0.75
    assert summary.machine_peak_memory_used_gb == 4.0 and summary.machine_memory_total_gb == 16.0
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
    assert rows[4]["process_memory_gb"] == "0.75" and rows[4]["machine_memory_used_gb"] == "4.0"
    assert rows[4]["machine_memory_total_gb"] == "16.0" and rows[4]["step"] == ""  # sampled outside training


def test_tensorboard_tags(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from dlscale.report.tensorboard import TensorBoardLogger

    writer = TensorBoardLogger(tmp_path)
    script = [[reading(100.0), reading(50.0, index=1)], [reading(120.0), reading(60.0, index=1)]]
    samples = sampled(script, steps=[7, 8])
    write_tensorboard(writer, samples)
    writer.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"GPU0/power_W", "GPU1/utilization_pct", "GPU0/memory_GB", "Host/cpu_pct"} <= tags
    assert {"Host/process_memory_GB", "Host/machine_memory_used_GB"} <= tags
    assert [e.value for e in events.Scalars("GPU0/power_W")] == [100.0, 120.0]
    assert [e.step for e in events.Scalars("GPU0/power_W")] == [7, 8]  # the training steps
    assert [e.wall_time for e in events.Scalars("GPU0/power_W")] == pytest.approx(
        [s.wall_time for s in samples]
    )
    assert [e.value for e in events.Scalars("Host/process_memory_GB")] == [0.75, 0.75]
    with pytest.raises(ValueError, match="without a training step"):
        write_tensorboard(writer, sampled([[reading(100.0)]]))


class PhasedBackend(FakeGpuBackend):
    """Reads whatever the test says the GPU is doing now."""

    def __init__(self):
        super().__init__([])
        self.now = reading(80.0, utilization=5.0)

    def read(self) -> list[GpuReading]:
        return [self.now]


@pytest.mark.parametrize("steady_steps", [4, 2])
def test_the_verdict_judges_the_steady_steps_not_start_up_and_validation(tmp_path, steady_steps):
    # A short compiled run: the first step compiles, validation and the checkpoint follow the epoch's last
    # step, and in both the GPU idles. Averaged over the whole run it looks starved; its steps were not.
    backend = PhasedBackend()
    observer = MonitorObserver(
        MonitorConfig(monitor_interval_s=3600.0), backend_opener=lambda indices: backend
    )
    trainer = fake_trainer(tmp_path, gpu=True)
    steps = 1 + steady_steps
    trainer.setup.plan.steps_in_epoch = lambda epoch: steps
    idle, busy = reading(80.0, utilization=5.0), reading(650.0, utilization=97.0)
    observer.on_train_start(trainer)  # the sampler's thread takes its first sample, then waits an hour
    for step in range(1, steps + 1):
        observer.on_step_start(trainer)
        backend.now = idle if step == 1 else busy  # the first step compiles
        observer.sampler.sample_once()
        trainer.progress.global_step = trainer.progress.step_in_epoch = step
        observer.on_step_end(trainer, None)
    backend.now = idle  # validation and the checkpoint
    for _ in range(4):
        observer.sampler.sample_once()
    trainer.progress.samples_seen = 4 * steps
    observer.on_epoch_end(trainer, SimpleNamespace(epoch=1))
    observer.on_train_end(trainer, "finished")
    report = observer.report
    assert report.summary.gpus[0].mean_utilization_pct < 50  # the whole run
    assert report.steady.sample_count == steady_steps
    assert report.steady.gpus[0].mean_utilization_pct == pytest.approx(97.0)
    if steady_steps >= 3:
        assert report.verdicts == ["GPU 0 averaged 650 W of 700 W (93%) at 97% utilization: GPU busy"]
        assert any(line.startswith("While training steps ran (") for line in report.lines())
    else:  # too few samples to judge the steps by: the whole run is judged
        assert "idle much of the time" in report.verdicts[0]
        assert not any(line.startswith("While training steps ran") for line in report.lines())
    document = json.loads((tmp_path / "monitor" / "efficiency.json").read_text())
    assert document["steady"]["sample_count"] == steady_steps


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


def test_host_memory_is_the_process_own_not_the_machine():
    # The run's own process (with its loader workers) held 0.77 GB while the machine had 6.2 GB in use.
    host = HostReading(cpu_pct=40.0, process_memory_gb=0.77, memory_used_gb=6.2, memory_total_gb=23.5)
    busier = HostReading(cpu_pct=40.0, process_memory_gb=0.70, memory_used_gb=6.0, memory_total_gb=23.5)
    samples = [MetricsSampler(None, read_host_metrics=lambda h=h: h).sample_once() for h in (busier, host)]
    summary = summarize(samples)
    assert summary.process_peak_memory_gb == 0.77
    assert summary.machine_peak_memory_used_gb == 6.2 and summary.machine_memory_total_gb == 23.5
    host_line = build_report(summary, 10, 1).lines()[1]
    assert "process memory (with its loader workers) peak 0.77 GB" in host_line, host_line
    assert "machine: CPU mean 40%, memory used peak 6.2 of 23.5 GB" in host_line, host_line
    document = json.loads(json.dumps(build_report(summary, 10, 1).to_json()))
    assert document["summary"]["process_peak_memory_gb"] == 0.77
    assert document["summary"]["machine_peak_memory_used_gb"] == 6.2


def wait_for_sample_at(observer: MonitorObserver, step: int) -> None:
    """Wait until the sampler's thread has labelled a sample with ``step``."""
    while not any(sample.step == step for sample in observer.sampler.samples):
        threading.Event().wait(0.002)


def train_steps(observer: MonitorObserver, trainer, first: int, last: int) -> None:
    """Start at ``first`` (0 or a resumed step), take steps up to ``last`` and end, with samples at each."""
    trainer.progress.global_step = first
    observer.on_train_start(trainer)
    wait_for_sample_at(observer, first)
    for step in range(first + 1, last + 1):
        observer.on_step_start(trainer)
        trainer.progress.global_step = step  # the trainer counts the step before on_step_end
        observer.on_step_end(trainer, None)
        wait_for_sample_at(observer, step)
    observer.on_train_end(trainer, "finished")


def monitor_events(run_dir: Path, tag: str = "Host/cpu_pct"):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard" / "monitor"))
    events.Reload()
    return events.Scalars(tag)


def tensorboard_observer() -> MonitorObserver:
    return MonitorObserver(MonitorConfig(monitor_interval_s=0.005), tensorboard=True)


def test_monitor_scalars_are_written_at_training_steps(tmp_path):
    observer, trainer = tensorboard_observer(), fake_trainer(tmp_path, gpu=False)
    train_steps(observer, trainer, first=10, last=13)  # a run resumed at step 10
    events = monitor_events(tmp_path)
    samples = observer.sampler.samples
    # Every sample at the step it was taken at (several per step, as the sampler is faster than the steps),
    # with its own wall time: not a unix-millisecond step.
    assert sorted({event.step for event in events}) == [10, 11, 12, 13]
    assert [(e.step, e.wall_time) for e in events] == [(s.step, pytest.approx(s.wall_time)) for s in samples]
    rows = list(csv.DictReader((tmp_path / "monitor" / "rank0.csv").open()))
    assert [int(row["step"]) for row in rows] == [s.step for s in samples]


def test_a_resumed_run_hides_the_monitor_samples_of_the_lost_steps(tmp_path):
    trainer = fake_trainer(tmp_path, gpu=False)
    first = tensorboard_observer()
    train_steps(first, trainer, first=0, last=3)  # interrupted after step 3, last checkpoint at step 1
    second = tensorboard_observer()
    train_steps(second, trainer, first=1, last=2)
    shown = sorted((event.wall_time, event.step) for event in monitor_events(tmp_path))
    kept = [s for s in first.sampler.samples if s.step <= 1] + second.sampler.samples  # at 1: both attempts
    expected = sorted((s.wall_time, s.step) for s in kept)
    assert [step for _, step in shown] == [step for _, step in expected]
    assert [when for when, _ in shown] == pytest.approx([when for when, _ in expected])


def test_a_rollback_hides_the_monitor_samples_of_the_steps_trained_again(tmp_path):
    observer, trainer = tensorboard_observer(), fake_trainer(tmp_path, gpu=False)
    observer.on_train_start(trainer)
    for step in (1, 2, 3):
        trainer.progress.global_step = step
        observer.on_step_end(trainer, None)
        wait_for_sample_at(observer, step)
    trainer.progress.global_step = 1  # diverged at 3: back to the checkpoint of step 1
    observer.on_rollback(trainer, None)
    before_rollback = observer.flushed  # the samples the diverged attempt's writer got
    trainer.progress.global_step = 2
    observer.on_step_end(trainer, None)
    while not any(s.step == 2 for s in observer.sampler.samples[before_rollback:]):
        threading.Event().wait(0.002)
    observer.on_train_end(trainer, "finished")
    samples = observer.sampler.samples
    # The diverged attempt's samples show up to the checkpoint's step only; the new writer's all show.
    kept = [s for s in samples[:before_rollback] if s.step <= 1] + samples[before_rollback:]
    shown = sorted((event.wall_time, event.step) for event in monitor_events(tmp_path))
    expected = sorted((s.wall_time, s.step) for s in kept)
    assert [step for _, step in shown] == [step for _, step in expected]
