"""Which checkpoint a command that reads a finished run (``dlscale evaluate``, ``dlscale export``) takes, the run
directory around it, and whether a config fits it.

``dlscale evaluate RUN_DIR`` reads the run's ``checkpoints/ckpt_latest.pt`` (``--checkpoint best`` its
``ckpt_best.pt``, ``--checkpoint PATH`` any file, also one named relative to ``checkpoints/``) with the run's
``config.yaml``; ``dlscale evaluate FILE`` reads a checkpoint file, with the ``config.yaml`` of the run directory
it is in, if it is in one. ``dlscale export`` chooses the same way. What is not a checkpoint is refused before
anything is built, naming what it looks like and what the command expects.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlscale.checkpoint.directory import CheckpointDir
from dlscale.checkpoint.files import foreign_file_kind
from dlscale.checkpoint.resume import weight_key_changes, what_directory_holds
from dlscale.checkpoint.sharded_files import is_sharded_checkpoint
from dlscale.checkpoint.trained_run import CHOICES, CONFIG_FILE, expects
from dlscale.errors import CheckpointError


@dataclass(frozen=True)
class ChosenCheckpoint:
    """The checkpoint a command reads, and where its config and results are."""

    checkpoint: Path
    run_dir: Path | None  # whose config.yaml the evaluation reads (None: the config the checkpoint recorded)
    output_dir: Path  # holds eval/: the run directory, or the checkpoint's own directory outside of one

    @property
    def name(self) -> str:
        """How the results' directory names the checkpoint: its file's stem (``ckpt_best``)."""
        return self.checkpoint.stem

    @property
    def config_file(self) -> Path | None:
        """The run directory's ``config.yaml``, when there is one."""
        if self.run_dir is None or not (self.run_dir / CONFIG_FILE).is_file():
            return None
        return self.run_dir / CONFIG_FILE


def choose_checkpoint(
    target: Path, checkpoint: str | None = None, command: str = "evaluate"
) -> ChosenCheckpoint:
    """The checkpoint that ``target`` (a run directory, its ``checkpoints/`` or a checkpoint file) and
    ``checkpoint`` (``latest``, the default; ``best``; or a file's path) name for ``dlscale COMMAND``;
    CheckpointError, naming what is there instead, when there is none."""
    if target.is_file() or is_sharded_checkpoint(target):
        if checkpoint is not None:
            raise CheckpointError(
                f"{target} is a checkpoint file, and --checkpoint {checkpoint} chooses among a run directory's "
                "checkpoints: give the run directory with --checkpoint, or the file alone"
            )
        run_dir = run_directory_of(checked_file(target, command))
        return ChosenCheckpoint(target, run_dir, run_dir or target.parent)
    if not target.is_dir():
        raise CheckpointError(f"{target} does not exist; {expects(command)}")
    nested = target.name == "checkpoints" and not (target / "checkpoints").is_dir()
    run_dir = target.parent if nested else target
    checkpoints = CheckpointDir(run_dir / "checkpoints")
    choice = checkpoint or "latest"
    if choice not in CHOICES:
        path = Path(choice).expanduser()
        for candidate in (path, checkpoints.directory / path):  # also a file named as it is in checkpoints/
            if candidate.is_file() or is_sharded_checkpoint(candidate):
                return ChosenCheckpoint(checked_file(candidate, command), run_dir, run_dir)
        what = "is not a file" if path.exists() else "does not exist"
        raise CheckpointError(
            f"--checkpoint {choice}: {what}; --checkpoint takes {' or '.join(CHOICES)} (of {run_dir}) or "
            "the path of a checkpoint file"
        )
    path = checkpoints.latest_path if choice == "latest" else checkpoints.best_path
    if path.exists():
        return ChosenCheckpoint(path, run_dir, run_dir)
    present = checkpoints.other_checkpoints(include_latest=True)
    if present:
        other = "best" if choice == "latest" else "latest"
        advice = other if checkpoints_named(checkpoints, other).exists() else str(present[0])
        raise CheckpointError(
            f"{run_dir}: has no checkpoints/{path.name} for --checkpoint {choice}; it holds "
            f"{', '.join(p.name for p in present)}: {command} one with --checkpoint {advice}"
        )
    raise CheckpointError(
        f"{run_dir}: no checkpoint to {command} (no checkpoints/{path.name}){what_directory_holds(run_dir)}; "
        f"{expects(command)}"
    )


def checkpoints_named(checkpoints: CheckpointDir, choice: str) -> Path:
    """The file that ``--checkpoint latest`` or ``best`` names in ``checkpoints``."""
    return checkpoints.latest_path if choice == "latest" else checkpoints.best_path


def checked_file(path: Path, command: str = "evaluate") -> Path:
    """``path``, unless it is plainly no checkpoint (an HDF5 file, a text file...); a damaged checkpoint is
    left to the loader, which says what is wrong with it."""
    if is_sharded_checkpoint(path):
        return path
    kind = foreign_file_kind(path)
    if kind is not None:
        raise CheckpointError(f"{path} is not a dlscale checkpoint ({kind}); {expects(command)}")
    return path


def run_directory_of(checkpoint: Path) -> Path | None:
    """The run directory a checkpoint file is in (``<run>/checkpoints/<file>`` with ``<run>/config.yaml``)."""
    parent = checkpoint.parent
    if parent.name == "checkpoints" and (parent.parent / CONFIG_FILE).is_file():
        return parent.parent
    return None


def check_fits(
    payload: dict[str, Any],
    checkpoint: Path,
    workload: str,
    resolved: dict[str, Any],
    where: str,
    weight_keys: frozenset[str],
) -> None:
    """Refuse a checkpoint of another workload, or a config (``resolved``, from ``where``) that gives the saved
    weights another meaning than the config they were trained with (the keys of ``weight_keys``)."""
    meta = payload.get("meta") if isinstance(payload.get("meta"), dict) else {}
    saved = meta.get("workload")
    if saved is not None and saved != workload:
        raise CheckpointError(
            f"{checkpoint}: is a checkpoint of workload {saved!r} (config {meta.get('config_name', '?')!r}), and "
            f"{where} is of workload {workload!r}; use it with its own run directory, or give --checkpoint "
            f"a checkpoint of a {workload!r} run"
        )
    recorded = payload.get("config")
    if not isinstance(recorded, dict):
        return  # the strict loader compares the shapes instead
    changes = weight_key_changes(recorded, resolved, weight_keys)
    if changes:
        raise CheckpointError(
            f"{checkpoint}: {where} changes keys that define its weights (the checkpoint's value -> this "
            f"config's: {'; '.join(changes)}); the weights would load into a different model. Evaluate with "
            "the checkpoint's values (no --set of these keys), or give a checkpoint of this model"
        )
