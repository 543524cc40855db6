"""zarr writes that are over when a failed write returns, so that its temporary directory can be removed.

zarr 3 writes the chunks of one assignment (``array[...] = values``, xarray's ``to_zarr``) as tasks on its own
event loop, each chunk's file in a thread of its pool. When one chunk fails (a full disk), the assignment
raises at once while the other tasks go on writing, and each recreates its chunk's directories: a temporary
store removed at that moment came back, half written, after the error (``stats/.climatology.zarr.tmp-*``
filling the disk that had just filled). :func:`zarr_writes_finished_on_failure` waits for them before the
failure goes on to the code that cleans up. zarr 2 writes in the calling thread: nothing to wait for.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import Iterator

log = logging.getLogger("dlscale.data")

# A file server that hangs must not hang the end of the command for ever: the cleanup then goes ahead.
WAIT_LIMIT_S = 120.0


@contextlib.contextmanager
def zarr_writes_finished_on_failure(limit_s: float = WAIT_LIMIT_S) -> Iterator[None]:
    """On any exception inside the block, wait for zarr's writes still running before it propagates."""
    try:
        yield
    except BaseException:
        wait_for_zarr_writes(limit_s)
        raise


def wait_for_zarr_writes(limit_s: float = WAIT_LIMIT_S) -> bool:
    """Wait until zarr 3's event loop has no task left (every chunk write that was started has ended, failed or
    not); True when it got there within ``limit_s`` seconds (at once with zarr 2, or before zarr's first use)."""
    loop = _zarr_loop()
    if loop is None:
        return True

    async def others_finished() -> None:
        this = asyncio.current_task()
        while pending := [task for task in asyncio.all_tasks() if task is not this]:
            # A task may start others (a chunk's write, its directory): look again until none is left.
            await asyncio.wait(pending)

    future = asyncio.run_coroutine_threadsafe(others_finished(), loop)
    try:
        future.result(timeout=limit_s)
    except concurrent.futures.TimeoutError:
        future.cancel()
        log.warning("zarr's writes did not end within %.0f s; removing the unfinished store anyway", limit_s)
        return False
    return True


def _zarr_loop() -> asyncio.AbstractEventLoop | None:
    """zarr 3's event loop while it runs; None with zarr 2 (which has no such loop) or before zarr used it."""
    try:
        from zarr.core import sync
    except ImportError:
        return None
    holder = getattr(sync, "loop", None)  # zarr 3 keeps its loop in a one-element list, made on first use
    loop = holder[0] if isinstance(holder, list) and holder else None
    if not isinstance(loop, asyncio.AbstractEventLoop) or loop.is_closed() or not loop.is_running():
        return None
    return loop
