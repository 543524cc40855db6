"""The heat2d samples: one solver frame in, the next frame out, normalized by the training split's statistics.

Sample ``i`` is trajectory ``i // (frames - 1)``, frame ``k = i % (frames - 1)``:

* input  ``(2, N, N)``: ``[(u_k - u_mean) / u_std, (kappa - kappa_mean) / kappa_std]``
* target ``(1, N, N)``: ``(u_{k+1} - u_mean) / u_std``

With ``rollout_frames`` r > 1 (the training split only), the target is ``(r, N, N)``, the next r frames
``u_{k+1} .. u_{k+r}``, and a trajectory holds ``frames - r`` samples.

u_k and u_{k+1} share one normalization, so the increment the model predicts is the physical one divided by
``u_std``. The statistics come from train.h5 for both splits (see :mod:`heat2d.generate`).

The file is read lazily, one handle per process, instead of being loaded into memory: the demo files would fit,
but a user's own simulations usually do not, and this is the pattern that scales. An h5py handle must not cross
``fork`` (DataLoader workers), so each process opens its own on its first ``__getitem__``, and pickling (for
``spawn`` workers) leaves the handle behind. A sample is one contiguous read of two frames plus one of kappa.
"""

from __future__ import annotations

import os
from dataclasses import fields
from typing import Any

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset

from dlscale.errors import ConfigError
from heat2d.config import Heat2DDataConfig
from heat2d.generate import GENERATOR_VERSION, PRESETS

STATS = ("u_mean", "u_std", "kappa_mean", "kappa_std")


def check_file(cfg: Heat2DDataConfig, split: str) -> dict[str, Any]:
    """The attributes of ``split``'s file, after checking that it exists and holds what ``cfg`` describes."""
    path = cfg.path(split)
    if not path.is_file():
        raise ConfigError(f"data.root: {path} not found; {_how_to_generate(cfg)}")
    try:
        with h5py.File(path, "r") as handle:
            attrs = dict(handle.attrs)
            shape = handle["u"].shape if "u" in handle else None
    except OSError as exc:
        raise ConfigError(f"data.root: {path} is not a readable HDF5 file: {exc}") from None
    remedy = f"point data.root at another directory, or delete {path} to have it regenerated"
    if attrs.get("generator_version") != GENERATOR_VERSION:
        raise ConfigError(
            f"data.root: {path} was written by heat2d generator version {attrs.get('generator_version')}, this "
            f"code writes version {GENERATOR_VERSION}; {remedy}"
        )
    trajectories_key = f"{split}_trajectories"
    expected = {
        "grid": cfg.grid,
        "frames": cfg.frames,
        "steps_per_frame": cfg.steps_per_frame,
        "data_seed": cfg.data_seed,
        trajectories_key: cfg.trajectories(split),
    }
    for key, wanted in expected.items():
        found = attrs.get("trajectories" if key == trajectories_key else key)
        if found != wanted:
            raise ConfigError(
                f"data.{key}: {path} holds data made with {key} {found}, the config asks for {wanted}; {remedy}"
            )
    if shape != (cfg.trajectories(split), cfg.frames, cfg.grid, cfg.grid):
        raise ConfigError(
            f"data.root: {path}: dataset u has shape {shape}, not what its attributes say; {remedy}"
        )
    return attrs


def _how_to_generate(cfg: Heat2DDataConfig) -> str:
    problem = {
        f.name: getattr(cfg, f.name)
        for f in fields(cfg)
        if f.name not in ("root", "generate_if_missing", "rollout_frames")  # not a property of the files
    }
    for name, preset in PRESETS.items():
        if all(getattr(preset, key) == value for key, value in problem.items()):
            return (
                f"`python -m heat2d.generate --out {cfg.root_path()} --preset {name}` writes it, or set "
                "data.generate_if_missing: true to have the run write it"
            )
    return (
        "set data.generate_if_missing: true to have the run write it (no preset of heat2d.generate matches)"
    )


class Heat2DDataset(Dataset):
    """The (input, target) pairs of one split (see the module docstring)."""

    def __init__(self, cfg: Heat2DDataConfig, split: str) -> None:
        self.path = cfg.path(split)
        attrs = check_file(cfg, split)
        train_attrs = attrs if split == "train" else check_file(cfg, "train")
        self.u_mean, self.u_std, self.kappa_mean, self.kappa_std = (float(train_attrs[s]) for s in STATS)
        self.trajectories = cfg.trajectories(split)
        self.target_frames = cfg.rollout_frames if split == "train" else 1
        self.pairs_per_trajectory = cfg.frames - self.target_frames
        self._handle: h5py.File | None = None
        self._handle_pid: int | None = None

    def __len__(self) -> int:
        return self.trajectories * self.pairs_per_trajectory

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} out of range for {len(self)} samples")
        trajectory, k = divmod(int(index), self.pairs_per_trajectory)
        handle = self._file()
        u = (handle["u"][trajectory, k : k + 1 + self.target_frames] - np.float32(self.u_mean)) / np.float32(
            self.u_std
        )
        kappa = (handle["kappa"][trajectory] - np.float32(self.kappa_mean)) / np.float32(self.kappa_std)
        return torch.from_numpy(np.stack([u[0], kappa])), torch.from_numpy(u[1:])

    def _file(self) -> h5py.File:
        if self._handle is None or self._handle_pid != os.getpid():
            self._handle = h5py.File(self.path, "r")
            self._handle_pid = os.getpid()
        return self._handle

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_handle"] = state["_handle_pid"] = None
        return state
