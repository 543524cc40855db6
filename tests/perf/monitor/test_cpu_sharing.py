"""A CPU run that other processes left far fewer cores than its threads gets a warning (the efficiency report's
``cpu_sharing``, a warning line in the log); a run that used its cores, left them idle by itself, has one
thread, or trains on a GPU gets none. Driven with a scripted host (the process's CPU time, the machine's CPU)."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest
import torch
from fake_trainers import fake_trainer

from dlscale.perf.monitor.config import MonitorConfig
from dlscale.perf.monitor.observer import MonitorObserver
from dlscale.perf.monitor.sampler import MetricsSampler, build_report, summarize
from dlscale.runtime.gpu_metrics import HostReading, read_host, usable_cpus


class ScriptedClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def host_samples(count: int, process_cores: float, machine_pct: float, machine_cpus: int = 2):
    """``count`` samples a second apart of a process running on ``process_cores`` on a machine whose CPUs
    (``machine_cpus`` of them) were ``machine_pct`` busy in all."""
    clock = ScriptedClock()

    def host() -> HostReading:
        return HostReading(
            machine_pct, 0.5, 4.0, 16.0, process_cpu_s=process_cores * clock.now, machine_cpus=machine_cpus
        )

    sampler = MetricsSampler(None, clock=clock, read_host_metrics=host)
    return [sampler.sample_once() for _ in range(count)]


def sharing(samples, threads: int = 2, cpus: int = 2):
    return build_report(summarize(samples), 10, 10, cpu_threads=(threads, cpus)).cpu_sharing


def test_two_runs_of_two_threads_on_two_cores_are_warned_about():
    # The case: a fine-tune beside a forecast on 2 cores, each with 2 threads, each got one core.
    summary = summarize(host_samples(5, process_cores=1.0, machine_pct=100.0))
    assert summary.process_mean_cpu_cores == pytest.approx(1.0) and summary.machine_cpus == 2
    warning = sharing(host_samples(5, process_cores=1.0, machine_pct=100.0))
    assert warning.startswith("CPU shared with other processes: this run's process ran on 1.0 cores")
    assert "for its 2 threads (torch.get_num_threads())" in warning
    assert "other processes kept 1.0 of the machine's 2 cores busy" in warning
    assert "OMP_NUM_THREADS=<cores / runs>" in warning
    # On a bigger machine, 8 threads that got 2 cores while others kept the other 14 of 16 busy.
    big = sharing(host_samples(5, process_cores=2.0, machine_pct=100.0, machine_cpus=16), threads=8, cpus=16)
    assert "ran on 2.0 cores on average for its 8 threads" in big and "14.0 of the machine's 16 cores" in big


@pytest.mark.parametrize(
    ("why", "process_cores", "machine_pct", "threads", "cpus", "count"),
    [
        ("it used its cores", 1.8, 100.0, 2, 2, 5),
        ("the cores it left idle, nobody took", 1.0, 55.0, 2, 2, 5),
        ("one thread waits for no other", 0.5, 100.0, 1, 2, 5),
        ("it may use one CPU only", 0.5, 100.0, 2, 1, 5),
        ("too short a run to judge", 1.0, 100.0, 2, 2, 2),
    ],
)
def test_no_warning_when_the_cores_were_not_taken_from_the_threads(
    why, process_cores, machine_pct, threads, cpus, count
):
    assert sharing(host_samples(count, process_cores, machine_pct), threads, cpus) is None, why


def test_a_gpu_run_and_readings_without_cpu_time_are_not_judged():
    samples = host_samples(5, process_cores=1.0, machine_pct=100.0)
    assert build_report(summarize(samples), 10, 10).cpu_sharing is None  # no cpu_threads: a GPU run
    plain = [
        MetricsSampler(None, read_host_metrics=lambda: HostReading(100.0, 0.5, 4.0, 16.0)).sample_once()
    ] * 5
    assert summarize(plain).process_mean_cpu_cores is None and sharing(plain) is None


def test_the_host_reading_has_this_process_cpu_time_and_the_machine_cpus():
    first = read_host()
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # busy: this process's CPU time grows
        pass
    second = read_host()
    assert second.process_cpu_s - first.process_cpu_s >= 0.04
    assert second.machine_cpus >= usable_cpus() >= 1


@pytest.mark.parametrize("gpu", [False, True])
def test_the_run_logs_the_warning_and_writes_it_to_efficiency_json(tmp_path, caplog, monkeypatch, gpu):
    # A process on one core of a busy 2-core machine, its torch with 2 threads.
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr("dlscale.perf.monitor.observer.usable_cpus", lambda: 2)

    def host() -> HostReading:
        return HostReading(100.0, 0.5, 4.0, 16.0, process_cpu_s=time.monotonic(), machine_cpus=2)

    observer = MonitorObserver(
        MonitorConfig(monitor_interval_s=0.01), backend_opener=lambda indices: None, host_reader=host
    )
    trainer = fake_trainer(tmp_path, gpu, steps_per_epoch=4, global_batch_size=2)
    with caplog.at_level(logging.INFO, logger="dlscale.monitor"):
        observer.on_train_start(trainer)
        for step in range(1, 5):
            observer.on_step_start(trainer)
            trainer.progress.global_step = trainer.progress.step_in_epoch = step
            observer.on_step_end(trainer, None)
        while len(observer.sampler.samples) < 6:
            threading.Event().wait(0.005)
        trainer.progress.samples_seen = 8
        observer.on_train_end(trainer, "finished")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    document = json.loads((tmp_path / "monitor" / "efficiency.json").read_text())
    if gpu:  # the host process of a GPU run waits on the GPU: its CPU share says nothing
        assert warnings == [] and document["cpu_sharing"] is None
    else:
        assert len(warnings) == 1 and warnings[0].startswith("CPU shared with other processes"), warnings
        assert "ran on 1.0 cores on average for its 2 threads" in warnings[0]
        assert document["cpu_sharing"] == warnings[0]
        assert document["summary"]["process_mean_cpu_cores"] == pytest.approx(1.0, abs=0.05)
