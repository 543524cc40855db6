"""A GPU whose metrics library cannot be used is reported once, with the reason; a CPU machine stays quiet.

Run on a CPU by faking: torch is made to see a CUDA GPU (``torch.cuda.is_available``), and the library's import
or its ``nvmlInit`` fails."""

from __future__ import annotations

import logging
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dlscale.perf.monitor.config import MonitorConfig
from dlscale.perf.monitor.observer import MonitorObserver
from dlscale.runtime import gpu_metrics
from dlscale.runtime.gpu_metrics import open_gpu_backend


@pytest.fixture
def fresh_warnings(monkeypatch):
    """Each test starts as a new process would: no warning given yet."""
    monkeypatch.setattr(gpu_metrics, "_warned", set())


def no_gpu_libraries(monkeypatch) -> None:
    """``import pynvml`` and ``import amdsmi`` fail as they do where the packages are missing."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "amdsmi", None)


def torch_sees_a_gpu(monkeypatch, present: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: present)
    monkeypatch.setattr(torch.version, "hip", None)  # a CUDA build: NVML is the library to expect


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_gpu_without_pynvml_gives_one_warning_naming_the_import_error(monkeypatch, caplog, fresh_warnings):
    no_gpu_libraries(monkeypatch)
    torch_sees_a_gpu(monkeypatch, True)
    with caplog.at_level(logging.DEBUG, logger="dlscale.monitor"):
        assert open_gpu_backend([0]) is None
        assert open_gpu_backend([0]) is None  # a second opener (e.g. another bench) repeats nothing
    warnings = warnings_of(caplog)
    assert len(warnings) == 1, warnings
    assert "NVML cannot be used" in warnings[0]
    assert "ModuleNotFoundError" in warnings[0] and "pynvml" in warnings[0]  # the real cause
    assert "nvidia-ml-py" in warnings[0]  # and what to do
    assert "\n" not in warnings[0]


def test_a_gpu_whose_nvml_init_fails_warns_with_the_nvml_error(monkeypatch, caplog, fresh_warnings):
    class NVMLError(Exception):
        pass

    def nvml_init() -> None:
        raise NVMLError("Driver Not Loaded")

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(nvmlInit=nvml_init))
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    torch_sees_a_gpu(monkeypatch, True)
    with caplog.at_level(logging.DEBUG, logger="dlscale.monitor"):
        assert open_gpu_backend([0]) is None
    warnings = warnings_of(caplog)
    assert len(warnings) == 1 and "NVMLError: Driver Not Loaded" in warnings[0], warnings
    assert "amdsmi" not in warnings[0]  # not a ROCm machine: amdsmi's absence is not the problem


def test_a_cpu_machine_warns_nothing(monkeypatch, caplog, fresh_warnings):
    no_gpu_libraries(monkeypatch)
    torch_sees_a_gpu(monkeypatch, False)
    with caplog.at_level(logging.DEBUG, logger="dlscale.monitor"):
        assert open_gpu_backend() is None
    assert warnings_of(caplog) == []


def observer_run(tmp_path: Path, gpu: bool, caplog) -> MonitorObserver:
    """A monitor observer (the real GPU opener) started and stopped on a fake trainer."""
    setup = SimpleNamespace(
        run_dir=tmp_path,
        process=SimpleNamespace(rank=0, world_size=1, local_rank=0),
        device=SimpleNamespace(is_gpu=gpu, torch=SimpleNamespace(index=0) if gpu else "cpu"),
        plan=SimpleNamespace(steps_per_epoch=2),
        global_batch_size=4,
    )
    trainer = SimpleNamespace(
        setup=setup, progress=SimpleNamespace(samples_seen=0, global_step=0), last_fetch_seconds=0.0
    )
    observer = MonitorObserver(MonitorConfig(monitor_interval_s=0.01))
    with caplog.at_level(logging.INFO, logger="dlscale.monitor"):
        observer.on_train_start(trainer)
        trainer.progress.samples_seen = 8
        observer.on_train_end(trainer, "finished")
    return observer


def test_a_gpu_run_without_nvml_warns_once_and_still_records_the_host(
    monkeypatch, caplog, tmp_path, fresh_warnings
):
    no_gpu_libraries(monkeypatch)
    torch_sees_a_gpu(monkeypatch, True)
    observer = observer_run(tmp_path, gpu=True, caplog=caplog)
    warnings = warnings_of(caplog)
    assert len(warnings) == 1 and "pynvml" in warnings[0], warnings
    assert observer.sampler.gpu_backend is None and (tmp_path / "monitor" / "rank0.csv").is_file()


def test_a_cpu_run_of_the_monitor_warns_nothing(monkeypatch, caplog, tmp_path, fresh_warnings):
    no_gpu_libraries(monkeypatch)
    torch_sees_a_gpu(monkeypatch, True)  # even on a GPU machine: a CPU run reads no GPU
    observer_run(tmp_path, gpu=False, caplog=caplog)
    assert warnings_of(caplog) == []
    assert "Efficiency report" in caplog.text
