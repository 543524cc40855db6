"""Run a function on N local ranks forked from this process, each with torchrun's variables set.

For tests and benchmarks on one machine: each child sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR and MASTER_PORT, so dlscale's own launch detection and process-group start-up are what runs, without
torchrun's start-up cost (forking reuses the parent's imported modules). Children use one thread each, so N ranks
on a small machine do not oversubscribe its cores.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any


def free_port() -> int:
    """A TCP port nobody listens on now, for the ranks' rendezvous."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _child(rank: int, world_size: int, port: int, fn: Callable, args: tuple, results: Any) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    import torch

    torch.set_num_threads(1)
    try:
        results.put((rank, fn(rank, *args), None))
    except BaseException:  # the parent raises it with the child's traceback
        results.put((rank, None, traceback.format_exc()))


def _raise_if_lost(processes: list, outcomes: dict, results: Any, deadline: float, timeout_s: float) -> None:
    """Raise when a rank ended without a result, or the time is up.

    A rank killed by a signal (or a crash) reports nothing: this says so at once rather than at the timeout.
    ``results.empty()`` is the last look for a result still on its way through the pipe.
    """
    lost = [r for r, p in enumerate(processes) if r not in outcomes and p.exitcode not in (None, 0)]
    if lost and results.empty():
        codes = ", ".join(f"rank {r} exit code {processes[r].exitcode}" for r in lost)
        raise RuntimeError(f"ranks ended without a result ({codes}; negative: killed by that signal)")
    if time.monotonic() > deadline:
        waiting = [r for r in range(len(processes)) if r not in outcomes]
        raise RuntimeError(f"no result from ranks {waiting} within {timeout_s} s")


def run_ranks(world_size: int, fn: Callable, *args: Any, timeout_s: float = 300) -> list[Any]:
    """Run ``fn(rank, *args)`` in ``world_size`` forked processes; return their results in rank order.

    ``fn`` must be a module-level function returning picklable values (numpy arrays, not tensors). A rank that
    fails makes this raise RuntimeError with every failing rank's traceback.
    """
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    port = free_port()
    processes = [
        context.Process(target=_child, args=(rank, world_size, port, fn, args, results), daemon=True)
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    outcomes: dict[int, Any] = {}
    failures = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(outcomes) < world_size:
            try:
                rank, value, error = results.get(timeout=1.0)
            except queue.Empty:
                _raise_if_lost(processes, outcomes, results, deadline, timeout_s)
                continue
            if error is not None:
                failures.append(f"rank {rank} failed:\n{error}")
            outcomes[rank] = value
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    if failures:
        raise RuntimeError("\n".join(failures))
    return [outcomes[rank] for rank in range(world_size)]
