"""Dark-matter -> gas volumes (the sc21 U-Net tutorial's "nbody2hydro" data): HDF5 reader and random crops.

On disk, one HDF5 file per split holds two datasets, channel-first: ``Nbody`` (4, L, L, L), the input
(dark-matter log-density and velocity x, y, z), and ``Hydro`` (5, L, L, L), the target (gas log-density,
temperature, velocity x, y, z). Values are pre-normalized to about [-1, 1]; the reader does no normalization.

A sample is a ``data_size``^3 crop at the same corner of both fields (each corner coordinate uniform in
``[0, L - data_size]``), in one of the 24 cube rotations (:mod:`dlscale.data.cosmo.orientations`), applied alike to
input and target, velocity channels included when ``rotate_vectors``. A data set has ``Nsamples`` samples
(``Nsamples_val`` for validation): that is the length of an epoch, as in the tutorial.

Reproducibility (where the tutorial drew from numpy's global RNG and ignored the index):

* training sample ``i`` of epoch ``e`` has its corner and rotation drawn from ``(crop_seed, e, i)``: the same
  run gives the same crops whatever the workers, threads, ranks or a mid-epoch resume, and each epoch sees
  fresh crops. The pipelines hand such a data set :class:`~dlscale.data.values.normalization.EpochIndex` keys;
* validation sample ``i`` depends on ``(crop_seed, i)`` only, so every epoch is scored on the same crops and
  validation losses are comparable between epochs (the tutorial redrew them each epoch).

``read_mode``: ``lowmem`` opens the file lazily once per process (threads share the handle; h5py serializes
them anyway) and reads each crop with ``read_direct``; ``inmem`` loads both fields into memory at start. Under
the ``gpu`` pipeline, ``inmem`` volumes live on the device and crops and rotations happen there; ``lowmem``
crops are read by the reader threads and rotated on the device after the copy (see ``device_normalization``).
"""

from __future__ import annotations

import copy
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset

from dlscale.data.cosmo.config import CosmoDataConfig
from dlscale.data.cosmo.orientations import NUM_ORIENTATIONS, orient_array, orient_batch, orient_tensor
from dlscale.data.values.normalization import EpochIndex, split_key
from dlscale.errors import DataError

INPUT_KEY, TARGET_KEY = "Nbody", "Hydro"
TARGET_CHANNELS = ("gas_log_density", "temperature", "gas_vx", "gas_vy", "gas_vz")
_STREAMS = {"train": 0, "valid": 1}  # seeds the two splits' crops independently


@dataclass(frozen=True)
class CropPlanner:
    """Where sample ``key`` is cut and how it is turned: a pure function of the seed, the split and the key."""

    seed: int
    split: str
    box: int  # side L of the volumes
    size: int  # crop edge
    per_epoch: bool  # training: fresh crops every epoch; validation: the same crops every epoch

    def plan(self, key: EpochIndex | int) -> tuple[tuple[int, int, int], int]:
        """((x, y, z) corner, orientation index) of sample ``key``."""
        epoch, index = split_key(key)
        state = _HASH_START
        for word in (self.seed, _STREAMS[self.split], epoch if self.per_epoch else 0, index):
            state = _splitmix64(state ^ (word & _MASK64))
        positions = self.box - self.size + 1
        # 64-bit draws reduced modulo at most a few thousand: the bias is below 1e-15.
        x, y, z = (_splitmix64(state + k) % positions for k in (1, 2, 3))
        return (x, y, z), _splitmix64(state + 4) % NUM_ORIENTATIONS


_MASK64 = (1 << 64) - 1
_HASH_START = 0x6A09E667F3BCC908


def _splitmix64(value: int) -> int:
    """The splitmix64 mixer: a 64-bit integer to a well-spread 64-bit integer (Steele et al., 2014).

    A few microseconds in Python, where a numpy generator per sample costs about 60: the plans of a batch
    are recomputed on the consumer thread by the gpu pipeline's device rotation, on the training's path.
    """
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


class CosmoCropDataset(Dataset):
    """(input, target) float32 tensors of shape (N_in, D, D, D) and (N_out, D, D, D), D = data_size.

    The file is checked (and closed) at construction. ``orient=False`` gives the crops unrotated (the gpu
    pipeline rotates them on the device).
    """

    def __init__(self, cfg: CosmoDataConfig, split: str):
        if split not in _STREAMS:
            raise ValueError(f"split must be one of {sorted(_STREAMS)}, got {split!r}")
        self.cfg = cfg
        self.split = split
        self.file = cfg.path(split)
        self.box = check_volume_file(self.file, cfg, split)
        self.planner = CropPlanner(cfg.crop_seed, split, self.box, cfg.data_size, per_epoch=split == "train")
        self.samples_depend_on_epoch = split == "train"  # the pipelines then pass EpochIndex keys
        self.orient = True
        self.input_vectors = tuple(cfg.input_vector_channels) if cfg.rotate_vectors else ()
        self.target_vectors = tuple(cfg.target_vector_channels) if cfg.rotate_vectors else ()
        self._length = cfg.Nsamples if split == "train" else cfg.Nsamples_val
        self._volumes: tuple[np.ndarray, np.ndarray] | None = None
        if cfg.read_mode == "inmem":
            self._volumes = load_volumes(self.file, cfg)
        self._handle: tuple[h5py.Dataset, h5py.Dataset] | None = None
        self._handle_pid: int | None = None
        self._handle_lock = threading.Lock()

    @property
    def target_channel_names(self) -> tuple[str, ...]:
        return TARGET_CHANNELS[: self.cfg.N_out_channels]

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, key: EpochIndex | int) -> tuple[torch.Tensor, torch.Tensor]:
        _, index = split_key(key)
        if not 0 <= index < self._length:
            raise IndexError(f"sample index {index} out of range for {self._length} samples")
        corner, orientation = self.planner.plan(key)
        inputs, targets = self.read_crop(corner)
        if self.orient:
            inputs = orient_array(inputs, orientation, self.input_vectors)
            targets = orient_array(targets, orientation, self.target_vectors)
        return torch.from_numpy(inputs), torch.from_numpy(targets)

    def read_crop(self, corner: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
        """The unrotated crops of both fields at ``corner``, as new float32 arrays."""
        d, (x, y, z) = self.cfg.data_size, corner
        n_in, n_out = self.cfg.N_in_channels, self.cfg.N_out_channels
        if self._volumes is not None:
            nbody, hydro = self._volumes
            return (
                np.array(nbody[:, x : x + d, y : y + d, z : z + d]),
                np.array(hydro[:, x : x + d, y : y + d, z : z + d]),
            )
        inputs = np.empty((n_in, d, d, d), dtype=np.float32)
        targets = np.empty((n_out, d, d, d), dtype=np.float32)
        try:
            nbody, hydro = self._datasets()
            nbody.read_direct(inputs, np.s_[:n_in, x : x + d, y : y + d, z : z + d])
            hydro.read_direct(targets, np.s_[:n_out, x : x + d, y : y + d, z : z + d])
        except Exception as exc:
            raise DataError(f"{self.file}: cannot read the {d}^3 crop at corner {corner}: {exc}") from exc
        return inputs, targets

    def device_normalization(self) -> tuple[Dataset, Any]:
        """The gpu pipeline's protocol (:mod:`dlscale.data.values.normalization`): raw samples and a device transform.

        ``inmem``: nothing is read on the host; the transform holds the volumes (moved to the device once) and
        cuts and rotates the crops there, from the batch's keys. ``lowmem``: the raw samples are the unrotated
        crops; the transform rotates them on the device, per sample, from the batch's keys. Either way the
        result is bitwise the data set's own samples.
        """
        if self._volumes is not None:
            return _KeysOnly(len(self)), DeviceCrops(self)
        raw = copy.copy(self)  # through __getstate__: its own file handle
        raw.orient = False
        return raw, DeviceRotation(self.planner, self.input_vectors, self.target_vectors)

    def _datasets(self) -> tuple[h5py.Dataset, h5py.Dataset]:
        """Both datasets of the file, opened once per process (on first use, so workers never share one)."""
        with self._handle_lock:
            if self._handle_pid != os.getpid() or self._handle is None:
                handle = h5py.File(self.file, "r")
                self._handle = (handle[INPUT_KEY], handle[TARGET_KEY])
                self._handle_pid = os.getpid()
            return self._handle

    def close(self) -> None:
        """Close the file this process opened; the next read reopens it."""
        with self._handle_lock:
            if self._handle is not None and self._handle_pid == os.getpid():
                self._handle[0].file.close()
            self._handle, self._handle_pid = None, None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_handle=None, _handle_pid=None, _handle_lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._handle_lock = threading.Lock()

    def describe_sample(self, index: int, epoch: int = 0) -> str:
        """Where sample ``index`` of ``epoch`` is cut, for error messages (see :mod:`dlscale.data.values.finite_check`)."""
        key = EpochIndex(epoch, index) if self.samples_depend_on_epoch else index
        corner, _ = self.planner.plan(key)
        return f"file {self.file}, {self.cfg.data_size}^3 crop at corner {corner}"

    def __repr__(self) -> str:
        d = self.cfg.data_size
        return (
            f"CosmoCropDataset(split={self.split!r}, file={self.file.name}, box={self.box}^3, samples={len(self)}, "
            f"crop={d}^3, {self.cfg.read_mode}, channels in/out={self.cfg.N_in_channels}/{self.cfg.N_out_channels}, "
            f"rotate_vectors={self.cfg.rotate_vectors})"
        )


class _KeysOnly(Dataset):
    """The inmem data set under the gpu pipeline: no host reads at all, only empty placeholders.

    Its device transform (:class:`DeviceCrops`) cuts each sample from the batch's keys.
    """

    def __init__(self, length: int):
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, key: EpochIndex | int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.empty(0), torch.empty(0)


class DeviceCrops:
    """Cuts and rotates crops on the device from volumes kept there (the inmem gpu pipeline)."""

    needs_sample_keys = True  # the gpu pipeline passes the batch's keys

    def __init__(self, dataset: CosmoCropDataset, volumes: tuple[torch.Tensor, ...] | None = None):
        assert dataset._volumes is not None
        self.planner, self.size = dataset.planner, dataset.cfg.data_size
        self.input_vectors, self.target_vectors = dataset.input_vectors, dataset.target_vectors
        self._dataset = dataset
        self.volumes = volumes or tuple(torch.from_numpy(v) for v in dataset._volumes)

    def to(self, device: torch.device) -> DeviceCrops:
        """A copy whose volumes live on ``device`` (moved once, for the whole run)."""
        return DeviceCrops(self._dataset, tuple(v.to(device) for v in self.volumes))

    def __call__(
        self, _inputs: torch.Tensor, _targets: torch.Tensor, keys: list[Any]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        d, (nbody, hydro) = self.size, self.volumes
        inputs = torch.empty((len(keys), nbody.shape[0], d, d, d), dtype=nbody.dtype, device=nbody.device)
        targets = torch.empty((len(keys), hydro.shape[0], d, d, d), dtype=hydro.dtype, device=hydro.device)
        for position, key in enumerate(keys):
            (x, y, z), orientation = self.planner.plan(key)
            region = np.s_[:, x : x + d, y : y + d, z : z + d]
            orient_tensor(nbody[region], orientation, self.input_vectors, out=inputs[position])
            orient_tensor(hydro[region], orientation, self.target_vectors, out=targets[position])
        return inputs, targets


class DeviceRotation:
    """Rotates each sample of a batch of unrotated crops on the device; its rotation comes from its key."""

    needs_sample_keys = True  # the gpu pipeline passes the batch's keys

    def __init__(self, planner: CropPlanner, input_vectors: tuple[int, ...], target_vectors: tuple[int, ...]):
        self.planner = planner
        self.input_vectors, self.target_vectors = input_vectors, target_vectors

    def to(self, device: torch.device) -> DeviceRotation:
        return self  # nothing lives on a device

    def __call__(
        self, inputs: torch.Tensor, targets: torch.Tensor, keys: list[Any]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        orientations = [self.planner.plan(key)[1] for key in keys]
        return (
            orient_batch(inputs, orientations, self.input_vectors),
            orient_batch(targets, orientations, self.target_vectors),
        )


def check_volume_file(path: Path, cfg: CosmoDataConfig, split: str) -> int:
    """Check one split's file against the config; return the side L of its volumes."""
    if not path.is_file():
        raise DataError(
            f"{path}: the {split} file does not exist (data.root={cfg.root!r}); point data.root at the "
            "tutorial's files (or DLSCALE_COSMO_DATA for the shipped configs), or generate data with "
            "`dlscale data synth-cosmo --out DIR`"
        )
    try:
        handle = h5py.File(path, "r")
    except Exception as exc:
        raise DataError(f"{path}: cannot be opened as HDF5 (unreadable or truncated file): {exc}") from exc
    with handle:
        shapes = {}
        for key, needed in ((INPUT_KEY, cfg.N_in_channels), (TARGET_KEY, cfg.N_out_channels)):
            if key not in handle or not isinstance(handle[key], h5py.Dataset):
                raise DataError(
                    f"{path}: no dataset '{key}' (the file has {sorted(handle.keys())}); expected "
                    f"'{INPUT_KEY}' (4, L, L, L) and '{TARGET_KEY}' (5, L, L, L)"
                )
            ds = handle[key]
            shape = tuple(int(v) for v in ds.shape)
            if len(shape) != 4 or not shape[1] == shape[2] == shape[3]:
                raise DataError(f"{path}: dataset '{key}' has shape {shape}, expected (channels, L, L, L)")
            if not np.issubdtype(ds.dtype, np.floating):
                raise DataError(f"{path}: dataset '{key}' has dtype {ds.dtype}, expected floating point")
            if shape[0] < needed:
                raise DataError(f"{path}: dataset '{key}' has {shape[0]} channels, the config needs {needed}")
            try:
                # The last element ends the storage: reading it fails on a cut-off file.
                ds[tuple(v - 1 for v in shape)]
            except Exception as exc:
                raise DataError(f"{path}: dataset '{key}' is truncated or damaged: {exc}") from exc
            shapes[key] = shape
    side, target_side = shapes[INPUT_KEY][1], shapes[TARGET_KEY][1]
    if side != target_side:
        raise DataError(
            f"{path}: '{INPUT_KEY}' is {side}^3 but '{TARGET_KEY}' is {target_side}^3; input and target must "
            "cover the same volume"
        )
    if cfg.box_size is not None:
        expected = cfg.box_size[0 if split == "train" else 1]
        if side != expected:
            raise DataError(f"{path}: volumes are {side}^3, but data.box_size says {expected} for {split}")
    if side < cfg.data_size:
        raise DataError(f"{path}: volumes are {side}^3, smaller than the {cfg.data_size}^3 crops (data_size)")
    return side


def load_volumes(path: Path, cfg: CosmoDataConfig) -> tuple[np.ndarray, np.ndarray]:
    """Both fields of a (checked) file, as float32 arrays in memory (``read_mode: inmem``)."""
    try:
        with h5py.File(path, "r") as handle:
            nbody = np.asarray(handle[INPUT_KEY][: cfg.N_in_channels], dtype=np.float32)
            hydro = np.asarray(handle[TARGET_KEY][: cfg.N_out_channels], dtype=np.float32)
    except Exception as exc:
        raise DataError(f"{path}: cannot load the volumes into memory: {exc}") from exc
    return nbody, hydro
