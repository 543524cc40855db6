"""Which signals ask for a graceful stop (DLSCALE_STOP_SIGNALS), and that the handler only records: the log line
comes when the training loop reads the request."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator

import pytest

from dlscale.errors import ConfigError
from dlscale.runtime.signals import (
    GRACEFUL_SIGNALS,
    STOP_SIGNALS_ENV,
    StopRequest,
    parse_signal,
    stop_signals,
)


@pytest.fixture
def saved_handlers() -> Iterator[None]:
    signums = (*GRACEFUL_SIGNALS, signal.SIGUSR2, signal.SIGHUP)
    before = {signum: signal.getsignal(signum) for signum in signums}
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


@pytest.mark.parametrize("text", ["USR2", "SIGUSR2", " usr2 ", str(int(signal.SIGUSR2))])
def test_a_signal_is_named_by_name_or_number(text: str) -> None:
    assert parse_signal(text) == signal.SIGUSR2


@pytest.mark.parametrize(
    ("text", "message"), [("USR3", "'USR3' is no signal"), ("KILL", "SIGKILL cannot ask")]
)
def test_an_unknown_or_uncatchable_signal_is_a_config_error(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        stop_signals({STOP_SIGNALS_ENV: f"USR2,{text}"})
    assert STOP_SIGNALS_ENV in str(raised.value)


def test_the_defaults_and_the_named_ones() -> None:
    assert stop_signals({}) == GRACEFUL_SIGNALS
    assert stop_signals({STOP_SIGNALS_ENV: "USR2, HUP,,TERM"}) == (
        *GRACEFUL_SIGNALS,
        signal.SIGUSR2,
        signal.SIGHUP,
    )


def test_a_configured_signal_stops_and_its_handler_is_restored(
    saved_handlers: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(STOP_SIGNALS_ENV, "USR2")
    received: list[int] = []
    signal.signal(signal.SIGUSR2, lambda signum, frame: received.append(signum))
    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGUSR2)  # its default action would end this process
        assert stop.requested and stop.reason == "SIGUSR2"
    os.kill(os.getpid(), signal.SIGUSR2)
    assert received == [signal.SIGUSR2]


def test_the_handler_records_and_the_first_read_logs(
    saved_handlers: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING), StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.reason == "SIGUSR1" and caplog.records == []  # nothing written inside the handler
        assert stop.requested and stop.requested
    assert [r.getMessage() for r in caplog.records] == [
        "Received SIGUSR1: stopping after the current step and saving a checkpoint"
    ]
