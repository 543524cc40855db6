"""A run's checkpoint directory: the latest and best checkpoints, numbered copies, and pruning.

Single-file checkpoints are ``ckpt_latest.pt``, ``ckpt_best.pt`` and ``ckpt_step<step>.pt``. Sharded ones
(:mod:`dlscale.checkpoint.sharded_files`) are directories ``ckpt_step<step>``, with ``ckpt_latest`` and
``ckpt_best`` symbolic links to them, each replaced atomically once the directory it points to is complete.
Readers take whichever latest checkpoint is there (the newer one, when a run switched formats).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Callable, Mapping
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
    SHARDED_LATEST_NAME = "ckpt_latest"
    SHARDED_BEST_NAME = "ckpt_best"
    _NUMBERED = re.compile(r"ckpt_step(\d{8,})\.pt")
    NUMBERED_SHARDED = re.compile(r"ckpt_step(\d{8,})(?:-(\d+))?")  # -<n>: the step saved again

    def __init__(self, directory: str | Path, keep_last: int = 0):
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0:
            raise InvalidValue("keep_last", f"expected an int >= 0, got {keep_last!r}")
        self.directory = Path(directory)
        self.keep_last = keep_last

    @property
    def latest_path(self) -> Path:
        """The checkpoint a run resumes from: ``ckpt_latest.pt``, or the ``ckpt_latest`` link of sharded ones."""
        return _newer(self.directory / self.LATEST_NAME, self.directory / self.SHARDED_LATEST_NAME)

    @property
    def best_path(self) -> Path:
        """The checkpoint with the best validation score so far (``ckpt_best.pt`` or the ``ckpt_best`` link)."""
        return _newer(self.directory / self.BEST_NAME, self.directory / self.SHARDED_BEST_NAME)

    def numbered_directories(self) -> list[Path]:
        """The sharded checkpoints' directories present, complete or not, oldest step first."""
        return self._numbered(self.NUMBERED_SHARDED, lambda p: p.is_dir() and not p.is_symlink())

    def numbered_path(self, global_step: int) -> Path:
        """Where the numbered copy for `global_step` lives."""
        return self.directory / f"ckpt_step{global_step:08d}.pt"

    def numbered_paths(self) -> list[Path]:
        """The numbered checkpoint files present, oldest step first."""
        return self._numbered(self._NUMBERED, Path.is_file)

    def _numbered(self, pattern: re.Pattern, kind: Callable[[Path], bool]) -> list[Path]:
        """The entries named by ``pattern`` (the step, then a repeat number if any) of the ``kind``, in order."""
        if not self.directory.is_dir():
            return []
        found = []
        for entry in self.directory.iterdir():
            match = pattern.fullmatch(entry.name)
            if match and kind(entry):
                found.append((tuple(int(g or 0) for g in match.groups()), entry))
        return [p for _, p in sorted(found)]

    def other_checkpoints(self, include_latest: bool = False) -> list[Path]:
        """The checkpoints present besides latest (or with it): best, then numbered ones, newest first (files,
        and the directories of complete sharded checkpoints)."""
        from dlscale.checkpoint.sharded_files import is_complete

        candidates = [self.latest_path] if include_latest else []
        candidates += [self.best_path, *reversed(self.numbered_paths())]
        found = [path for path in candidates if path.is_file() or is_complete(path)]
        pointed = {path.resolve() for path in found}
        numbered = [
            d for d in reversed(self.numbered_directories()) if is_complete(d) and d.resolve() not in pointed
        ]
        return found + numbered

    def has_checkpoint(self) -> bool:
        """Whether there is a latest checkpoint to resume from."""
        return self.latest_path.exists()

    def load_latest(self, map_location: Any = "cpu") -> dict[str, Any]:
        """Load the latest checkpoint (see `load_checkpoint`)."""
        return load_checkpoint(self.latest_path, map_location=map_location)

    def save(self, payload: Mapping[str, Any], is_best: bool = False) -> Path:
        """Write the latest checkpoint atomically, and the best and numbered copies when asked; return latest."""
        latest, best = self.directory / self.LATEST_NAME, self.directory / self.BEST_NAME
        step = None
        if self.keep_last > 0:
            step = global_step_of(payload, latest)
        save_checkpoint(payload, latest)
        # The best and numbered copies are made from the file just written rather than by a second torch.save:
        # they hold exactly the same bytes as latest, the (possibly GPU-resident) tensors are not serialized
        # twice, and no in-memory copy of a multi-GB checkpoint is needed. Each copy is published atomically,
        # so a crash between copies leaves every file either old-and-complete or new-and-complete.
        if is_best:
            _publish_copy(latest, best)
        if step is not None:
            newest = self.numbered_path(step)
            _publish_copy(latest, newest)
            self._prune(keep=newest)
        return latest

    def _prune(self, keep: Path) -> None:
        # Only called once `keep` is safely in place, so at no point are there fewer than keep_last copies.
        numbered = self.numbered_paths()
        for old in numbered[: max(0, len(numbered) - self.keep_last)]:
            if old != keep:
                with contextlib.suppress(FileNotFoundError):
                    old.unlink()


def _newer(file: Path, link: Path) -> Path:
    """``link`` (a sharded checkpoint) when it is there and ``file`` is not, or is older; else ``file``."""
    if not link.exists():
        return file
    if not file.exists():
        return link
    return link if link.stat().st_mtime >= file.stat().st_mtime else file


def global_step_of(payload: Mapping[str, Any], path: Path) -> int:
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
