"""ERA5 on disk: the `data:` config section, and checks of the split directories and stats files.

`dlscale.data.era5.dataset` builds the dataset on top of these; see its docstring for the layout and the indexing.
Everything here opens files only inside `with` blocks, so no HDF5 handle outlives a call.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from dlscale.data.era5.config import ERA5DataConfig
from dlscale.data.era5.coordinates import GridCoordinates, check_same_grid, read_coordinates
from dlscale.data.values.npy_files import read_npy_array
from dlscale.errors import DataError
from dlscale.runtime.file_status import NOT_FOUND, why_not_a_file

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
# The times an imported file also holds (dlscale data import-era5), in seconds since 1970; its latitudes and
# longitudes are dlscale.data.era5.coordinates's.
TIME_KEY = "time"

# The shipped configs' real-data root is ${DLSCALE_ERA5_DATA:-/data}.
ERA5_DATA_VARIABLE = "DLSCALE_ERA5_DATA"
ERA5_DATA_DEFAULT = "/data"
# The folders of the shipped demo and tiny configs, and the `synth-era5 --preset` that writes each.
SYNTHETIC_PRESET_OF_FOLDER = {"era5_demo": "demo", "era5_tiny": "tiny"}


@dataclass(frozen=True)
class SplitLayout:
    """What validation learned about one split directory."""

    files: list[Path]
    steps_per_file: list[int]  # T_f of each file
    n_channels: int  # C of the files
    file_height: int  # H_file, before the crop
    file_width: int  # W_file, before the crop
    channel_names: tuple[str, ...]  # the first n_in channel names
    grid: GridCoordinates  # where the file grid's rows and columns lie (the files' own, or the formula)


def missing_data_hint(cfg: ERA5DataConfig, key: str) -> str:
    """What to do when the directory of config field ``key`` is missing, naming the knob that sets it.

    The shipped configs take ``root`` from ``${DLSCALE_ERA5_DATA:-/data}`` (the real data) or name a folder
    that ``dlscale data synth-era5`` writes (``data/era5_demo``, ``data/era5_tiny``). The config loader
    expands ``${...}`` before this section is built, so the raw text is gone: a root equal to what
    ``${DLSCALE_ERA5_DATA:-/data}`` expands to now is taken to come from the variable, any other root to be
    a folder of synthetic data (or one the user named).
    """
    root = cfg.path("root")
    split = cfg.path(key)
    if not split.is_relative_to(root):  # an absolute path of its own: root does not lead there
        return f"Point data.{key} at a directory of *.h5 files (--set data.{key}=PATH)"
    from_environment = os.environ.get(ERA5_DATA_VARIABLE) or ERA5_DATA_DEFAULT
    if root == Path(os.path.expandvars(os.path.expanduser(from_environment))):
        if os.environ.get(ERA5_DATA_VARIABLE):
            where_from = f"{ERA5_DATA_VARIABLE}={from_environment}"
        else:
            where_from = f"{ERA5_DATA_DEFAULT}, the default when {ERA5_DATA_VARIABLE} is not set"
        return (
            f"The data root is {where_from}: export {ERA5_DATA_VARIABLE}=PATH, the directory of your ERA5 "
            "copy (it holds train/ valid/ test/ stats/), or pass --set data.root=PATH"
        )
    preset = SYNTHETIC_PRESET_OF_FOLDER.get(root.name, "demo")
    return (
        f"Generate the data with `dlscale data synth-era5 --out {shlex.quote(str(root))} --preset {preset}`, "
        "or point the config at your ERA5 copy with --set data.root=PATH"
    )


def scan_split(cfg: ERA5DataConfig, key: str) -> SplitLayout:
    """Find and check the `*.h5` files of the split directory that config field `key` points to."""
    directory = cfg.path(key)
    where = f"{key}={getattr(cfg, key)!r} with root={cfg.root!r}"
    if not directory.is_dir():
        what = "is not a directory" if directory.exists() else "does not exist"
        raise DataError(
            f"{directory}: split directory {what} ({where}); expected a directory of *.h5 files. "
            f"{missing_data_hint(cfg, key)}"
        )
    files = sorted(directory.glob("*.h5"))
    if not files:
        raise DataError(
            f"{directory}: no *.h5 file in this split directory ({where}); expected one file per year"
        )

    steps: list[int] = []
    first_shape: tuple[int, int, int] | None = None
    channel_names: tuple[str, ...] = ()
    first_grid: GridCoordinates | None = None
    for path in files:
        shape, names, grid = _check_file(path, cfg)
        steps.append(shape[0])
        if first_shape is None or first_grid is None:
            first_shape, channel_names, first_grid = shape[1:], names, grid
        elif shape[1:] != first_shape:
            raise DataError(
                f"{path}: dataset '{FIELDS_KEY}' has (C, H, W) = {shape[1:]}, but {files[0].name} in the same "
                f"split has {first_shape}; every file of a split must have the same channels and grid"
            )
        else:
            check_same_grid(first_grid, files[0], grid, path)
    assert first_shape is not None and first_grid is not None
    c, h, w = first_shape
    return SplitLayout(files, steps, c, h, w, channel_names, first_grid)


def _check_file(
    path: Path, cfg: ERA5DataConfig
) -> tuple[tuple[int, int, int, int], tuple[str, ...], GridCoordinates]:
    """Check one year file against the config; return the shape of `fields`, the input channel names and the
    grid's coordinates."""
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
        grid = read_coordinates(handle, path, h, w)
    return (t, c, h, w), names, grid


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
    where = f"{key}={getattr(cfg, key)!r} with root={cfg.root!r}"
    expected = f"{key}, a .npy array of shape (1, {n_in}, 1, 1) (or (1, C, 1, 1) with C > {n_in})"
    problem = why_not_a_file(path)
    if problem == NOT_FOUND:
        raise DataError(f"{path}: stats file not found ({where})")
    if problem is not None:
        raise DataError(f"{path}: {problem}; expected the stats file {expected} ({where})")
    array = read_npy_array(path, expected)
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
