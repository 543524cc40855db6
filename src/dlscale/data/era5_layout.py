"""ERA5 on disk: the `data:` config section, and checks of the split directories and stats files.

`dlscale.data.era5` builds the dataset on top of these; see its docstring for the layout and the indexing.
Everything here opens files only inside `with` blocks, so no HDF5 handle outlives a call.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import h5py
import numpy as np

from dlscale.errors import DataError, InvalidValue

# FourCastNet's first 20 channels, the order the NERSC tutorial's files are believed to use.
ERA5_CHANNELS: tuple[str, ...] = (
    "u10",
    "v10",
    "t2m",
    "sp",
    "msl",
    "t850",
    "u1000",
    "v1000",
    "z1000",
    "u850",
    "v850",
    "z850",
    "u500",
    "v500",
    "z500",
    "t500",
    "z50",
    "r500",
    "r850",
    "tcwv",
)

FIELDS_KEY = "fields"

_PATH_FIELDS = (
    "train_data_path",
    "valid_data_path",
    "inf_data_path",
    "global_means_path",
    "global_stds_path",
    "time_means_path",
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


@dataclass(frozen=True)
class SplitLayout:
    """What validation learned about one split directory."""

    files: list[Path]
    steps_per_file: list[int]  # T_f of each file
    n_channels: int  # C of the files
    file_height: int  # H_file, before the crop
    file_width: int  # W_file, before the crop
    channel_names: tuple[str, ...]  # the first n_in channel names


def scan_split(cfg: ERA5DataConfig, key: str) -> SplitLayout:
    """Find and check the `*.h5` files of the split directory that config field `key` points to."""
    directory = cfg.path(key)
    where = f"{key}={getattr(cfg, key)!r} with root={cfg.root!r}"
    if not directory.is_dir():
        what = "is not a directory" if directory.exists() else "does not exist"
        raise DataError(
            f"{directory}: split directory {what} ({where}); expected a directory of *.h5 files. Point the "
            "data root at your ERA5 copy (--set data.root=PATH, or DLSCALE_ERA5_DATA for the shipped configs), or "
            "generate data with `dlscale data synth-era5`"
        )
    files = sorted(directory.glob("*.h5"))
    if not files:
        raise DataError(
            f"{directory}: no *.h5 file in this split directory ({where}); expected one file per year"
        )

    steps: list[int] = []
    first_shape: tuple[int, int, int] | None = None
    channel_names: tuple[str, ...] = ()
    for path in files:
        shape, names = _check_file(path, cfg)
        steps.append(shape[0])
        if first_shape is None:
            first_shape = shape[1:]
            channel_names = names
        elif shape[1:] != first_shape:
            raise DataError(
                f"{path}: dataset '{FIELDS_KEY}' has (C, H, W) = {shape[1:]}, but {files[0].name} in the same "
                f"split has {first_shape}; every file of a split must have the same channels and grid"
            )
    assert first_shape is not None
    c, h, w = first_shape
    return SplitLayout(files, steps, c, h, w, channel_names)


def _check_file(path: Path, cfg: ERA5DataConfig) -> tuple[tuple[int, int, int, int], tuple[str, ...]]:
    """Check one year file against the config; return the shape of `fields` and the input channel names."""
    try:
        handle = h5py.File(path, "r")
    except Exception as exc:
        raise DataError(f"{path}: cannot be opened as HDF5 (unreadable or truncated file): {exc}") from exc
    with handle:
        if FIELDS_KEY not in handle or not isinstance(handle[FIELDS_KEY], h5py.Dataset):
            keys = sorted(handle.keys())
            raise DataError(
                f"{path}: no dataset '{FIELDS_KEY}' (the file has keys {keys}); "
                f"expected '{FIELDS_KEY}' of shape (T, C, H, W)"
            )
        ds = handle[FIELDS_KEY]
        where = f"{path}: dataset '{FIELDS_KEY}'"
        if ds.ndim != 4:
            raise DataError(f"{where} has shape {ds.shape}, expected 4 dimensions (T, C, H, W)")
        if not np.issubdtype(ds.dtype, np.floating):
            raise DataError(f"{where} has dtype {ds.dtype}, expected a floating-point type")
        t, c, h, w = (int(v) for v in ds.shape)
        if c < cfg.n_in_channels:
            raise DataError(
                f"{where} has {c} channels, the config asks for n_in_channels={cfg.n_in_channels}"
            )
        height, width = cfg.img_size
        if h < height or w < width:
            raise DataError(
                f"{where} has a {h} x {w} grid (H x W), smaller than img_size={height} x {width}; "
                "the crop must fit inside the file's grid"
            )
        if t <= cfg.dt:
            raise DataError(
                f"{where} has {t} time steps, expected more than dt={cfg.dt} (no input/target pair fits)"
            )
        try:
            # The last element sits at the end of the storage, so reading it catches a cut-off file cheaply.
            ds[t - 1, c - 1, h - 1, w - 1]
        except Exception as exc:
            raise DataError(
                f"{where}: cannot read its last element, the file is truncated or damaged: {exc}"
            ) from exc
        names = _channel_names(ds, where, cfg.n_in_channels)
    return (t, c, h, w), names


def _channel_names(ds: h5py.Dataset, where: str, n_in: int) -> tuple[str, ...]:
    """The names of the first n_in channels: the dataset's `channels` attribute, else a default."""
    if "channels" in ds.attrs:
        raw = np.atleast_1d(ds.attrs["channels"])
        names = tuple(v.decode() if isinstance(v, bytes) else str(v) for v in raw.tolist())
        if len(names) < n_in:
            raise DataError(
                f"{where}: attribute 'channels' names {len(names)} channels, expected at least "
                f"n_in_channels={n_in}"
            )
        return names[:n_in]
    if n_in <= len(ERA5_CHANNELS):
        return ERA5_CHANNELS[:n_in]
    return tuple(f"ch{i}" for i in range(n_in))


def load_stats(
    cfg: ERA5DataConfig, key: str, channel_names: tuple[str, ...], positive: bool = False
) -> np.ndarray:
    """The first n_in_channels entries of the (1, C, 1, 1) stats file in field `key`, as float32.

    Every entry must be finite, and > 0 when `positive` (standard deviations divide the data).
    """
    path = cfg.path(key)
    n_in = cfg.n_in_channels
    if not path.is_file():
        raise DataError(f"{path}: stats file not found ({key}={getattr(cfg, key)!r} with root={cfg.root!r})")
    try:
        array = np.load(path, allow_pickle=False)
    except Exception as exc:
        raise DataError(f"{path}: not a readable .npy array ({key}): {exc}") from exc
    if (
        not isinstance(array, np.ndarray)
        or array.ndim != 4
        or array.shape[0] != 1
        or array.shape[2:] != (1, 1)
        or array.shape[1] < n_in
    ):
        shape = getattr(array, "shape", type(array).__name__)
        raise DataError(
            f"{path}: {key} has shape {shape}, expected (1, {n_in}, 1, 1), "
            f"or (1, C, 1, 1) with C > n_in_channels={n_in}"
        )
    if not np.issubdtype(array.dtype, np.number) or np.iscomplexobj(array):
        raise DataError(f"{path}: {key} has dtype {array.dtype}, expected real numbers")
    values = array[0, :n_in, 0, 0].astype(np.float64)
    for channel, (name, value) in enumerate(zip(channel_names, values, strict=True)):
        if not np.isfinite(value):
            raise DataError(f"{path}: {key} has a non-finite value {value} for channel {channel} ({name})")
        if positive and value <= 0:
            raise DataError(
                f"{path}: {key} has {value} for channel {channel} ({name}), expected a standard deviation > 0"
            )
    return values.astype(np.float32)


def latitudes(file_height: int, height: int) -> np.ndarray:
    """Latitudes in degrees of the first `height` rows of a grid whose `file_height` rows span +90 to -90."""
    rows = np.arange(height, dtype=np.float64)
    return 90.0 - 180.0 * rows / max(file_height - 1, 1)
