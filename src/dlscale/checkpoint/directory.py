"""A run's checkpoint directory: the latest and best checkpoints, numbered copies, and pruning."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dlscale.checkpoint.files import load_checkpoint, save_checkpoint, write_checkpoint_atomically
from dlscale.errors import CheckpointError, InvalidValue
from dlscale.runtime.atomic_files import write_synced


class CheckpointDir:
    """A run's checkpoint directory: `ckpt_latest.pt`, `ckpt_best.pt` and optional numbered copies.

    `keep_last > 0` also keeps the `keep_last` most recent checkpoints as `ckpt_step<global_step:08d>.pt`
    (the step is read from `payload["progress"]["global_step"]`); `keep_last = 0` keeps none.
    """

    LATEST_NAME = "ckpt_latest.pt"
    BEST_NAME = "ckpt_best.pt"
    _NUMBERED = re.compile(r"ckpt_step(\d{8,})\.pt")

    def __init__(self, directory: str | Path, keep_last: int = 0):
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0:
            raise InvalidValue("keep_last", f"expected an int >= 0, got {keep_last!r}")
        self.directory = Path(directory)
        self.keep_last = keep_last

    @property
    def latest_path(self) -> Path:
        """The checkpoint a run resumes from."""
        return self.directory / self.LATEST_NAME

    @property
    def best_path(self) -> Path:
        """The checkpoint with the best validation score so far."""
        return self.directory / self.BEST_NAME

    def numbered_path(self, global_step: int) -> Path:
        """Where the numbered copy for `global_step` lives."""
        return self.directory / f"ckpt_step{global_step:08d}.pt"

    def numbered_paths(self) -> list[Path]:
        """The numbered checkpoints present, oldest step first."""
        if not self.directory.is_dir():
            return []
        found = []
        for entry in self.directory.iterdir():
            match = self._NUMBERED.fullmatch(entry.name)
            if match and entry.is_file():
                found.append((int(match.group(1)), entry))
        return [p for _, p in sorted(found)]

    def other_checkpoints(self, include_latest: bool = False) -> list[Path]:
        """The checkpoint files present besides latest (or with it): best, then numbered ones, newest first."""
        candidates = [self.latest_path] if include_latest else []
        candidates += [self.best_path, *reversed(self.numbered_paths())]
        return [path for path in candidates if path.is_file()]

    def has_checkpoint(self) -> bool:
        """Whether there is a latest checkpoint to resume from."""
        return self.latest_path.is_file()

    def load_latest(self, map_location: Any = "cpu") -> dict[str, Any]:
        """Load the latest checkpoint (see `load_checkpoint`)."""
        return load_checkpoint(self.latest_path, map_location=map_location)

    def save(self, payload: Mapping[str, Any], is_best: bool = False) -> Path:
        """Write the latest checkpoint atomically, and the best and numbered copies when asked; return latest."""
        step = None
        if self.keep_last > 0:
            step = _global_step(payload, self.latest_path)
        save_checkpoint(payload, self.latest_path)
        # The best and numbered copies are made from the file just written rather than by a second torch.save:
        # they hold exactly the same bytes as latest, the (possibly GPU-resident) tensors are not serialized
        # twice, and no in-memory copy of a multi-GB checkpoint is needed. Each copy is published atomically,
        # so a crash between copies leaves every file either old-and-complete or new-and-complete.
        if is_best:
            _publish_copy(self.latest_path, self.best_path)
        if step is not None:
            newest = self.numbered_path(step)
            _publish_copy(self.latest_path, newest)
            self._prune(keep=newest)
        return self.latest_path

    def _prune(self, keep: Path) -> None:
        # Only called once `keep` is safely in place, so at no point are there fewer than keep_last copies.
        numbered = self.numbered_paths()
        for old in numbered[: max(0, len(numbered) - self.keep_last)]:
            if old != keep:
                with contextlib.suppress(FileNotFoundError):
                    old.unlink()


def _global_step(payload: Mapping[str, Any], path: Path) -> int:
    progress = payload.get("progress") if isinstance(payload, Mapping) else None
    step = progress.get("global_step") if isinstance(progress, Mapping) else None
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(
            f"{path}: numbered checkpoints need payload['progress']['global_step'] (an int >= 0), got {step!r}"
        )
    return step


def _publish_copy(source: Path, target: Path) -> None:
    """Atomically make `target` a copy of `source` (a hard link where the file system allows it)."""

    def fill(tmp: Path) -> None:
        # Files here are never modified in place (always replaced by a rename), so a hard link is as good
        # as a copy and costs nothing; file systems without hard links get a real copy.
        try:
            os.link(source, tmp)
            return
        except OSError:
            pass
        with open(source, "rb") as src:
            write_synced(tmp, lambda f: shutil.copyfileobj(src, f, length=16 * 1024 * 1024))

    write_checkpoint_atomically(target, fill)
