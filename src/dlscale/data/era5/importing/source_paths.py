"""What a source path names, for :func:`dlscale.data.era5.importing.source.open_source`: a zarr store (local, its
metadata checked by :mod:`dlscale.data.era5.store_metadata`; or gs:// / s3://), netCDF files (one, a directory of
them, a glob), and why a path is none of them, in one line: a ``.zarr`` that is a file (empty, or of another
format), a link loop or a dangling link, a file that is not netCDF (empty, text). The opening of a store or file
with xarray, whose failures become one DataError line each too.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

from dlscale.data.era5.damaged_reads import is_read_failure
from dlscale.data.era5.store_metadata import MappedFiles, check_zarr_metadata
from dlscale.errors import DataError, exception_line
from dlscale.runtime.file_status import NOT_FOUND, why_not_a_file

NETCDF_SUFFIXES = (".nc", ".nc4", ".netcdf", ".cdf")
NETCDF_SIGNATURES = (b"\x89HDF\r\n\x1a\n", b"CDF\x01", b"CDF\x02", b"CDF\x05")  # netCDF-4 (HDF5), netCDF-3


def open_zarr(xarray: Any, where: str) -> Any:
    """The zarr store ``where`` as a lazily read xarray Dataset (no dask), or one DataError line."""
    try:
        return xarray.open_dataset(where, engine="zarr", chunks=None)
    except Exception as exc:
        if not is_read_failure(exc):
            raise
        raise DataError(
            f"{where}: cannot be opened as a zarr store with xarray: {exception_line(exc)}"
        ) from exc


def check_remote_metadata(url: str) -> None:
    """:mod:`dlscale.data.era5.store_metadata`'s check of a gs:// or s3:// store, through fsspec."""
    import fsspec

    try:
        mapper = fsspec.get_mapper(url)
        check_zarr_metadata(MappedFiles(url, mapper))
    except Exception as exc:
        if not is_read_failure(exc):
            raise
        raise DataError(f"{url}: cannot read its zarr metadata: {exception_line(exc)}") from exc


def refuse_unreachable(source: str, path: Path) -> None:
    """A path named ``.zarr`` that is no directory, a dangling link or a link loop: one line saying which."""
    if any(character in source for character in "*?["):
        return
    if path.suffix == ".zarr" and not path.is_dir():
        why = why_not_a_file(path)
        if why == NOT_FOUND:
            raise DataError(f"{source}: no such zarr store, netCDF file or directory")
        if why is None:
            what = "an empty file" if path.stat().st_size == 0 else "a file"
            why = f"is {what}, not a zarr store (a directory); a netCDF file is named .nc"
        raise DataError(f"{source}: {why}")
    if os.path.islink(path) and not path.exists():
        raise DataError(f"{source}: {why_not_a_file(path)}")


def not_netcdf_text(file: Path, exc: BaseException) -> str:
    """Why ``file`` cannot be opened as netCDF, in one line."""
    head = b""
    try:
        with file.open("rb") as handle:
            head = handle.read(8)
    except OSError:
        pass
    if file.is_file() and not head:
        return f"{file}: is an empty file, not netCDF; download it again"
    if head and not head.startswith(NETCDF_SIGNATURES):
        return f"{file}: is not a netCDF file (it starts with neither the HDF5 nor the netCDF-3 signature)"
    return f"{file}: cannot be opened as netCDF with xarray: {exception_line(exc)}"


def is_zarr_store(path: Path) -> bool:
    """Whether ``path`` is a zarr store's directory (a ``.zarr`` one, or one with zarr's metadata files)."""
    markers = (".zgroup", ".zmetadata", "zarr.json")
    return path.is_dir() and (path.suffix == ".zarr" or any((path / marker).exists() for marker in markers))


def netcdf_files(source: str, path: Path) -> list[Path]:
    """The netCDF files ``source`` names: a glob, a directory of them or one file; a DataError for none."""
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
