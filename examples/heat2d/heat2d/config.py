"""The ``data:`` and ``model:`` config sections of the heat2d workload.

dlscale builds these dataclasses from a YAML config: it checks each key's name and type against the
annotations (so only types it can read from YAML are used: int, float, str, bool, ``X | None``, ``Literal``,
tuples and lists), then calls the class, whose ``__post_init__`` checks meaning. Errors are raised as
:class:`~dlscale.errors.InvalidValue` (a ``ConfigError`` that knows its key); dlscale adds the file, config and
section, so the user reads e.g. ``heat2d.yaml [config 'demo']: data.grid: must be >= 8, got 3``.

dlscale also accepts keys written flat at the top of a config (``grid: 32`` for ``data: {grid: 32}``), so a key
here must not share its name with a key of dlscale's own sections (``seed``, ``lr``, ``warmup`` ...): hence
``data_seed`` and not ``seed``.

This module imports no torch, so reading a config stays fast.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dlscale.errors import InvalidValue

SPLITS = ("train", "valid")
MIN_GRID = 8  # below this, the random blobs and diffusivity fields are a cell or two wide


@dataclass
class Heat2DDataConfig:
    """The ``data:`` section: where the HDF5 files are and the problem they hold (checked against the files)."""

    root: str = "data/heat2d"  # directory of train.h5 and valid.h5 (relative to the working directory)
    generate_if_missing: bool = True  # write the files when absent (all ranks may do so at once, safely)
    grid: int = 64  # N: cells per side of the periodic unit square
    train_trajectories: int = 256  # independent (initial field, diffusivity) pairs in train.h5
    valid_trajectories: int = 32  # the same in valid.h5, drawn from other seeds
    frames: int = 20  # stored snapshots per trajectory, the initial one included
    steps_per_frame: int = 40  # solver steps between frames; frames lie 0.2 * steps_per_frame / grid^2 apart
    data_seed: int = 0  # seeds every trajectory, with the split and the trajectory's index
    # frames each training target holds: 1 pairs a frame with the next; 2 also with the one after, for the
    # workload's 2-step rollout loss (heat2d.workload.Heat2DRollout). Validation stays one step.
    rollout_frames: int = 1

    def __post_init__(self) -> None:
        if self.grid < MIN_GRID:
            raise InvalidValue("grid", f"must be >= {MIN_GRID}, got {self.grid}")
        for name in ("train_trajectories", "valid_trajectories", "steps_per_frame"):
            if getattr(self, name) < 1:
                raise InvalidValue(name, f"must be >= 1, got {getattr(self, name)}")
        if self.frames < 2:
            raise InvalidValue(
                "frames", f"must be >= 2 (a sample pairs a frame with the next), got {self.frames}"
            )
        if self.data_seed < 0:
            raise InvalidValue("data_seed", f"must be >= 0, got {self.data_seed}")
        if not 1 <= self.rollout_frames < self.frames:
            raise InvalidValue(
                "rollout_frames",
                f"must be >= 1 and below frames ({self.frames}), so that a trajectory holds a sample, "
                f"got {self.rollout_frames}",
            )

    def root_path(self) -> Path:
        """``root`` with ``~`` and ``$VARS`` expanded."""
        return Path(os.path.expandvars(os.path.expanduser(self.root)))

    def path(self, split: str) -> Path:
        """The HDF5 file of ``split`` ("train" or "valid")."""
        return self.root_path() / f"{split}.h5"

    def trajectories(self, split: str) -> int:
        return self.train_trajectories if split == "train" else self.valid_trajectories


@dataclass
class Heat2DModelConfig:
    """The ``model:`` section: the residual CNN's size (it is fully convolutional, so any grid fits)."""

    width: int = 32  # channels of the hidden convolutions
    depth: int = 4  # convolutions in all (the first reads [u, kappa], the last writes the increment of u)
    kernel_size: int = 3  # odd, so that circular padding keeps the grid; receptive field depth * (k - 1) + 1

    def __post_init__(self) -> None:
        if self.width < 1:
            raise InvalidValue("width", f"must be >= 1, got {self.width}")
        if self.depth < 2:
            raise InvalidValue(
                "depth", f"must be >= 2 (an input and an output convolution), got {self.depth}"
            )
        if self.kernel_size < 1 or self.kernel_size % 2 == 0:
            raise InvalidValue(
                "kernel_size",
                f"must be odd and >= 1 (so the output stays on the input's grid), got {self.kernel_size}",
            )
