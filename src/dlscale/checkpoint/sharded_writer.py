"""Writing a run's sharded checkpoints: every rank its own shards, in parallel, optionally in the background.

A save goes into a new directory ``ckpt_step<step>`` (see :mod:`dlscale.checkpoint.sharded_files`); once every
rank's shards and DCP's metadata are there, rank 0 writes the header, points ``ckpt_latest`` (and ``ckpt_best``)
at the directory, and removes the directories no pointer and no ``keep_last`` keeps. A crash or ``kill -9`` at any
instant therefore leaves the previous checkpoint as the latest one, complete.

With ``asynchronous``, a save only blocks the training loop while the tensors are copied to host memory (pinned
on a GPU, so the copy is fast; from torch 2.13 the buffers are kept for the next save, so the staging memory is
one copy of this rank's shards); a thread writes them, and the next save first waits for the previous one.
Completed saves are published at the next call of :meth:`ShardedCheckpointWriter.poll` (every step) or at
:meth:`ShardedCheckpointWriter.finish`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import time
import warnings
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dlscale.checkpoint.directory import CheckpointDir
from dlscale.checkpoint.sharded_files import (
    HEADER_NAME,
    SINGLE_PROCESS_WARNING,
    dcp_failures,
    is_complete,
    root_cause,
    single_process_quiet,
    write_header,
)
from dlscale.errors import CheckpointError, exception_line
from dlscale.runtime.atomic_files import write_atomically
from dlscale.runtime.device import Device
from dlscale.runtime.distributed import barrier, is_distributed, share_text_from_main
from dlscale.runtime.storage import as_storage_error

log = logging.getLogger("dlscale.train")


@dataclass
class PendingSave:
    """A save whose shards are being written: published when ``future`` is done."""

    directory: Path
    header: dict[str, Any]
    is_best: bool
    future: Future | None  # None: written synchronously already
    started: float


class ShardedCheckpointWriter:
    """Writes ``checkpoints``' sharded checkpoints; every rank makes one and calls it at the same points."""

    def __init__(self, checkpoints: CheckpointDir, is_main: bool, asynchronous: bool, device: Device):
        self.checkpoints = checkpoints
        self.is_main = is_main
        self.asynchronous = asynchronous
        self.device = device  # the staging copy is pinned on a GPU; rank 0's choices are sent from it
        self.pending: PendingSave | None = None
        self._group: Any = None
        self._stager: Any = None

    def save(self, tensors: dict[str, Any], header: dict[str, Any], step: int, is_best: bool) -> Path:
        """Write ``tensors`` (this rank's, see :mod:`dlscale.checkpoint.distributed_state`) and, on rank 0, the
        ``header``; return the checkpoint's directory. Asynchronous saves return once the tensors are staged."""
        self._complete()  # the previous save first: saves never overlap, and it is published before this one
        directory = self._new_directory(step)
        began = time.monotonic()
        if self.asynchronous:
            future = self._write_async(tensors, directory)
            self.pending = PendingSave(directory, header, is_best, future, began)
        else:
            self._write(tensors, directory)
            self.pending = PendingSave(directory, header, is_best, None, began)
            self._complete()
        return directory

    def poll(self) -> Path | None:
        """Publish the pending save if its shards are written; its directory, or None (no collective)."""
        pending = self.pending
        if pending is None or (pending.future is not None and not pending.future.done()):
            return None
        return self._complete()

    def finish(self) -> Path | None:
        """Wait for the pending save (if any) and publish it; its directory, or None. Every rank calls it at the
        same point, and returns once rank 0 has published (so all of them then read the same latest checkpoint)."""
        try:
            return self._complete()
        finally:
            barrier()

    def _complete(self) -> Path | None:
        pending, self.pending = self.pending, None
        if pending is None:
            return None
        if pending.future is not None:
            try:
                pending.future.result()
            except dcp_failures() as exc:  # reported with the directory and what stays the latest
                raise self._failed(pending.directory, exc) from exc
        if self.is_main:
            self._publish(pending)
        return pending.directory

    def close(self) -> None:
        """Finish the pending save and free the staging buffers (at the end of a run)."""
        try:
            self.finish()
        finally:
            if self._stager is not None:
                with contextlib.suppress(Exception):
                    self._stager.close()
                self._stager = None

    # ------------------------------------------------------------------------------------------- writing
    def _new_directory(self, step: int) -> Path:
        """``ckpt_step<step>``, chosen by rank 0 for all ranks: emptied of an interrupted save's leftovers, or
        ``ckpt_step<step>-<n>`` when that name is the latest or best checkpoint already (a run continued from an
        earlier checkpoint of its own reaches the step again)."""
        name = None
        if self.is_main:
            self.checkpoints.directory.mkdir(parents=True, exist_ok=True)
            name, attempt = f"ckpt_step{step:08d}", 1
            while self._pointed_at(self.checkpoints.directory / name):
                name, attempt = f"ckpt_step{step:08d}-{attempt}", attempt + 1
            shutil.rmtree(
                self.checkpoints.directory / name, ignore_errors=True
            )  # a save that never completed
        # No rank writes before rank 0 has named the directory and cleared it.
        return self.checkpoints.directory / share_text_from_main(name, self.device)

    def _writer(self, directory: Path) -> Any:
        from torch.distributed.checkpoint import FileSystemWriter

        return FileSystemWriter(str(directory), single_file_per_rank=True, sync_files=True, overwrite=True)

    def _write(self, tensors: dict[str, Any], directory: Path) -> None:
        import torch.distributed.checkpoint as dcp

        try:
            with single_process_quiet():
                dcp.save(tensors, storage_writer=self._writer(directory), no_dist=not is_distributed())
        except dcp_failures() as exc:  # every rank's failure, in DCP's wrapping
            raise self._failed(directory, exc) from exc

    def _write_async(self, tensors: dict[str, Any], directory: Path) -> Future:
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        if self._stager is None or not stager_reusable():
            # Staged synchronously (the loop must not change the weights while they are copied), written by a
            # thread; pinned host memory where there is a GPU. The stager keeps its buffers between saves.
            self._stager = DefaultStager(StagingOptions(self.device.is_gpu, False, False, False))
        if is_distributed() and self._group is None:
            # The background thread's collectives need a CPU group of their own (all ranks make it here).
            self._group = dist.new_group(backend="gloo")
        if not is_distributed():
            # The background thread warns too, outside any catch_warnings of this one: filtered for the process.
            warnings.filterwarnings("ignore", message=SINGLE_PROCESS_WARNING)
        try:
            with single_process_quiet():
                result = dcp.async_save(
                    tensors,
                    storage_writer=self._writer(directory),
                    process_group=self._group,
                    async_stager=self._stager,
                    no_dist=not is_distributed(),
                )
        except dcp_failures() as exc:
            raise self._failed(directory, exc) from exc
        return getattr(result, "upload_completion", result)

    def _failed(self, directory: Path, exc: BaseException) -> Exception:
        cause = root_cause(exc)
        previous = self.checkpoints.latest_path
        stays = (
            f"{previous} stays the latest checkpoint" if previous.exists() else "no checkpoint was written"
        )
        storage = as_storage_error(cause, directory, f"cannot write the sharded checkpoint ({stays})")
        if storage is not None:
            return storage
        return CheckpointError(
            f"{directory}: cannot write the sharded checkpoint ({exception_line(cause)}); {stays}"
        )

    # ---------------------------------------------------------------------------------------- publishing
    def _publish(self, pending: PendingSave) -> None:
        write_header(pending.directory, pending.header)
        self._point(CheckpointDir.SHARDED_LATEST_NAME, pending.directory)
        if pending.is_best:
            self._point(CheckpointDir.SHARDED_BEST_NAME, pending.directory)
        self._prune()
        if pending.future is not None:
            log.info(
                "Checkpoint %s written in the background (%.1f s since its save began)",
                pending.directory,
                time.monotonic() - pending.started,
            )

    def _point(self, name: str, directory: Path) -> None:
        link = self.checkpoints.directory / name
        write_atomically(link, lambda tmp: os.symlink(directory.name, tmp))

    def _pointed_at(self, directory: Path) -> bool:
        return directory.resolve() in self._kept_by_pointers()

    def _kept_by_pointers(self) -> set[Path]:
        links = (CheckpointDir.SHARDED_LATEST_NAME, CheckpointDir.SHARDED_BEST_NAME)
        return {
            (self.checkpoints.directory / n).resolve()
            for n in links
            if (self.checkpoints.directory / n).exists()
        }

    def _prune(self) -> None:
        """Remove every step directory but the pointers' and the ``keep_last`` newest complete ones."""
        kept = self._kept_by_pointers()
        complete = [d for d in self.checkpoints.numbered_directories() if is_complete(d)]
        if self.checkpoints.keep_last:
            kept |= {d.resolve() for d in complete[-self.checkpoints.keep_last :]}
        for directory in self.checkpoints.numbered_directories():
            if directory.resolve() not in kept:
                # The header first: a removal cut short by a kill leaves an incomplete directory, never one
                # that looks complete with shards missing (the next save's pruning removes the rest).
                with contextlib.suppress(OSError):
                    (directory / HEADER_NAME).unlink(missing_ok=True)
                shutil.rmtree(directory, ignore_errors=True)


@functools.cache
def stager_reusable() -> bool:
    """Whether one DCP stager stages more than one save: torch 2.11's closes itself after each staging (a second
    one fails), torch 2.13's keeps its host buffers for the next save. Tried once, on a tiny tensor."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    stager = DefaultStager(StagingOptions(False, False, False, False))
    try:
        for _ in range(2):
            stager.stage({"probe": torch.zeros(2)})
        return True
    except Exception:  # noqa: BLE001 - whatever the closed stager raises (a KeyError in torch 2.11)
        return False
    finally:
        with contextlib.suppress(Exception):
            stager.close()
