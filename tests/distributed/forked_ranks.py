"""Forked gloo ranks for distributed tests: each child sets torchrun's variables, so dlscale's own launch
detection and process-group start-up are what the tests exercise."""

from __future__ import annotations

import multiprocessing
import os
import socket
import traceback
from collections.abc import Callable
from typing import Any


def free_port() -> int:
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
    except BaseException:  # the parent re-raises it with the child's traceback
        results.put((rank, None, traceback.format_exc()))


def run_ranks(world_size: int, fn: Callable, *args: Any, timeout_s: float = 180) -> list[Any]:
    """Run ``fn(rank, *args)`` in ``world_size`` forked processes; return their results in rank order.

    ``fn`` must be a module-level function returning picklable values (numpy arrays, not tensors).
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
    try:
        for _ in processes:
            rank, value, error = results.get(timeout=timeout_s)
            if error is not None:
                failures.append(f"rank {rank} failed:\n{error}")
            outcomes[rank] = value
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    if failures:
        raise AssertionError("\n".join(failures))
    return [outcomes[rank] for rank in range(world_size)]
