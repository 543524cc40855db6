"""A dlscale data root as the truth of ``dlscale score``: the year files that ``dlscale data synth-era5`` and
``dlscale data import-era5`` write (``train/``, ``valid/`` and ``test/``, the tutorial's layout), read through
the methods :class:`~dlscale.data.era5.truth_reading.TruthStore` asks of an ERA5 store, so that lining up,
the up-front scan of damaged truth and persistence read it as they read a store.

What a data root says of itself is read as training and ``dlscale forecast`` read it:

- the channels: the ``channels`` attribute of ``fields``, else the tutorial's 20
  (:data:`~dlscale.data.era5.layout.ERA5_CHANNELS`); each is offered under WeatherBench2's variable and level
  (``z500`` as ``geopotential`` at 500 hPa, :func:`~dlscale.data.era5.importing.names.weatherbench2_name`), a
  channel without one under its own name, so the truth's channels are found as a store's are;
- the dates (:mod:`dlscale.data.era5.file_dates`): a file's ``time`` dataset (import-era5's), else its year's
  name plus ``hours_per_step`` per time index: the dates ``dlscale forecast --write`` gives the initial times it
  starts from these files, so a forecast lines up with its data root by date. The files of every split together
  are the truth's time axis (a forecast of the test split finds its dates in ``test/``); a file with no dates is
  left out (:attr:`DataRootSource.notes` says so), a date two files hold is refused;
- the grid (:mod:`dlscale.data.era5.coordinates`): the files' ``latitude``/``longitude`` datasets, else the
  tutorial's formula; every file must share it. A forecast is scored on it whole, or on the top-left crop that
  ``data.img_size`` reads where the forecast's grid is that crop (the tutorial's 720 of 721 rows;
  :meth:`DataRootSource.crop_to`, said in :attr:`DataRootSource.notes`);
- the units: the files hold unnormalized values (``stats/`` only normalizes the model's inputs), the physical
  units a forecast file holds, so the values are read as they are.

Files are opened on first read and kept open until :meth:`DataRootSource.close`; a file that HDF5 cannot read is
one line naming it, the channel and the date.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from dlscale.data.era5.coordinates import read_coordinates
from dlscale.data.era5.damaged_reads import is_read_failure
from dlscale.data.era5.file_dates import file_dates, hours_per_step, minute_text
from dlscale.data.era5.grid_matching import grid_text, same_points
from dlscale.data.era5.importing.names import weatherbench2_name
from dlscale.data.era5.layout import ERA5_CHANNELS, FIELDS_KEY
from dlscale.errors import DataError, exception_line

SPLITS = ("train", "valid", "test")  # the split directories a data root holds, as the configs name them
YEAR_FILES = "*.h5"


def is_data_root(path: Path) -> bool:
    """Whether ``path`` is a dlscale data root (a directory whose ``train/``, ``valid/`` or ``test/`` holds
    ``*.h5`` year files) or one of its split directories (a directory of ``*.h5`` files)."""
    if not path.is_dir():
        return False
    return bool(_year_files(path))


def _year_files(root: Path) -> list[tuple[str, Path]]:
    """(split, file) of every year file: those of the split directories, else ``root``'s own."""
    found = [
        (split, path)
        for split in SPLITS
        if (root / split).is_dir()
        for path in sorted((root / split).glob(YEAR_FILES))
    ]
    if found:
        return found
    return [(root.name, path) for path in sorted(root.glob(YEAR_FILES))]


@dataclass
class RootVariable:
    """A variable of the data root as a store would hold it: its levels (None: a surface field), the files'
    channel at each level, and the times (every channel of a data root has all of them)."""

    name: str
    levels: list[int] | None
    channel_at: dict[int | None, int]  # level (None for a surface field) -> the channel's index in `fields`
    times: np.ndarray = field(default_factory=lambda: np.array([], dtype="datetime64[ns]"))


@dataclass(frozen=True)
class YearFile:
    """One year file: its split, its path and the date of each of its time indices."""

    split: str
    path: Path
    dates: np.ndarray  # datetime64[ns]


class DataRootSource:
    """The year files of a data root, read as :class:`~dlscale.data.era5.importing.source.ERA5Source` is: its
    variables, its grid and reads of (times, levels) of one variable (see the module's docstring)."""

    kind = "data root"
    local_store = None  # no zarr chunks to check

    def __init__(self, root: Path):
        self.root = root
        self.description = str(root)
        self.notes: list[str] = []
        listed = _year_files(root)
        if not listed:
            raise DataError(
                f"{root}: no {YEAR_FILES} year file in it nor in its {', '.join(f'{s}/' for s in SPLITS)}; "
                "expected a dlscale data root (dlscale data synth-era5 or import-era5 writes one)"
            )
        described = [(split, _describe(path)) for split, path in listed]
        first = described[0][1]
        for _, other in described[1:]:
            _check_alike(other, first)
        self.channel_names = first.channel_names
        self.latitude, self.longitude = first.latitudes, first.longitudes
        self.file_height, self.file_width = len(self.latitude), len(self.longitude)
        self.files = [
            YearFile(split, file.path, file.dates.astype("datetime64[ns]"))
            for split, file in described
            if file.dates is not None
        ]
        undated = [str(file.path.relative_to(root)) for _, file in described if file.dates is None]
        if not self.files:
            raise DataError(
                f"{root}: none of its year files has dates (a 'time' dataset, or a year as its name, 2018.h5), "
                "so none can be lined up with a forecast's times"
            )
        if undated:
            self.notes.append(
                f"{root}: left out {', '.join(undated)}: no 'time' dataset and no year as its name, so its "
                "states have no dates to line up with a forecast's"
            )
        self._index_times()
        self.variables = _variables(self.channel_names, root)
        for variable in self.variables.values():
            variable.times = self.times
        self._handles: dict[int, h5py.File] = {}

    def _index_times(self) -> None:
        """The times of every file, sorted, and where each lies (file, time index); a date two files hold is
        refused (the truth at it would be whichever was read)."""
        dates = np.concatenate([file.dates for file in self.files])
        owner = np.concatenate([np.full(len(file.dates), f) for f, file in enumerate(self.files)])
        index = np.concatenate([np.arange(len(file.dates)) for file in self.files])
        order = np.argsort(dates, kind="stable")
        self.times, self._file_of, self._index_of = dates[order], owner[order], index[order]
        repeated = np.flatnonzero(self.times[1:] == self.times[:-1])
        if len(repeated):
            at = int(repeated[0])
            files = [self.files[self._file_of[i]] for i in (at, at + 1)]
            where = [
                f"{file.path.relative_to(self.root)} (index {self._index_of[i]})"
                for file, i in zip(files, (at, at + 1), strict=True)
            ]
            raise DataError(
                f"{self.root}: {' and '.join(where)} both hold {minute_text(self.times[at])}; the truth at a date must "
                "come from one file: remove the copy (the splits of a data root cover different dates)"
            )

    def holdings(self) -> str:
        """What the root holds, for a message: ``1024 times, train 1979-01-01T00:00 .. 1980-05-07T18:00, test
        ...``, split by split."""
        parts = []
        for split in dict.fromkeys(file.split for file in self.files):
            dates = np.concatenate([file.dates for file in self.files if file.split == split])
            parts.append(f"{split}/ {minute_text(dates.min())} .. {minute_text(dates.max())}")
        missing = [split for split in SPLITS if not (self.root / split).is_dir()]
        lacks = (
            f"; it has no {', '.join(f'{s}/' for s in missing)}"
            if missing and len(missing) < len(SPLITS)
            else ""
        )
        return f"{len(self.times)} times: {', '.join(parts)}{lacks}"

    def crop_to(self, latitudes: np.ndarray, longitudes: np.ndarray) -> None:
        """Score on the top-left crop ``data.img_size`` reads when the forecast's grid (``latitudes`` x
        ``longitudes``, in any order) is that crop of the files' grid, not the whole of it; nothing otherwise
        (a grid that is neither is refused by the caller, as for any truth)."""
        height, width = len(latitudes), len(longitudes)
        if (
            (height, width) == (len(self.latitude), len(self.longitude))
            or height > len(self.latitude)
            or width > len(self.longitude)
        ):
            return
        if not (
            same_points(self.latitude[:height], latitudes, wrap=False)
            and same_points(self.longitude[:width], longitudes, wrap=True)
        ):
            return
        self.notes.append(
            f"{self.root}: scored on the top-left {height} x {width} of its {self.file_height} x {self.file_width} "
            "grid, the crop a dlscale run reads (data.img_size), which the forecast is on"
        )
        self.latitude, self.longitude = self.latitude[:height], self.longitude[:width]

    def levels_of_variables(self) -> dict[str, list[int] | None]:
        return {name: variable.levels for name, variable in self.variables.items()}

    @property
    def north_to_south(self) -> bool:
        return bool(self.latitude[0] > self.latitude[-1])

    def read_levels(
        self, variable_name: str, levels_hpa: list[int | None], times: np.ndarray, outs: list[np.ndarray]
    ) -> None:
        """Levels ``levels_hpa`` of one variable at ``times`` (each one of :attr:`times`) into ``outs``, float32
        arrays (len(times), lat, lon) on the grid (the crop, where :meth:`crop_to` chose one)."""
        variable = self.variables[variable_name]
        channels = [variable.channel_at[level] for level in levels_hpa]
        times = np.asarray(times).astype("datetime64[ns]")
        positions = np.searchsorted(self.times, times)
        found = positions < len(self.times)
        found[found] = self.times[positions[found]] == times[found]
        if not found.all():
            raise DataError(f"{self.root}: holds no state at {minute_text(times[np.argmin(found)])}")
        height, width = len(self.latitude), len(self.longitude)
        low, high = min(channels), max(channels) + 1
        for f in np.unique(self._file_of[positions]):
            rows = np.flatnonzero(self._file_of[positions] == f)
            indices = self._index_of[positions[rows]]
            wanted, back = np.unique(indices, return_inverse=True)  # HDF5 reads increasing, distinct indices
            file = self.files[int(f)]
            try:
                block = self._read(int(f), wanted, low, high)[:, :, :height, :width]
            except Exception as exc:
                if not is_read_failure(exc):
                    raise
                raise DataError(
                    f"{file.path}: '{FIELDS_KEY}' cannot be read at {minute_text(file.dates[wanted[0]])} .. "
                    f"{minute_text(file.dates[wanted[-1]])} (channels of {variable_name!r}): {exception_line(exc)}; the "
                    "file is damaged: write it again (dlscale data synth-era5 or import-era5)"
                ) from exc
            for out, channel in zip(outs, channels, strict=True):
                out[rows] = block[back, channel - low]

    def missing_chunks(
        self, variable_name: str, time: np.datetime64, levels_hpa: list[int | None]
    ) -> list[str]:
        """No chunk files: an HDF5 year file holds every value, so a NaN is the file's own."""
        return []

    def _read(self, f: int, indices: np.ndarray, low: int, high: int) -> np.ndarray:
        """Channels ``low`` .. ``high`` - 1 of file ``f`` at its time ``indices`` (increasing, distinct): one
        slice where they lie close together (HDF5 reads a slice at once, a list of indices one by one)."""
        first, last = int(indices[0]), int(indices[-1]) + 1
        if last - first <= 2 * len(indices) + 8:
            return self._fields(f)[first:last, low:high][indices - first]
        return self._fields(f)[indices.tolist(), low:high]

    def _fields(self, f: int) -> h5py.Dataset:
        handle = self._handles.get(f)
        if handle is None:
            handle = self._handles[f] = h5py.File(self.files[f].path, "r")
        return handle[FIELDS_KEY]

    def close(self) -> None:
        for handle in self._handles.values():
            handle.close()
        self._handles = {}


@dataclass(frozen=True)
class FileDescription:
    """What one year file holds, read from its metadata."""

    path: Path
    channel_names: tuple[str, ...]
    latitudes: np.ndarray
    longitudes: np.ndarray
    dates: np.ndarray | None  # None: neither a 'time' dataset nor a year as its name


def _describe(path: Path) -> FileDescription:
    """One year file's channels, grid and dates, checked to be a data root's ``fields``."""
    try:
        handle = h5py.File(path, "r")
    except Exception as exc:
        if not is_read_failure(exc):
            raise
        raise DataError(
            f"{path}: cannot be opened as HDF5 ({exception_line(exc)}); expected a year file of a dlscale data "
            "root"
        ) from exc
    with handle:
        fields = handle.get(FIELDS_KEY)
        usable = isinstance(fields, h5py.Dataset) and fields.ndim == 4
        if not usable or not np.issubdtype(fields.dtype, np.floating):
            what = f"shape {fields.shape}, {fields.dtype}" if isinstance(fields, h5py.Dataset) else "none"
            raise DataError(
                f"{path}: its '{FIELDS_KEY}' ({what}) is not the (time, channel, latitude, longitude) floats of "
                "a dlscale data root's year file"
            )
        steps, channels, height, width = (int(n) for n in fields.shape)
        names = _channel_names(fields, path, channels)
        grid = read_coordinates(handle, path, height, width)
    dates = file_dates(path, steps, hours_per_step(path))
    return FileDescription(path, names, grid.latitudes, grid.longitudes, dates)


def _check_alike(file: FileDescription, first: FileDescription) -> None:
    """Every year file of a data root holds the same channels on one grid."""
    if file.channel_names != first.channel_names:
        raise DataError(
            f"{file.path}: holds the channels {', '.join(file.channel_names)}, {first.path} holds "
            f"{', '.join(first.channel_names)}; every year file of a data root holds the same channels"
        )
    same_latitudes = np.array_equal(file.latitudes, first.latitudes)
    if not (same_latitudes and np.array_equal(file.longitudes, first.longitudes)):
        raise DataError(
            f"{file.path}: its grid, {grid_text(file.latitudes, file.longitudes)}, is not that of {first.path}, "
            f"{grid_text(first.latitudes, first.longitudes)}; every year file of a data root shares one grid"
        )


def _channel_names(fields: h5py.Dataset, path: Path, count: int) -> tuple[str, ...]:
    """The name of each of the ``count`` channels: the ``channels`` attribute, else the tutorial's (``ch<i>``
    beyond its 20), as training reads them."""
    if "channels" in fields.attrs:
        raw = np.atleast_1d(fields.attrs["channels"]).tolist()
        names = tuple(value.decode() if isinstance(value, bytes) else str(value) for value in raw)
        if len(names) < count:
            raise DataError(
                f"{path}: the 'channels' attribute of '{FIELDS_KEY}' names {len(names)} channels, the data holds "
                f"{count}"
            )
        names = names[:count]
    else:
        names = (
            ERA5_CHANNELS[:count] if count <= len(ERA5_CHANNELS) else tuple(f"ch{i}" for i in range(count))
        )
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise DataError(f"{path}: the 'channels' attribute of '{FIELDS_KEY}' names {repeated[0]} twice")
    return names


def _variables(channel_names: tuple[str, ...], root: Path) -> dict[str, RootVariable]:
    """The channels as a store's variables: WeatherBench2's name and level where it has one, else the channel's
    own name (a surface field)."""
    variables: dict[str, RootVariable] = {}
    for index, name in enumerate(channel_names):
        variable, level = weatherbench2_name(name) or (name, None)
        known = variables.get(variable)
        if known is None:
            variables[variable] = RootVariable(variable, None if level is None else [level], {level: index})
            continue
        if (known.levels is None) != (level is None) or level in known.channel_at:
            raise DataError(
                f"{root}: its channels {channel_names[known.channel_at[next(iter(known.channel_at))]]} and {name} "
                f"both name the variable {variable!r}; rename one in the 'channels' attribute"
            )
        known.channel_at[level] = index
        known.levels = sorted([*(known.levels or []), level])  # type: ignore[list-item]
    return variables
