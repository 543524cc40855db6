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
different grids) happen when the source is opened, before anything is written.
"""

from __future__ import annotations

import glob
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dlscale.data.era5.importing.plan import hour_text
from dlscale.errors import ConfigError, DataError

TIME_NAMES = ("time", "valid_time")
LEVEL_NAMES = ("level", "pressure_level", "isobaricInhPa", "plev")
LATITUDE_NAMES = ("latitude", "lat")
LONGITUDE_NAMES = ("longitude", "lon")
NETCDF_SUFFIXES = (".nc", ".nc4", ".netcdf", ".cdf")
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

    def __init__(self, description: str, kind: str, datasets: list[tuple[str, Any]]):
        self.description = description
        self.kind = kind
        self._datasets = datasets
        self.variables: dict[str, SourceVariable] = {}
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
                levels = [_hpa(value) for value in np.asarray(dataset[dims["level"]].values)]
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
        for segment_index in np.unique(segments):
            rows = np.nonzero(segments == segment_index)[0]
            segment = variable.segments[segment_index]
            local = positions[rows] - variable.first_position[segment_index]
            selection: dict[str, Any] = {variable.dims["time"]: _as_slice(local)}
            if "level" in variable.dims:
                indices = [variable.levels.index(level) for level in levels_hpa]  # type: ignore[union-attr]
                # increasing, as every backend takes them (HDF5 selections must be); each out finds its own
                wanted = sorted(set(indices))
                selection[variable.dims["level"]] = _as_slice(np.array(wanted))
            part = segment.array.isel(selection)
            values = np.asarray(part.values).transpose([part.dims.index(variable.dims[r]) for r in roles])
            for position, out in enumerate(outs):
                out[rows] = values[:, wanted.index(indices[position])] if "level" in variable.dims else values

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
        return ERA5Source(source, "zarr", [(source, _open_zarr(xarray, source))])
    path = Path(source).expanduser()
    if is_zarr_store(path):
        return ERA5Source(str(path), "zarr", [(str(path), _open_zarr(xarray, str(path)))])
    files = _netcdf_files(source, path)
    datasets = []
    try:
        for file in files:
            try:
                datasets.append((str(file), xarray.open_dataset(file, chunks=None)))
            except Exception as exc:
                raise DataError(f"{file}: cannot be opened as netCDF with xarray: {exc}") from exc
        return ERA5Source(source, "netcdf", datasets)
    except BaseException:
        for _, dataset in datasets:
            dataset.close()
        raise


def _open_zarr(xarray: Any, where: str) -> Any:
    try:
        return xarray.open_dataset(where, engine="zarr", chunks=None)
    except Exception as exc:
        raise DataError(f"{where}: cannot be opened as a zarr store with xarray: {exc}") from exc


def is_zarr_store(path: Path) -> bool:
    """Whether ``path`` is a zarr store's directory (a ``.zarr`` one, or one with zarr's metadata files)."""
    markers = (".zgroup", ".zmetadata", "zarr.json")
    return path.is_dir() and (path.suffix == ".zarr" or any((path / marker).exists() for marker in markers))


def _netcdf_files(source: str, path: Path) -> list[Path]:
    if any(character in source for character in "*?["):
        files = sorted(Path(found) for found in glob.glob(str(Path(source).expanduser())))
    elif path.is_dir():
        files = sorted(file for file in path.iterdir() if file.suffix in NETCDF_SUFFIXES)
    elif path.is_file():
        files = [path]
    else:
        raise DataError(f"{source}: no such zarr store, netCDF file or directory")
    if not files:
        raise DataError(f"{source}: no zarr store and no netCDF file ({', '.join(NETCDF_SUFFIXES)}) there")
    return files


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


def _as_slice(indices: np.ndarray) -> slice | np.ndarray:
    """Evenly spaced increasing indices as a slice (a strided read), else the index array itself."""
    if len(indices) == 1:
        return slice(int(indices[0]), int(indices[0]) + 1)
    steps = np.diff(indices)
    if (steps == steps[0]).all() and steps[0] > 0:
        return slice(int(indices[0]), int(indices[-1]) + 1, int(steps[0]))
    return indices
