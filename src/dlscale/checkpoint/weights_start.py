"""Where a weights-only start took its weights from, so that the same command continues the run it began.

A weights-only start (``--resume PATH --resume_weights_only``: a fine-tune) is a new run from step 0. Each of
its checkpoints records where its weights came from (``meta.weights_start``, :func:`weights_start_record`): the
``--resume`` argument, the checkpoint file it named, that checkpoint's global step and a fingerprint of its
bytes. When the same command is launched again (after Ctrl-C, SIGTERM, a kill or a Slurm requeue), the run
directory already holds the fine-tune's own checkpoint; :func:`compare_with_record` tells whether the weights
the command names are the ones that checkpoint's run started from. If so the run continues from its own
checkpoint, which wins over the source even when the source has moved on since (the base run trained further):
the fine-tune's progress is what the command asks to continue.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlscale.checkpoint.sharded_files import HEADER_NAME, is_sharded_checkpoint

RECORD_KEY = "weights_start"  # the checkpoint's ``meta`` entry


def weights_start_record(argument: str, path: Path, payload: Mapping[str, Any]) -> dict[str, Any]:
    """What a weights-only start's checkpoints record of its source: ``argument`` as given to --resume, the
    checkpoint ``path`` it named, that checkpoint's global step (from its ``payload``) and its fingerprint."""
    progress = payload.get("progress")
    step = progress.get("global_step") if isinstance(progress, Mapping) else None
    return {
        "argument": _absolute(Path(argument).expanduser()),
        "path": _absolute(path),
        "global_step": step if isinstance(step, int) and not isinstance(step, bool) else None,
        **weights_fingerprint(path),
    }


def weights_fingerprint(path: Path) -> dict[str, Any]:
    """The sha256, size and modification time of a checkpoint file, or of a sharded checkpoint's header (written
    last, once per save: it names the save, and hashing it costs nothing next to the shards)."""
    file = path / HEADER_NAME if is_sharded_checkpoint(path) else path
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        stat = os.fstat(f.fileno())
        while chunk := f.read(16 * 1024 * 1024):
            digest.update(chunk)
    return {"sha256": digest.hexdigest(), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


@dataclass(frozen=True)
class SourceCheck:
    """Whether the weights a command names are those a run started from, and how that source stands now."""

    same: bool
    note: str = ""  # the source changed or is gone since the run started from it ("" when it is as it was)


def compare_with_record(
    argument: str, source: Path | None, problem: str, record: Mapping[str, Any], own_latest: Path
) -> SourceCheck:
    """Whether ``argument`` (--resume as given; ``source`` the checkpoint it names, or None with the
    ``problem`` that prevents reading it) names the weights that ``record`` (a run's ``meta.weights_start``) says
    the run in ``own_latest``'s directory started from: the same argument or file (whatever it holds now), or
    elsewhere a file with the same bytes."""
    started = describe_record(record)
    if _absolute(Path(argument).expanduser()) == record.get("argument") or (
        source is not None and _same_file(source, record.get("path"))
    ):
        if source is None:
            return SourceCheck(
                True,
                f"The weights-only source {argument} cannot be read now, which this run does not need: {problem}",
            )
        if _same_file(source, str(own_latest)) or not _changed(source, record):
            return SourceCheck(True)
        return SourceCheck(
            True,
            f"{source} has changed since this run took its weights from it ({started}); this run's own "
            "checkpoint wins and the new weights are not used (to fine-tune from them, start a new run with "
            "another --run_num)",
        )
    if source is not None and record.get("sha256") and _fingerprint_of(source) == record["sha256"]:
        return SourceCheck(True)  # the same bytes, moved or copied
    return SourceCheck(False)


def describe_record(record: Mapping[str, Any]) -> str:
    """'runs/base/00/checkpoints/ckpt_latest.pt at its global step 22', for messages."""
    step = record.get("global_step")
    return f"{record.get('path', '?')}{f' at its global step {step}' if step is not None else ''}"


def _changed(source: Path, record: Mapping[str, Any]) -> bool:
    """Whether ``source`` holds other bytes than when ``record`` was made (its size and modification time
    alone say 'unchanged'; anything else is settled by the sha256)."""
    file = source / HEADER_NAME if is_sharded_checkpoint(source) else source
    try:
        stat = file.stat()
    except OSError:
        return True
    if stat.st_size == record.get("size") and stat.st_mtime_ns == record.get("mtime_ns"):
        return False
    return _fingerprint_of(source) != record.get("sha256")


def _fingerprint_of(source: Path) -> str | None:
    try:
        return weights_fingerprint(source)["sha256"]
    except OSError:
        return None


def _same_file(path: Path, recorded: Any) -> bool:
    """``path`` is ``recorded`` by its absolute name (a sharded ``ckpt_latest`` link is the same whichever
    save it points to) or after resolving links."""
    if not isinstance(recorded, str):
        return False
    if _absolute(path) == recorded:
        return True
    try:
        return path.resolve() == Path(recorded).resolve()
    except OSError:
        return False


def _absolute(path: Path) -> str:
    """An absolute name without resolving links (a sharded ``ckpt_latest`` link keeps its own name)."""
    return os.path.abspath(path)
