"""Forked local ranks: results in rank order, a failing rank's traceback, and a rank lost to a signal at once."""

from __future__ import annotations

import os
import signal
import time

import pytest

from dlscale.runtime.local_ranks import run_ranks


def square(rank: int, offset: int) -> int:
    return rank * rank + offset


def fail_on_rank_1(rank: int) -> int:
    if rank == 1:
        raise ValueError("rank 1 cannot go on")
    return rank


def crash_on_rank_1(rank: int) -> int:
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return rank


def test_results_come_back_in_rank_order():
    assert run_ranks(3, square, 1, timeout_s=60) == [1, 2, 5]


def test_a_failing_rank_raises_with_its_traceback():
    with pytest.raises(RuntimeError, match=r"rank 1 failed:(.|\n)*ValueError: rank 1 cannot go on"):
        run_ranks(2, fail_on_rank_1, timeout_s=60)


def test_a_rank_killed_by_a_signal_is_reported_at_once_not_at_the_timeout():
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 1 exit code -9"):
        run_ranks(2, crash_on_rank_1, timeout_s=120)
    assert time.monotonic() - started < 60
