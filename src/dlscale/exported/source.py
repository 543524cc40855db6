"""Which checkpoint ``dlscale export SOURCE [--checkpoint best|latest|PATH]`` exports, and loading it.

SOURCE is a run directory (``runs/<config>/<run_num>``), its ``checkpoints/`` directory, or a checkpoint file.
What is not one is refused before anything is built, with what it looks like: the choice and its messages are
``dlscale evaluate``'s (:mod:`dlscale.checkpoint.selection`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlscale.checkpoint.files import NotADlscaleCheckpoint, load_checkpoint
from dlscale.checkpoint.selection import choose_checkpoint
from dlscale.checkpoint.trained_run import expects
from dlscale.errors import CheckpointError

EXPORT_EXPECTS = expects("export")
# What a checkpoint must hold to be exported.
_NEEDED_ENTRIES = ("model", "config", "meta")


def checkpoint_to_export(source: Path, which: str | None = None) -> Path:
    """The checkpoint file that ``source`` and ``--checkpoint which`` (None: latest) name, chosen as ``dlscale
    evaluate`` chooses (:func:`dlscale.checkpoint.selection.choose_checkpoint`): CheckpointError (one line) when
    ``source`` does not exist, is a file that plainly is no checkpoint, or a directory without the checkpoint
    asked for (naming what it holds instead)."""
    return choose_checkpoint(source, which, "export").checkpoint


def load_export_source(path: Path) -> dict[str, Any]:
    """The checkpoint at ``path``, with the entries an export reads; CheckpointError naming the file if not."""
    try:
        payload = load_checkpoint(path, map_location="cpu", optimizer=False)
    except NotADlscaleCheckpoint as exc:
        raise CheckpointError(f"{exc}; {EXPORT_EXPECTS}") from None
    for entry in _NEEDED_ENTRIES:
        if not isinstance(payload.get(entry), dict):
            raise CheckpointError(
                f"{path}: has no {entry!r} entry (a dict), which an export needs: a checkpoint of a dlscale "
                "training run has one"
            )
    return payload
