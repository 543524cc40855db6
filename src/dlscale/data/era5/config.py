"""The ERA5 workload's ``data:`` config section: where the files live and which part of each sample to use
(no torch, no h5py)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

from dlscale.errors import InvalidValue

_PATH_FIELDS = (
    "train_data_path",
    "valid_data_path",
    "inf_data_path",
    "global_means_path",
    "global_stds_path",
    "time_means_path",
    "climatology_path",
)


@dataclass
class ERA5DataConfig:
    """The `data:` section: where the ERA5 files live and which part of each sample to use."""

    root: str = "/data"  # base directory; relative paths below are joined to it
    train_data_path: str = "train"  # directory of the training years (*.h5)
    valid_data_path: str = "valid"  # directory of the validation years (*.h5)
    inf_data_path: str = "test"  # directory of the test/inference years (*.h5)
    global_means_path: str = "stats/global_means.npy"  # per-channel means, shape (1, C, 1, 1)
    global_stds_path: str = "stats/global_stds.npy"  # per-channel standard deviations, shape (1, C, 1, 1)
    time_means_path: str = "stats/time_means.npy"  # climatology for anomaly metrics; not read by the dataset
    # WeatherBench2's climatology by day of year and hour of day (dlscale data climatology writes it): the
    # forecast's ACC reference when it exists, else time_means_path
    climatology_path: str = "stats/climatology.zarr"
    img_size: tuple[int, int] = (360, 720)  # (H, W) crop taken from the top-left of each field
    dt: int = 1  # target = state dt steps (6 h each) after the input
    n_in_channels: int = 20  # input channels = the first n_in of the file's channels
    n_out_channels: int = 20  # target channels = the first n_out of the file's channels
    limit_nsamples: int | None = None  # keep only the first N training samples
    limit_nsamples_val: int | None = None  # keep only the first N validation samples
    # how samples are read: mmap = memory maps of contiguous float32 files (fastest), hdf5 = HDF5 calls,
    # auto = mmap on local file systems when every file allows it (parallel file systems serve maps slowly)
    read_method: Literal["auto", "hdf5", "mmap"] = "auto"
    check_finite: bool = (
        False  # stop at the first batch holding NaN/inf, naming its file and sample (a sync per batch)
    )

    # Keys that change what the model's weights mean; a resumed run refuses to change them (see resume.py).
    WEIGHT_DEFINING_KEYS: ClassVar[tuple[str, ...]] = ("img_size", "n_in_channels", "n_out_channels")

    def __post_init__(self) -> None:
        size = self.img_size
        if (
            not isinstance(size, (tuple, list))
            or len(size) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size)
        ):
            raise InvalidValue("img_size", f"expected two positive integers [H, W], got {size!r}")
        self.img_size = (size[0], size[1])
        if self.dt < 1:
            raise InvalidValue("dt", f"expected a number of time steps >= 1, got {self.dt}")
        if self.n_in_channels < 1:
            raise InvalidValue("n_in_channels", f"expected >= 1, got {self.n_in_channels}")
        if not 1 <= self.n_out_channels <= self.n_in_channels:
            raise InvalidValue(
                "n_out_channels",
                f"expected between 1 and n_in_channels={self.n_in_channels}, got {self.n_out_channels}",
            )
        for name in ("limit_nsamples", "limit_nsamples_val"):
            limit = getattr(self, name)
            if limit is not None and limit < 1:
                raise InvalidValue(name, f"expected a number of samples >= 1 or null (no limit), got {limit}")

    def path(self, field_name: str) -> Path:
        """The path in field `field_name` (or `root` itself), with `~` and `$VARS` expanded.

        Relative values are joined to `root`; absolute ones are kept as they are.
        """
        if field_name != "root" and field_name not in _PATH_FIELDS:
            raise ValueError(
                f"{field_name!r} is not a path field of ERA5DataConfig; expected one of {_PATH_FIELDS}"
            )
        root = Path(os.path.expandvars(os.path.expanduser(self.root)))
        if field_name == "root":
            return root
        value = Path(os.path.expandvars(os.path.expanduser(getattr(self, field_name))))
        return value if value.is_absolute() else root / value
