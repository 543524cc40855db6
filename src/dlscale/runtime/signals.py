"""Graceful stops: SIGTERM and SIGUSR1 (Slurm's preemption and time-limit warnings) and Ctrl-C.

The handler only records the request; the training loop checks it after every step, writes a checkpoint and
returns normally. Ctrl-C while a stop is already pending (a second Ctrl-C, or one after SIGTERM) aborts at
once, for when the user does not want to wait for the checkpoint.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from types import FrameType

log = logging.getLogger(__name__)

GRACEFUL_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


class StopRequest:
    """Set by a signal (or by code, e.g. a test); read by the training loop."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._previous: dict[int, object] = {}
        self._owner_pid: int | None = None

    @property
    def requested(self) -> bool:
        return self.reason is not None

    def request(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._owner_pid:
            # A forked DataLoader worker inherited this handler. Ctrl-C and Slurm signal the whole process
            # group: the worker keeps serving batches and the training process stops everyone cleanly.
            return
        name = signal.Signals(signum).name
        if signum == signal.SIGINT and self.requested:
            raise KeyboardInterrupt  # second Ctrl-C: the user does not want to wait for the checkpoint
        if not self.requested:
            hint = " (press Ctrl-C again to abort without saving)" if signum == signal.SIGINT else ""
            log.warning("Received %s: stopping after the current step and saving a checkpoint%s", name, hint)
        self.request(name)

    def __enter__(self) -> StopRequest:
        self._owner_pid = os.getpid()
        if threading.current_thread() is threading.main_thread():  # signal handlers can only be set there
            for signum in GRACEFUL_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
