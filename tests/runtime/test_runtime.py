"""The runtime layer: graceful-stop signals and the CPU side of the device layer (launch: test_launch.py)."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator

import pytest
import torch

from dlscale.errors import ConfigError
from dlscale.runtime.device import Device
from dlscale.runtime.signals import GRACEFUL_SIGNALS, StopRequest

# detect_process (launch detection) is tested in test_launch.py.

# ---- StopRequest -----------------------------------------------------------------------------------------


@pytest.fixture
def saved_handlers() -> Iterator[None]:
    """Put back whatever handlers the test run had, even if StopRequest failed to."""
    before = {signum: signal.getsignal(signum) for signum in GRACEFUL_SIGNALS}
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_signal_requests_a_stop_without_killing(
    signum: int, saved_handlers: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING), StopRequest() as stop:
        assert not stop.requested and stop.reason is None
        os.kill(os.getpid(), signum)
        assert stop.requested
        assert stop.reason == signal.Signals(signum).name
        os.kill(os.getpid(), signal.SIGTERM)  # a later signal neither kills nor changes the reason
        assert stop.reason == signal.Signals(signum).name
    assert signal.Signals(signum).name in caplog.text


def test_previous_handlers_are_restored(saved_handlers: None) -> None:
    received: list[int] = []

    def previous(signum: int, frame: object) -> None:
        received.append(signum)

    for signum in GRACEFUL_SIGNALS:
        signal.signal(signum, previous)
    with StopRequest() as stop:
        for signum in GRACEFUL_SIGNALS:
            assert signal.getsignal(signum) != previous
    for signum in GRACEFUL_SIGNALS:
        assert signal.getsignal(signum) == previous
    os.kill(os.getpid(), signal.SIGUSR1)
    assert received == [signal.SIGUSR1]
    assert not stop.requested  # the signal after exit went to the restored handler


def test_handlers_are_restored_after_an_exception(saved_handlers: None) -> None:
    before = {signum: signal.getsignal(signum) for signum in GRACEFUL_SIGNALS}
    with pytest.raises(RuntimeError), StopRequest():
        raise RuntimeError("training failed")
    assert {signum: signal.getsignal(signum) for signum in GRACEFUL_SIGNALS} == before


def test_first_ctrl_c_stops_gracefully_second_aborts(saved_handlers: None) -> None:
    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGINT)  # would raise KeyboardInterrupt without the handler
        assert stop.reason == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)


def test_request_from_code_keeps_the_first_reason() -> None:
    stop = StopRequest()
    stop.request("test")
    stop.request("later")
    assert stop.requested and stop.reason == "test"


# ---- Device ----------------------------------------------------------------------------------------------


def test_cpu_device_gpu_operations_are_no_ops() -> None:
    device = Device("cpu")
    assert not device.is_gpu
    assert device.torch == torch.device("cpu")
    assert device.synchronize() is None
    assert device.reset_peak_memory() is None
    assert device.peak_memory_gb() is None
    assert device.pin_memory_default is False
    assert "cpu" in device.name
    assert repr(device) == "Device(cpu)"


def test_move_keeps_a_cpu_tensor() -> None:
    device = Device(torch.device("cpu"))
    tensor = torch.arange(6.0).reshape(2, 3)
    moved = device.move(tensor)
    assert moved is tensor
    assert moved.device.type == "cpu"


def test_select_prefers_cpu_on_request(monkeypatch) -> None:
    assert Device.select(prefer_cpu=True).torch == torch.device("cpu")
    monkeypatch.setenv("DLSCALE_DEVICE", "cpu")
    assert Device.select().torch == torch.device("cpu")
    monkeypatch.setenv("DLSCALE_DEVICE", "tpu")
    with pytest.raises(ConfigError, match="DLSCALE_DEVICE must be auto, cpu or cuda"):
        Device.select()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_asking_for_cuda_without_a_gpu_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setenv("DLSCALE_DEVICE", "cuda")
    with pytest.raises(ConfigError, match="sees no CUDA GPU"):
        Device.select()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback; this machine has a GPU")
def test_select_is_the_cpu_without_a_gpu(monkeypatch) -> None:
    monkeypatch.setenv("DLSCALE_DEVICE", "auto")
    for local_rank in (0, 3):
        device = Device.select(local_rank)
        assert device.torch == torch.device("cpu")
        assert not device.is_gpu
