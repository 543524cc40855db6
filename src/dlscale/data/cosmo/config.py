"""The U-Net workload's ``data:`` config section: the two HDF5 files, the crops, and how they are read (no torch)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from dlscale.errors import InvalidValue


@dataclass
class CosmoDataConfig:
    """The ``data:`` section: the two HDF5 files, the crops, and how they are read."""

    root: str = "/data"  # directory that relative paths are joined to
    train_path: str = "downsamp_2048crop_train.h5"  # training volumes (the tutorial's 1024^3 file)
    val_path: str = "downsamp_1024crop_valid.h5"  # validation volumes (the tutorial's 512^3 file)
    box_size: list[int] | None = None  # expected sides [train, valid], checked against the files; null: any
    data_size: int = 64  # crop edge (voxels)
    Nsamples: int = 65536  # training samples (random crops) per epoch
    Nsamples_val: int = 8192  # validation samples (fixed crops)
    N_in_channels: int = 4  # the first N channels of Nbody are the input
    N_out_channels: int = 5  # the first N channels of Hydro are the target
    read_mode: Literal["lowmem", "inmem"] = "lowmem"  # crop reads from the file, or both fields in memory
    crop_seed: int = 0  # seeds every crop corner and rotation
    rotate_vectors: bool = True  # rotate velocity components with the volume (false: the tutorial's way)
    input_vector_channels: list[int] = field(default_factory=lambda: [1, 2, 3])  # Nbody's vx, vy, vz
    target_vector_channels: list[int] = field(default_factory=lambda: [2, 3, 4])  # Hydro's vx, vy, vz
    check_finite: bool = (
        False  # stop at the first batch holding NaN/inf, naming its file and sample (a sync per batch)
    )

    # Keys that change what the model's weights mean; a resumed run refuses to change them (see resume.py).
    WEIGHT_DEFINING_KEYS: ClassVar[tuple[str, ...]] = ("N_in_channels", "N_out_channels")

    def __post_init__(self) -> None:
        for name in ("data_size", "Nsamples", "Nsamples_val", "N_in_channels", "N_out_channels"):
            if getattr(self, name) < 1:
                raise InvalidValue(name, f"must be >= 1, got {getattr(self, name)}")
        if self.crop_seed < 0:
            raise InvalidValue("crop_seed", f"must be >= 0, got {self.crop_seed}")
        if self.box_size is not None and (len(self.box_size) != 2 or min(self.box_size) < self.data_size):
            raise InvalidValue(
                "box_size", f"expected [train side, valid side], each >= data_size, got {self.box_size}"
            )
        for name, channels in (
            ("input_vector_channels", self.N_in_channels),
            ("target_vector_channels", self.N_out_channels),
        ):
            indices = getattr(self, name)
            if indices and (len(set(indices)) != 3 or not all(0 <= c < channels for c in indices)):
                raise InvalidValue(
                    name,
                    f"expected 3 distinct channel indices (x, y, z) below {channels}, or [] for none; "
                    f"got {indices}",
                )

    def path(self, split: str) -> Path:
        """The file of ``split`` ("train" or "valid"), ``~`` and ``$VARS`` expanded, joined to ``root``."""
        value = self.train_path if split == "train" else self.val_path
        root = Path(os.path.expandvars(os.path.expanduser(self.root)))
        path = Path(os.path.expandvars(os.path.expanduser(value)))
        return path if path.is_absolute() else root / path
