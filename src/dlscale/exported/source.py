"""Which checkpoint ``dlscale export SOURCE [--checkpoint best|latest|PATH]`` exports, and loading it.

SOURCE is a run directory (``runs/<config>/<run_num>``), its ``checkpoints/`` directory, or a checkpoint file.
What is not one is refused before anything is built, with what it looks like (the messages of
:mod:`dlscale.checkpoint.resume`, which refuses the same things for ``--resume``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlscale.checkpoint.directory import CheckpointDir
from dlscale.checkpoint.files import NotADlscaleCheckpoint, foreign_file_kind, load_checkpoint
from dlscale.checkpoint.resume import directory_contents
from dlscale.errors import CheckpointError

LATEST, BEST = "latest", "best"
EXPORT_EXPECTS = (
    "dlscale export expects a run directory (runs/<config>/<run_num>), its checkpoints/ directory or a "
    "checkpoint file that dlscale wrote (ckpt_latest.pt, ckpt_best.pt, ckpt_step*.pt)"
)
# What a checkpoint must hold to be exported.
_NEEDED_ENTRIES = ("model", "config", "meta")


def checkpoint_to_export(source: Path, which: str | None = None) -> Path:
    """The checkpoint file that ``source`` and ``--checkpoint which`` (None: latest) name.

    CheckpointError (one line) when ``source`` does not exist, is a file that plainly is no checkpoint, or a
    directory without the checkpoint asked for (naming what it holds instead).
    """
    if source.is_file():
        if which is not None:
            raise CheckpointError(
                f"--checkpoint {which}: {source} is a checkpoint file already; give --checkpoint with a run "
                "directory only"
            )
        return _plain_checkpoint(source)
    if not source.is_dir():
        raise CheckpointError(f"{source}: does not exist; {EXPORT_EXPECTS}")
    directory = _checkpoints_of(source)
    which = which or LATEST
    if which == LATEST:
        if directory.latest_path.is_file():
            return directory.latest_path
        return _missing(source, directory, directory.LATEST_NAME)
    if which == BEST:
        if directory.best_path.is_file():
            return directory.best_path
        return _missing(source, directory, directory.BEST_NAME)
    path = Path(which).expanduser()
    for candidate in (path, directory.directory / path):
        if candidate.is_file():
            return _plain_checkpoint(candidate)
    raise CheckpointError(
        f"--checkpoint {which}: no such file, neither as given nor in {directory.directory}; give best, latest, "
        "or a checkpoint file"
    )


def load_export_source(path: Path) -> dict[str, Any]:
    """The checkpoint at ``path``, with the entries an export reads; CheckpointError naming the file if not."""
    try:
        payload = load_checkpoint(path, map_location="cpu")
    except NotADlscaleCheckpoint as exc:
        raise CheckpointError(f"{exc}; {EXPORT_EXPECTS}") from None
    for entry in _NEEDED_ENTRIES:
        if not isinstance(payload.get(entry), dict):
            raise CheckpointError(
                f"{path}: has no {entry!r} entry (a dict), which an export needs: a checkpoint of a dlscale "
                "training run has one"
            )
    return payload


def _plain_checkpoint(path: Path) -> Path:
    kind = foreign_file_kind(path)
    if kind is not None:
        raise CheckpointError(f"{path} is not a dlscale checkpoint ({kind}); {EXPORT_EXPECTS}")
    return path


def _checkpoints_of(source: Path) -> CheckpointDir:
    """The checkpoint directory of a run directory (its ``checkpoints/``), or ``source`` itself."""
    nested = source / "checkpoints"
    return CheckpointDir(nested if nested.is_dir() else source)


def _missing(source: Path, directory: CheckpointDir, name: str) -> Path:
    """Refuse ``source``, which has no checkpoint ``name``: say which others it holds, or what it holds."""
    nested = directory.directory != source
    missing = f"no checkpoints/{name}" if nested else f"no {name} (nor checkpoints/{name})"
    others = directory.other_checkpoints(include_latest=True)
    if others:
        chosen = {directory.LATEST_NAME: LATEST, directory.BEST_NAME: BEST}.get(
            others[0].name, others[0].name
        )
        holds = f", but holds {', '.join(p.name for p in others)}: export one with --checkpoint {chosen}"
    elif nested:
        holds = (
            f": its checkpoints/ directory {directory_contents(directory.directory).removeprefix(': it ')}"
        )
    else:
        holds = directory_contents(source)
    raise CheckpointError(f"{source} has {missing}{holds}; {EXPORT_EXPECTS}")
