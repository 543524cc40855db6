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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset

from dlscale.data.era5.config import ERA5DataConfig
from dlscale.data.era5.coordinates import GridCoordinates
from dlscale.data.era5.hdf5_slabs import SlabReader
from dlscale.data.era5.layout import ERA5_CHANNELS, FIELDS_KEY, load_stats, scan_split
from dlscale.data.era5.mapped_fields import MappedFields, choose_read_method
from dlscale.data.values.normalization import ChannelNormalizer
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

    All files are checked (and closed again) at construction, where ``data.read_method`` is resolved into
    ``read_method`` ("mmap" or "hdf5"; see :mod:`dlscale.data.era5.mapped_fields`). Each process opens (and maps)
    the files lazily, read-only, on first use, so DataLoader workers never share an HDF5 handle, whether
    forked or spawned.
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
        # The file grid's coordinates (the files' own where they hold them), and those of the crop read.
        self.grid: GridCoordinates = layout.grid
        self.latitudes: np.ndarray = layout.grid.latitudes[: cfg.img_size[0]]
        self.longitudes: np.ndarray = layout.grid.longitudes[: cfg.img_size[1]]
        n_out = cfg.n_out_channels
        self._normalizer = ChannelNormalizer(self.means, self.stds, self.means[:n_out], self.stds[:n_out])

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

        self.read_method, why = choose_read_method(cfg.read_method, self.files)
        how = "through memory maps" if self.read_method == "mmap" else "through HDF5"
        files = f"{len(self.files)} file{'s' if len(self.files) != 1 else ''}"
        logger.info("ERA5 %s split: %s read %s (%s)", split, files, how, why)
        logger.info("ERA5 %s split grid: %s", split, layout.grid.describe())

        # file -> (open file, its `fields`, the file's size in bytes when opened)
        self._handles: dict[int, tuple[h5py.File, h5py.Dataset, int]] = {}
        self._maps: dict[int, MappedFields] = {}
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
        inputs, targets = self.read_batch([index])
        return inputs[0], targets[0]

    def read_batch(
        self, indices: Sequence[int], out: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples ``indices`` stacked: inputs (N, n_in, H, W) and targets (N, n_out, H, W), float32.

        The values of ``torch.stack([self[i] ...])``, but each sample goes straight into its row of the batch
        (copied out of a memory map of its file, or written there by HDF5, per ``read_method``) and the batch
        is normalized at once, with torch's threads: no array allocated per sample, no collation copy, no
        normalization channel by channel in numpy. ``out``: C-contiguous float32 CPU tensors of those shapes
        to fill (a ring buffer's), else new ones. When inputs and targets are the two halves of one buffer
        (new ones are, when they have the same channels), one HDF5 call reads both states of a sample and one
        pass normalizes both. Speeds: benchmarks/io_overhead.py.
        """
        cfg = self.cfg
        n_in, n_out = cfg.n_in_channels, cfg.n_out_channels
        count, (height, width) = len(indices), cfg.img_size
        if out is None:
            if n_in == n_out:
                both = torch.empty((2, count, n_in, height, width), dtype=torch.float32)
                out = (both[0], both[1])
            else:
                out = (
                    torch.empty((count, n_in, height, width), dtype=torch.float32),
                    torch.empty((count, n_out, height, width), dtype=torch.float32),
                )
        inputs, targets = out
        for name, tensor, channels in (("inputs", inputs, n_in), ("targets", targets, n_out)):
            expected = (count, channels, height, width)
            usable = tensor.device.type == "cpu" and tensor.dtype == torch.float32 and tensor.is_contiguous()
            if tuple(tensor.shape) != expected or not usable:
                raise ValueError(
                    f"read_batch: out {name} must be a contiguous float32 CPU tensor of shape {expected}, "
                    f"got {tuple(tensor.shape)} {tensor.dtype} on {tensor.device}"
                )
        pair_buffer = _halves_of_one_buffer(inputs, targets)
        if self.read_method == "mmap":
            self._copy_mapped(indices, inputs, targets)
        else:
            self._read_hdf5(indices, inputs, targets, pair_buffer)
        if self.normalize and pair_buffer is not None:
            # The same channels in and out, so the same statistics: both halves at once (fewer, longer passes).
            self._normalizer.normalize_as_inputs_(pair_buffer)
        elif self.normalize:
            self._normalizer(inputs, targets)
        return inputs, targets

    def _read_hdf5(
        self,
        indices: Sequence[int],
        inputs: torch.Tensor,
        targets: torch.Tensor,
        pair_buffer: torch.Tensor | None,
    ) -> None:
        """Raw samples into the batch rows with HDF5 calls (one per sample into ``pair_buffer``'s halves)."""
        cfg = self.cfg
        n_in, n_out, dt = cfg.n_in_channels, cfg.n_out_channels, cfg.dt
        height, width = cfg.img_size
        destinations = [pair_buffer.numpy()] if pair_buffer is not None else [inputs.numpy(), targets.numpy()]
        # file -> its reader into each destination (a batch spans one file, or two at a year's end)
        readers: dict[int, list[SlabReader]] = {}
        for row, index in enumerate(indices):
            file_index, t = self._locate(index)
            try:
                file_readers = readers.get(file_index)
                if file_readers is None:
                    fields = self._fields(file_index)
                    self._check_not_shrunk(file_index)
                    file_readers = readers[file_index] = [SlabReader(fields, d) for d in destinations]
                if pair_buffer is not None:
                    # Input (time t) and target (t + dt) in one strided selection, into row `row` of each half.
                    file_readers[0].read(
                        (t, 0, 0, 0),
                        (2, n_in, height, width),
                        (dt, 1, 1, 1),
                        (0, row, 0, 0, 0),
                        (2, 1, n_in, height, width),
                    )
                else:
                    for d, (time_index, channels) in enumerate(((t, n_in), (t + dt, n_out))):
                        file_readers[d].read(
                            (time_index, 0, 0, 0),
                            (1, channels, height, width),
                            (1, 1, 1, 1),
                            (row, 0, 0, 0),
                            (1, channels, height, width),
                        )
            except Exception as exc:
                raise self._read_error(file_index, t, exc) from exc

    def _copy_mapped(self, indices: Sequence[int], inputs: torch.Tensor, targets: torch.Tensor) -> None:
        """Raw samples into the batch rows, copied out of the files' memory maps (the page cache)."""
        cfg = self.cfg
        n_in, n_out, dt = cfg.n_in_channels, cfg.n_out_channels, cfg.dt
        height, width = cfg.img_size
        checked: set[int] = set()  # files whose size was checked for this batch
        for row, index in enumerate(indices):
            file_index, t = self._locate(index)
            try:
                fields = self._mapped(file_index)
                if file_index not in checked:
                    self._check_not_shrunk(file_index)
                    checked.add(file_index)
                inputs[row].copy_(fields.tensor[t, :n_in, :height, :width])
                targets[row].copy_(fields.tensor[t + dt, :n_out, :height, :width])
            except Exception as exc:
                raise self._read_error(file_index, t, exc) from exc

    def read_states(self, places: Sequence[tuple[int, int]]) -> torch.Tensor:
        """(N, n_in, H, W) float32: the input channels of each (file index, time index) of ``places``, one state
        each, normalized as inputs when this data set normalizes (rollouts read states one at a time: a pair
        read would read each twice). Any time index of the file, the last ``dt`` ones too."""
        cfg = self.cfg
        n_in, (height, width) = cfg.n_in_channels, cfg.img_size
        out = torch.empty((len(places), n_in, height, width), dtype=torch.float32)
        readers: dict[int, SlabReader] = {}
        checked: set[int] = set()
        for row, (file_index, t) in enumerate(places):
            try:
                mapped = self._mapped(file_index) if self.read_method == "mmap" else None
                reader = readers.get(file_index)
                if mapped is None and reader is None:
                    reader = readers[file_index] = SlabReader(self._fields(file_index), out.numpy())
                if file_index not in checked:
                    self._check_not_shrunk(file_index)
                    checked.add(file_index)
                if mapped is not None:
                    out[row].copy_(mapped.tensor[t, :n_in, :height, :width])
                else:
                    block = (1, n_in, height, width)
                    reader.read((t, 0, 0, 0), block, (1, 1, 1, 1), (row, 0, 0, 0), block)
            except Exception as exc:
                raise self._read_error(file_index, t, exc) from exc
        if self.normalize:
            self._normalizer.normalize_as_inputs_(out)
        return out

    def _read_error(self, file_index: int, t: int, exc: Exception) -> DataError:
        dt = self.cfg.dt
        return DataError(
            f"{self.files[file_index]}: cannot read '{FIELDS_KEY}' at time index {t} (target {t + dt}): {exc}"
        )

    def device_normalization(self) -> tuple[ERA5Dataset, ChannelNormalizer | None]:
        """A view of this split that reads raw (unnormalized) samples, and the normalizer of their batches.

        The protocol of dlscale's gpu pipeline (``dlscale.data.values.normalization.SupportsDeviceNormalization``),
        which normalizes on the device: the normalizer applied to a stacked batch of the view's samples
        gives, bitwise, the stacked samples of this data set. Without normalization, (self, None).
        """
        if not self.normalize:
            return self, None
        # copy.copy goes through __getstate__, so the view opens its own file handles.
        raw = copy.copy(self)
        raw.normalize = False
        return raw, self._normalizer

    def _fields(self, file_index: int) -> h5py.Dataset:
        """The `fields` dataset of one file, opened once per process."""
        self._forget_other_process_handles()
        cached = self._handles.get(file_index)
        if cached is None:
            path = self.files[file_index]
            size = os.stat(path).st_size
            handle = h5py.File(path, "r")
            cached = (handle, handle[FIELDS_KEY], size)
            self._handles[file_index] = cached
        return cached[1]

    def _check_not_shrunk(self, file_index: int) -> None:
        """Raise DataError if an opened file is now smaller than when it was opened (truncated, or being
        rewritten): HDF5 would read zeros past its end, and a memory map would read zeros or kill the process."""
        _, _, opened_size = self._handles[file_index]
        path = self.files[file_index]
        size = os.stat(path).st_size
        if size < opened_size:
            raise DataError(f"{path}: the file shrank from {opened_size} to {size} bytes since it was opened")

    def _mapped(self, file_index: int) -> MappedFields:
        """The memory map of one file's `fields`, made once per process."""
        self._forget_other_process_handles()
        mapped = self._maps.get(file_index)
        if mapped is None:
            mapped = self._maps[file_index] = MappedFields(self.files[file_index], self._fields(file_index))
        return mapped

    def _forget_other_process_handles(self) -> None:
        pid = os.getpid()
        if self._handles_pid != pid:
            # Handles inherited through fork belong to the parent; closing them here could disturb it.
            self._handles = {}
            self._maps = {}
            self._handles_pid = pid

    def close(self) -> None:
        """Close the files this process opened; later reads reopen them."""
        if self._handles_pid == os.getpid():
            for handle, _, _ in self._handles.values():
                handle.close()
        self._handles = {}
        self._maps = {}
        self._handles_pid = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_handles"] = {}
        state["_maps"] = {}
        state["_handles_pid"] = None
        return state

    def describe_sample(self, index: int, epoch: int = 0) -> str:
        """Where sample ``index`` lives, for error messages (see :mod:`dlscale.data.values.finite_check`)."""
        path, t = self.location(index)
        return f"file {path}, input time index {t}, target time index {t + self.cfg.dt}"

    def __repr__(self) -> str:
        height, width = self.cfg.img_size
        return (
            f"ERA5Dataset(split={self.split!r}, files={len(self.files)}, samples={len(self)}, "
            f"crop={height}x{width}, channels in/out={self.cfg.n_in_channels}/{self.cfg.n_out_channels}, "
            f"dt={self.cfg.dt})"
        )


def _halves_of_one_buffer(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
    """A (2, *shape) view whose [0] and [1] are ``inputs`` and ``targets``, if ``targets`` directly follows
    ``inputs`` in one storage (both contiguous, of one shape and dtype); else None."""
    if inputs.shape != targets.shape or inputs.dtype != targets.dtype or inputs.numel() == 0:
        return None
    if not (inputs.is_contiguous() and targets.is_contiguous()):
        return None
    one_storage = inputs.untyped_storage().data_ptr() == targets.untyped_storage().data_ptr()
    if not one_storage or targets.data_ptr() != inputs.data_ptr() + inputs.nbytes:
        return None
    return inputs.as_strided((2, *inputs.shape), (inputs.numel(), *inputs.stride()))
