"""ERA5 reader: pairs (state at t, state at t + dt) from yearly HDF5 files.

On disk (the NERSC tutorial's files and dlscale's synthetic ones) a split is a directory of `*.h5` files, one
per year, taken in sorted name order. Each holds a dataset `fields` of shape (T, C, H_file, W_file) at 6-hourly
steps; T may differ between files (leap or partial years), C, H_file and W_file may not. Per-channel global
means and standard deviations are `.npy` arrays of shape (1, C_stats, 1, 1) with C_stats >= n_in_channels.

Sample indexing: file f gives inputs t = 0 .. T_f - dt - 1, so the dataset has sum_f (T_f - dt) samples and
every valid (file, t) appears exactly once, file by file, time ascending. (The reference tutorial folds indices
so that t = 0 is never an input and t = 1 appears three times; that is not reproduced.) A sample is the
top-left (H, W) crop of `fields[t, :n_in]` and `fields[t + dt, :n_out]`, normalized per channel.
`limit_nsamples` / `limit_nsamples_val` keep the first N indices of that order.
"""

from __future__ import annotations

import bisect
import copy
import logging
import operator
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset

from dlscale.data.era5_layout import (
    ERA5_CHANNELS,
    FIELDS_KEY,
    ERA5DataConfig,
    latitudes,
    load_stats,
    scan_split,
)
from dlscale.data.normalization import ChannelNormalizer
from dlscale.errors import DataError

__all__ = ["ERA5_CHANNELS", "ERA5DataConfig", "ERA5Dataset"]

logger = logging.getLogger(__name__)

# split -> (config field with its directory, config field with its sample limit)
_SPLITS: dict[str, tuple[str, str | None]] = {
    "train": ("train_data_path", "limit_nsamples"),
    "valid": ("valid_data_path", "limit_nsamples_val"),
    "test": ("inf_data_path", None),
}


class ERA5Dataset(Dataset):
    """(input, target) tensors of shape (n_in, H, W) and (n_out, H, W) from one split of ERA5 files.

    All files are checked (and closed again) at construction. Each process opens the files lazily, read-only,
    on first use, so DataLoader workers never share an HDF5 handle, whether forked or spawned.
    """

    def __init__(self, cfg: ERA5DataConfig, split: str, normalize: bool = True):
        if split not in _SPLITS:
            raise ValueError(f"split must be one of {sorted(_SPLITS)}, got {split!r}")
        path_key, limit_key = _SPLITS[split]
        self.cfg = cfg
        self.split = split
        self.normalize = normalize

        layout = scan_split(cfg, path_key)
        self.files: list[Path] = layout.files
        self.samples_per_file: list[int] = [steps - cfg.dt for steps in layout.steps_per_file]
        self.channel_names: tuple[str, ...] = layout.channel_names
        self.means: np.ndarray = load_stats(cfg, "global_means_path", self.channel_names)
        self.stds: np.ndarray = load_stats(cfg, "global_stds_path", self.channel_names, positive=True)
        self.latitudes: np.ndarray = latitudes(layout.file_height, cfg.img_size[0])

        # _first_index[f] = global index of file f's first sample; the last entry is the total.
        self._first_index = [0]
        for count in self.samples_per_file:
            self._first_index.append(self._first_index[-1] + count)
        available = self._first_index[-1]
        limit = getattr(cfg, limit_key) if limit_key else None
        if limit is not None and limit > available:
            logger.warning(
                "%s=%d is larger than the %d samples in %s; using all of them",
                limit_key,
                limit,
                available,
                cfg.path(path_key),
            )
        self._length = available if limit is None else min(limit, available)

        self._handles: dict[int, tuple[h5py.File, h5py.Dataset]] = {}
        self._handles_pid: int | None = None

    def __len__(self) -> int:
        return self._length

    def location(self, index: int) -> tuple[Path, int]:
        """The (file, input time index) that global sample `index` reads; its target is at time + dt."""
        file_index, t = self._locate(index)
        return self.files[file_index], t

    def _locate(self, index: int) -> tuple[int, int]:
        index = operator.index(index)
        if not 0 <= index < self._length:
            raise IndexError(f"sample index {index} out of range for {self._length} samples")
        file_index = bisect.bisect_right(self._first_index, index) - 1
        return file_index, index - self._first_index[file_index]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        file_index, t = self._locate(index)
        cfg = self.cfg
        height, width = cfg.img_size
        n_in, n_out, dt = cfg.n_in_channels, cfg.n_out_channels, cfg.dt
        path = self.files[file_index]
        try:
            fields = self._fields(file_index)
            if n_out == n_in:
                # One strided selection reads both states: fewer HDF5 calls than two reads.
                pair = fields[t : t + dt + 1 : dt, :n_in, :height, :width]
                inp, tar = pair[0], pair[1]
            else:
                inp = fields[t, :n_in, :height, :width]
                tar = fields[t + dt, :n_out, :height, :width]
        except Exception as exc:
            raise DataError(
                f"{path}: cannot read '{FIELDS_KEY}' at time index {t} (target {t + dt}): {exc}"
            ) from exc
        inp = np.asarray(inp, dtype=np.float32)
        tar = np.asarray(tar, dtype=np.float32)
        if self.normalize:
            # In place: the arrays are fresh reads, and reusing them instead of allocating two more per sample
            # makes the loader about 25% faster (measured by benchmarks/io_overhead.py).
            inp -= self.means[:, None, None]
            inp /= self.stds[:, None, None]
            tar -= self.means[:n_out, None, None]
            tar /= self.stds[:n_out, None, None]
        return (
            torch.from_numpy(np.ascontiguousarray(inp, dtype=np.float32)),
            torch.from_numpy(np.ascontiguousarray(tar, dtype=np.float32)),
        )

    def device_normalization(self) -> tuple[ERA5Dataset, ChannelNormalizer | None]:
        """A view of this split that reads raw (unnormalized) samples, and the normalizer of their batches.

        The protocol of dlscale's gpu pipeline (``dlscale.data.normalization.SupportsDeviceNormalization``),
        which normalizes on the device: the normalizer applied to a stacked batch of the view's samples
        gives, bitwise, the stacked samples of this data set. Without normalization, (self, None).
        """
        if not self.normalize:
            return self, None
        # copy.copy goes through __getstate__, so the view opens its own file handles.
        raw = copy.copy(self)
        raw.normalize = False
        n_out = self.cfg.n_out_channels
        normalizer = ChannelNormalizer(self.means, self.stds, self.means[:n_out], self.stds[:n_out])
        return raw, normalizer

    def _fields(self, file_index: int) -> h5py.Dataset:
        """The `fields` dataset of one file, opened once per process."""
        pid = os.getpid()
        if self._handles_pid != pid:
            # Handles inherited through fork belong to the parent; closing them here could disturb it.
            self._handles = {}
            self._handles_pid = pid
        cached = self._handles.get(file_index)
        if cached is None:
            handle = h5py.File(self.files[file_index], "r")
            cached = (handle, handle[FIELDS_KEY])
            self._handles[file_index] = cached
        return cached[1]

    def close(self) -> None:
        """Close the files this process opened; later reads reopen them."""
        if self._handles_pid == os.getpid():
            for handle, _ in self._handles.values():
                handle.close()
        self._handles = {}
        self._handles_pid = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_handles"] = {}
        state["_handles_pid"] = None
        return state

    def __repr__(self) -> str:
        height, width = self.cfg.img_size
        return (
            f"ERA5Dataset(split={self.split!r}, files={len(self.files)}, samples={len(self)}, "
            f"crop={height}x{width}, channels in/out={self.cfg.n_in_channels}/{self.cfg.n_out_channels}, "
            f"dt={self.cfg.dt})"
        )
