"""Graceful stops: SIGTERM and SIGUSR1 (Slurm's preemption and time-limit warnings), Ctrl-C, and any signal named
in ``DLSCALE_STOP_SIGNALS``.

The handler only records the request: no collective, no log line, no I/O (a signal can land while the main thread
is inside a write to the same stream, or inside a collective). The training loop reads the request after a step,
says so in the log, agrees with the other ranks at its next agreement point, writes a checkpoint and returns
normally. Ctrl-C while a stop is already pending (a second Ctrl-C, or one after SIGTERM) aborts at once, for when
the user does not want to wait for the checkpoint.

``DLSCALE_STOP_SIGNALS`` (comma-separated names or numbers: ``USR2``, ``SIGUSR2``, ``12``) adds signals to the
default ones, for a batch system that warns with another signal (``sbatch --signal=USR2@300``; the Slurm
templates in ``scripts/slurm/`` set it from ``SBATCH_SIGNAL``).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Mapping
from types import FrameType

from dlscale.errors import ConfigError

log = logging.getLogger(__name__)

GRACEFUL_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
STOP_SIGNALS_ENV = "DLSCALE_STOP_SIGNALS"
# Signals a process cannot catch, or that report a fault of its own: stopping "gracefully" on them is no option.
_UNUSABLE = {signal.SIGKILL, signal.SIGSTOP, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL}


def parse_signal(text: str) -> signal.Signals:
    """A signal from its name (``USR2``, ``SIGUSR2``, any case) or number; ConfigError when there is none such or it
    cannot be a stop signal."""
    word = text.strip().upper()
    try:
        signum = (
            signal.Signals(int(word))
            if word.isdigit()
            else signal.Signals[word if word.startswith("SIG") else f"SIG{word}"]
        )
    except (KeyError, ValueError):
        raise ConfigError(
            f"{STOP_SIGNALS_ENV}: {text.strip()!r} is no signal; give names such as USR2 or SIGUSR2, or numbers, "
            "separated by commas"
        ) from None
    if signum in _UNUSABLE:
        raise ConfigError(
            f"{STOP_SIGNALS_ENV}: {signum.name} cannot ask for a graceful stop (it cannot be caught)"
        )
    return signum


def stop_signals(environ: Mapping[str, str] | None = None) -> tuple[signal.Signals, ...]:
    """The signals that ask for a stop: the default ones and those ``DLSCALE_STOP_SIGNALS`` names."""
    text = (os.environ if environ is None else environ).get(STOP_SIGNALS_ENV, "")
    extra = [parse_signal(word) for word in text.split(",") if word.strip()]
    return tuple(dict.fromkeys([*GRACEFUL_SIGNALS, *extra]))


class StopRequest:
    """Set by a signal (or by code, e.g. a test); read by the training loop."""

    def __init__(self, signals: tuple[int, ...] | None = None) -> None:
        """``signals``: those to catch (default: :func:`stop_signals`, read when the request is entered)."""
        self.reason: str | None = None
        self._signals = signals
        self._previous: dict[int, object] = {}
        self._owner_pid: int | None = None
        self._unannounced: int | None = None  # a signal the handler recorded and the log has not said yet

    @property
    def requested(self) -> bool:
        """Whether a stop was asked for. The first read after a signal logs it (the handler itself does not)."""
        if self._unannounced is not None:
            signum, self._unannounced = self._unannounced, None
            hint = " (press Ctrl-C again to abort without saving)" if signum == signal.SIGINT else ""
            log.warning(
                "Received %s: stopping after the current step and saving a checkpoint%s",
                signal.Signals(signum).name,
                hint,
            )
        return self.reason is not None

    def request(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Records and returns: no collective, no log line (see the module's docstring).
        if os.getpid() != self._owner_pid:
            # A forked DataLoader worker inherited this handler. Ctrl-C and Slurm signal the whole process
            # group: the worker keeps serving batches and the training process stops everyone cleanly.
            return
        if signum == signal.SIGINT and self.reason is not None:
            raise KeyboardInterrupt  # second Ctrl-C: the user does not want to wait for the checkpoint
        if self.reason is None:
            self._unannounced = signum
            self.reason = signal.Signals(signum).name

    def __enter__(self) -> StopRequest:
        signals = self._signals if self._signals is not None else stop_signals()
        self._owner_pid = os.getpid()
        if threading.current_thread() is threading.main_thread():  # signal handlers can only be set there
            for signum in signals:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
