"""An ERA5 source opened with xarray: a zarr store (ARCO-ERA5, WeatherBench2) or a set of netCDF files (CDS).

What differs between the sources and is made uniform here:

- coordinate names: time is ``time`` or (new CDS) ``valid_time``; the pressure level is ``level`` or (new CDS)
  ``pressure_level``; latitude and longitude are ``latitude``/``longitude`` or ``lat``/``lon``;
- dimension order: WeatherBench2 stores keep (time, longitude, latitude), the others (time, latitude,
  longitude); every read is returned as (time, latitude, longitude);
- files: a zarr store holds every variable for all times; CDS downloads come as one file per month or year,
  often with the single-level and the pressure-level fields in separate files. Each variable's time axis is
  the files that hold it, in time order.

Everything is opened lazily and without dask (``chunks=None``): a read pulls exactly the requested time steps.
The checks that need no data values (variables, levels, a time axis that goes back or repeats, files on
different grids; a zarr store's metadata and codecs, :mod:`dlscale.data.era5.store_metadata`; a path that is no
store or netCDF file, :mod:`.source_paths`) happen when the source is opened, before anything is written.

A damaged source is one line at the read that meets it (import-era5's blocks, score's truth alike): before
reading a local zarr store, the chunk files of the read are checked (:mod:`dlscale.data.era5.chunk_files`: a
directory, a dangling link, a link loop, a pipe or a file far too large in a chunk's place is refused; a missing
chunk reads as the fill value, as zarr's rules say); a chunk or file that fails to decode (truncated, garbage, a
link to a file that is no chunk) is a DataError naming the store or file, the variable and the first time step
that fails (:mod:`dlscale.data.era5.damaged_reads`).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dlscale.data.era5.chunk_files import CheckedChunks, ChunkLayout, StoreChunks
from dlscale.data.era5.damaged_reads import DAMAGED_ADVICE, REPAIR, is_read_failure
from dlscale.data.era5.importing.names import levels_in_hpa
from dlscale.data.era5.importing.plan import hour_text
from dlscale.data.era5.importing.source_paths import (
    check_remote_metadata,
    is_zarr_store,
    netcdf_files,
    not_netcdf_text,
    open_zarr,
    refuse_unreachable,
)
from dlscale.data.era5.store_metadata import check_local_zarr_metadata
from dlscale.errors import ConfigError, DataError, exception_line

TIME_NAMES = ("time", "valid_time")
LEVEL_NAMES = ("level", "pressure_level", "isobaricInhPa", "plev")
LATITUDE_NAMES = ("latitude", "lat")
LONGITUDE_NAMES = ("longitude", "lon")
# URL scheme -> the fsspec backend package that serves it
REMOTE_BACKENDS = {"gs": "gcsfs", "gcs": "gcsfs", "s3": "s3fs"}
INSTALL_HINT = "pip install 'dlscale[era5]'"


def import_xarray() -> Any:
    """xarray, or a ConfigError saying how to install it (it is the ``era5`` extra, not a core dependency)."""
    try:
        import xarray
    except ImportError as exc:
        raise ConfigError(
            f"import-era5 reads ERA5 with xarray, which is not installed: {INSTALL_HINT}"
        ) from exc
    return xarray


@dataclass
class Segment:
    """One variable in one file (or the whole zarr store): the lazy array and its times."""

    array: Any  # xarray.DataArray, not loaded
    times: np.ndarray  # datetime64[ns]
    where: str


@dataclass
class SourceVariable:
    """A variable over all the files that hold it, its time axis strictly increasing."""

    name: str
    dims: dict[str, str]  # role (time, level, latitude, longitude) -> dimension name
    levels: list[int] | None
    segments: list[Segment] = field(default_factory=list)
    times: np.ndarray = field(default_factory=lambda: np.array([], dtype="datetime64[ns]"))
    segment_of_position: np.ndarray = field(default_factory=lambda: np.array([], dtype=np.int64))
    first_position: list[int] = field(default_factory=list)


class ERA5Source:
    """The variables of a source and reads of (time steps, one level) of any of them."""

    def __init__(
        self, description: str, kind: str, datasets: list[tuple[str, Any]], local_store: Path | None = None
    ):
        """``local_store``: the zarr store's directory on a local disk, whose chunk files each read checks
        (:mod:`dlscale.data.era5.chunk_files`); None for netCDF files and remote stores."""
        self.description = description
        self.kind = kind
        self._datasets = datasets
        self.local_store = local_store
        self._chunks = StoreChunks(local_store)
        self.variables: dict[str, SourceVariable] = {}
        self.notes: list[str] = []  # how the source was read where it differs from the usual (levels in Pa)
        self.latitude = np.array([])
        self.longitude = np.array([])
        grid_of: str | None = None
        for where, dataset in datasets:
            grid = _grid(dataset)
            if grid is None:
                continue
            if grid_of is None:
                self.latitude, self.longitude, grid_of = grid[0], grid[1], where
            elif not (np.array_equal(grid[0], self.latitude) and np.array_equal(grid[1], self.longitude)):
                raise DataError(
                    f"{where}: its grid ({_grid_text(*grid)}) differs from that of {grid_of} "
                    f"({_grid_text(self.latitude, self.longitude)}); every file of a source must share one grid"
                )
            self._add_variables(where, dataset)
        if grid_of is None:
            raise DataError(f"{description}: no variable on a latitude/longitude grid with a time axis")
        for variable in self.variables.values():
            _join_segments(variable)
        if not (np.all(np.diff(self.latitude) > 0) or np.all(np.diff(self.latitude) < 0)):
            raise DataError(
                f"{description}: the latitudes are not in order (neither north to south nor south to north)"
            )

    def _add_variables(self, where: str, dataset: Any) -> None:
        for name, array in dataset.data_vars.items():
            dims = _roles(array.dims)
            if dims is None:
                continue  # not a (time, [level], lat, lon) field: e.g. CDS's expver or a bounds variable
            levels = None
            if "level" in dims:
                levels = self._levels_in_hpa(where, dataset[dims["level"]])
            times = np.asarray(dataset[dims["time"]].values)
            if not np.issubdtype(times.dtype, np.datetime64):
                raise DataError(
                    f"{where}: the time coordinate {dims['time']!r} is not decoded to dates ({times.dtype})"
                )
            variable = self.variables.get(name)
            if variable is None:
                variable = self.variables[name] = SourceVariable(name, dims, levels)
            elif variable.levels != levels:
                raise DataError(
                    f"{where}: variable {name!r} has levels {levels}, another file has {variable.levels}"
                )
            variable.segments.append(Segment(array, times.astype("datetime64[ns]"), where))

    def _levels_in_hpa(self, where: str, coordinate: Any) -> list[int]:
        """A level coordinate in hPa: one in Pa (its ``units`` attribute says so, or every level is above
        :data:`~dlscale.data.era5.importing.names.MOST_HPA`) is divided by 100, and :attr:`notes` says so once."""
        levels, why = levels_in_hpa(
            np.asarray(coordinate.values, np.float64), str(coordinate.attrs.get("units", ""))
        )
        note = f"{where}: its levels are in Pa ({why}): read as hPa, divided by 100"
        if why is not None and note not in self.notes:
            self.notes.append(note)
        return [_hpa(level) for level in levels]

    def levels_of_variables(self) -> dict[str, list[int] | None]:
        return {name: variable.levels for name, variable in self.variables.items()}

    @property
    def north_to_south(self) -> bool:
        return bool(self.latitude[0] > self.latitude[-1])

    def read(self, variable_name: str, level_hpa: int | None, times: np.ndarray) -> np.ndarray:
        """float32 (len(times), lat, lon) of one variable at one level (None: it has none) at ``times``."""
        out = np.empty((len(times), len(self.latitude), len(self.longitude)), dtype=np.float32)
        self.read_levels(variable_name, [level_hpa], times, [out])
        return out

    def read_levels(
        self, variable_name: str, levels_hpa: list[int | None], times: np.ndarray, outs: list[np.ndarray]
    ) -> None:
        """Levels ``levels_hpa`` of one variable at ``times`` (each one of its times) into ``outs``, float32
        arrays (len(times), lat, lon) in the source's latitude order (views of a block, perhaps flipped).

        All levels in one request: ARCO-ERA5 keeps the 37 levels of a time step in one chunk, which a read
        per level would fetch and decompress once per level."""
        variable = self.variables[variable_name]
        positions = np.searchsorted(variable.times, times)
        missing = (positions >= len(variable.times)) | (
            variable.times[np.minimum(positions, len(variable.times) - 1)] != times
        )
        if missing.any():
            raise DataError(
                f"{self.description}: variable {variable_name!r} has no time {times[np.argmax(missing)]}"
            )
        segments = variable.segment_of_position[positions]
        roles = (
            ("time", "level", "latitude", "longitude")
            if "level" in variable.dims
            else ("time", "latitude", "longitude")
        )
        indices: list[int] = []
        wanted: list[int] = []
        if "level" in variable.dims:
            indices = [variable.levels.index(level) for level in levels_hpa]  # type: ignore[union-attr]
            # increasing, as every backend takes them (HDF5 selections must be); each out finds its own
            wanted = sorted(set(indices))
        for segment_index in np.unique(segments):
            rows = np.nonzero(segments == segment_index)[0]
            segment = variable.segments[segment_index]
            local = positions[rows] - variable.first_position[segment_index]
            self._refuse_damaged_chunks(variable, segment, local, wanted, levels_hpa)
            selection: dict[str, Any] = {variable.dims["time"]: _as_slice(local)}
            if "level" in variable.dims:
                selection[variable.dims["level"]] = _as_slice(np.array(wanted))
            part = segment.array.isel(selection)
            try:
                values = np.asarray(part.values)
            except Exception as exc:
                if not is_read_failure(exc):
                    raise
                raise self._unreadable(variable, segment, local, selection, wanted, levels_hpa, exc) from exc
            values = values.transpose([part.dims.index(variable.dims[r]) for r in roles])
            for position, out in enumerate(outs):
                out[rows] = values[:, wanted.index(indices[position])] if "level" in variable.dims else values

    def missing_chunks(
        self, variable_name: str, time: np.datetime64, levels_hpa: list[int | None]
    ) -> list[str]:
        """The chunk files of ``variable_name`` at ``time`` (one of its times) and ``levels_hpa`` that a local
        zarr store lacks, as a message names them (``2m_temperature/1.0.0``): zarr reads them as the fill value,
        NaN for a store xarray wrote. Empty for netCDF files and remote stores."""
        variable = self.variables[variable_name]
        position = int(np.searchsorted(variable.times, time))
        segment_index = int(variable.segment_of_position[position])
        local = np.array([position - variable.first_position[segment_index]])
        wanted = [variable.levels.index(level) for level in levels_hpa] if variable.levels is not None else []
        layout, selection = self._chunk_selection(variable, variable.segments[segment_index], local, wanted)
        if layout is None:
            return []
        return [layout.name(problem.index) for problem in layout.problems(selection) if problem.missing]

    def _chunk_selection(
        self, variable: SourceVariable, segment: Segment, local: np.ndarray, wanted: list[int]
    ) -> tuple[ChunkLayout | None, dict[int, Any]]:
        """The chunk layout of ``variable`` in a local store (None elsewhere), and the element indices read along
        its time and level axes."""
        dims = list(segment.array.dims)
        layout = self._chunks.layout(variable.name, len(dims))
        if layout is None:
            return None, {}
        selection: dict[int, Any] = {dims.index(variable.dims["time"]): local}
        if "level" in variable.dims:
            selection[dims.index(variable.dims["level"])] = wanted
        return layout, selection

    def _refuse_damaged_chunks(
        self,
        variable: SourceVariable,
        segment: Segment,
        local: np.ndarray,
        wanted: list[int],
        levels_hpa: list[int | None],
    ) -> None:
        """A DataError for the first chunk file of the read that is a directory, a dangling link, a link loop, no
        regular file or too large (zarr would read most of these as missing, silently); a missing one is the
        fill value, by zarr's rules, and reads as such."""
        layout, selection = self._chunk_selection(variable, segment, local, wanted)
        if layout is None:
            return
        for problem in layout.problems(selection):
            if problem.missing:
                continue
            time_axis = list(segment.array.dims).index(variable.dims["time"])
            chunk_length = layout.chunks[time_axis]
            first = next(int(i) for i in local if int(i) // chunk_length == problem.index[time_axis])
            raise DataError(
                f"{segment.where}: variable {variable.name!r}{_levels_text(variable, levels_hpa)} at "
                f"{hour_text(segment.times[first])}: its chunk {layout.name(problem.index)} {problem.what}; "
                f"the store is damaged: {REPAIR}"
            )

    def _unreadable(
        self,
        variable: SourceVariable,
        segment: Segment,
        local: np.ndarray,
        selection: dict[str, Any],
        wanted: list[int],
        levels_hpa: list[int | None],
        exc: BaseException,
    ) -> DataError:
        """The read of ``local`` failed: find the first time step that fails alone, and say which."""
        time_dim = variable.dims["time"]
        failing, failure = int(local[0]), exc
        for index in local:
            try:
                np.asarray(
                    segment.array.isel({**selection, time_dim: slice(int(index), int(index) + 1)}).values
                )
            except Exception as alone:
                if not is_read_failure(alone):
                    raise
                failing, failure = int(index), alone
                break
        layout, chunk_selection = self._chunk_selection(variable, segment, np.array([failing]), wanted)
        names = (
            [layout.name(index) for index in layout.indices(chunk_selection)] if layout is not None else []
        )
        chunk = CheckedChunks(names, []).text()
        advice = (
            f"{DAMAGED_ADVICE}: {REPAIR}" if self.kind == "zarr" else "the file is damaged: download it again"
        )
        return DataError(
            f"{segment.where}: variable {variable.name!r}{_levels_text(variable, levels_hpa)} cannot be read at "
            f"{hour_text(segment.times[failing])}{chunk}: {exception_line(failure)}; {advice}"
        )

    def close(self) -> None:
        for _, dataset in self._datasets:
            dataset.close()


def open_source(source: str) -> ERA5Source:
    """Open ``source``: a zarr store (path or gs:// / s3:// URL), a directory of netCDF files, a glob of
    them or one netCDF file."""
    xarray = import_xarray()
    scheme = source.split("://", 1)[0] if "://" in source else None
    if scheme is not None:
        backend = REMOTE_BACKENDS.get(scheme)
        if backend is None:
            raise ConfigError(
                f"import-era5: cannot read {source}: only local paths, gs:// and s3:// are supported"
            )
        missing = [name for name in ("fsspec", backend) if importlib.util.find_spec(name) is None]
        if missing:
            raise ConfigError(
                f"import-era5: reading {source} needs {' and '.join(missing)}: pip install fsspec {backend}"
            )
        check_remote_metadata(source)
        return ERA5Source(source, "zarr", [(source, open_zarr(xarray, source))])
    path = Path(source).expanduser()
    if is_zarr_store(path):
        check_local_zarr_metadata(path)
        return ERA5Source(str(path), "zarr", [(str(path), open_zarr(xarray, str(path)))], local_store=path)
    refuse_unreachable(source, path)
    files = netcdf_files(source, path)
    datasets = []
    try:
        for file in files:
            try:
                datasets.append((str(file), xarray.open_dataset(file, chunks=None)))
            except Exception as exc:
                if not is_read_failure(exc):
                    raise
                raise DataError(not_netcdf_text(file, exc)) from exc
        return ERA5Source(source, "netcdf", datasets)
    except BaseException:
        for _, dataset in datasets:
            dataset.close()
        raise


def _roles(dims: tuple[str, ...]) -> dict[str, str] | None:
    """role -> dimension name for a (time, [level], latitude, longitude) field in any order, else None."""
    roles: dict[str, str] = {}
    for role, names in (
        ("time", TIME_NAMES),
        ("level", LEVEL_NAMES),
        ("latitude", LATITUDE_NAMES),
        ("longitude", LONGITUDE_NAMES),
    ):
        found = [dim for dim in dims if dim in names]
        if found:
            roles[role] = found[0]
    if not {"time", "latitude", "longitude"} <= roles.keys() or len(roles) != len(dims):
        return None
    return roles


def _grid(dataset: Any) -> tuple[np.ndarray, np.ndarray] | None:
    latitude = next((dataset[name] for name in LATITUDE_NAMES if name in dataset.coords), None)
    longitude = next((dataset[name] for name in LONGITUDE_NAMES if name in dataset.coords), None)
    if latitude is None or longitude is None:
        return None
    return np.asarray(latitude.values, dtype=np.float64), np.asarray(longitude.values, dtype=np.float64)


def _grid_text(latitude: np.ndarray, longitude: np.ndarray) -> str:
    return (
        f"{len(latitude)} x {len(longitude)}, latitude {latitude[0]:g}..{latitude[-1]:g}, "
        f"longitude {longitude[0]:g}..{longitude[-1]:g}"
    )


def _hpa(value: Any) -> int:
    level = float(value)
    return int(level) if level.is_integer() else level  # type: ignore[return-value]


def _join_segments(variable: SourceVariable) -> None:
    """Order the variable's files by their first time and check that the joined axis strictly increases."""
    for segment in variable.segments:
        _check_increasing(segment.times, f"{segment.where}: variable {variable.name!r}")
    variable.segments.sort(
        key=lambda segment: segment.times[0] if len(segment.times) else np.datetime64("NaT")
    )
    variable.times = np.concatenate([segment.times for segment in variable.segments])
    variable.segment_of_position = np.concatenate(
        [np.full(len(segment.times), index) for index, segment in enumerate(variable.segments)]
    )
    variable.first_position = list(np.cumsum([0] + [len(s.times) for s in variable.segments[:-1]]))
    for previous, segment in zip(variable.segments, variable.segments[1:], strict=False):
        if len(previous.times) and len(segment.times) and segment.times[0] <= previous.times[-1]:
            raise DataError(
                f"{segment.where}: variable {variable.name!r} starts at {hour_text(segment.times[0])}, "
                f"before {previous.where} ends ({hour_text(previous.times[-1])}); files of one variable must "
                "not overlap in time"
            )


def _check_increasing(times: np.ndarray, where: str) -> None:
    steps = np.diff(times)
    if len(steps) and not (steps > np.timedelta64(0, "ns")).all():
        position = int(np.argmax(steps <= np.timedelta64(0, "ns")))
        what = "repeats" if steps[position] == np.timedelta64(0, "ns") else "goes back"
        raise DataError(
            f"{where}: the time axis {what} at position {position + 1}: {hour_text(times[position + 1])} "
            f"follows {hour_text(times[position])}; times must strictly increase"
        )


def _levels_text(variable: SourceVariable, levels_hpa: list[int | None]) -> str:
    """`` at 500, 850 hPa`` for the levels of a read, empty for a variable without levels."""
    if variable.levels is None:
        return ""
    return f" at {', '.join(str(level) for level in levels_hpa)} hPa"


def _as_slice(indices: np.ndarray) -> slice | np.ndarray:
    """Evenly spaced increasing indices as a slice (a strided read), else the index array itself."""
    if len(indices) == 1:
        return slice(int(indices[0]), int(indices[0]) + 1)
    steps = np.diff(indices)
    if (steps == steps[0]).all() and steps[0] > 0:
        return slice(int(indices[0]), int(indices[-1]) + 1, int(steps[0]))
    return indices
