"""`dlscale data import-era5`: ERA5 from a zarr store or netCDF files into the tutorial's HDF5 layout.

    OUT/train|valid|test/<year>.h5   dataset `fields` (time, channel, lat, lon) float32, latitude north to south
    OUT/stats/global_means.npy, global_stds.npy (1, C, 1, 1), time_means.npy (1, C, H, W): train years only
    OUT/stats/climatology.zarr       WeatherBench2's climatology by day of year and hour of day over the
                                     --climatology-years (default: the train years), from the written files
                                     (:mod:`dlscale.data.era5.climatology`)
    OUT/manifest.json                source, selection, grid, climatology, versions (written last)

The source is streamed in blocks of whole time steps (``block_mb`` of float32 each), so memory stays a few
blocks whatever the size of a year (121 GB at 0.25 degree and 20 channels). The channels of a block are read
by ``readers`` threads (zarr decompresses outside the GIL), and the next block is read while the current one
is written. Each block is checked for NaN/inf (the reader would pass them to the loss), added to the
statistics when its year is a training year, and written into a contiguous, uncompressed ``fields``: the
layout the reader maps into memory instead of calling HDF5 per sample (benchmarks/era5_import_throughput.py
measures both read paths on an imported file).

Latitude runs north to south, as in the tutorial's files (and as dlscale's latitude weights assume): a south
to north source (some WeatherBench2 stores) is flipped. Every row is kept: 721 rows at 0.25 degree (both
poles), where the tutorial's 0.5 degree files have 361; the config's ``img_size`` crops from the top-left,
so ``img_size: [720, 1440]`` drops the south pole's row and is divisible by the ViT's patch size 8.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import resource
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dlscale.data.era5.climatology.years import check_years_held
from dlscale.data.era5.importing.names import ChannelSource, resolve_channels
from dlscale.data.era5.importing.output import (
    GENERATOR,
    MANIFEST_FILE,
    PLAN_FILE,
    claim_output,
    finished_year_matches,
    release_new_output,
)
from dlscale.data.era5.importing.plan import (
    DEFAULT_SPLIT,
    SPLITS,
    YearFile,
    check_dt,
    hour_text,
    parse_split,
    year_files,
)
from dlscale.data.era5.importing.progress import ByteProgress
from dlscale.data.era5.importing.source import ERA5Source, open_source
from dlscale.data.era5.importing.statistics import StreamingChannelStats
from dlscale.data.era5.importing.year_writer import BlockReader, add_finished_file, write_year
from dlscale.data.era5.layout import ERA5_CHANNELS
from dlscale.errors import DataError
from dlscale.runtime.atomic_files import (
    write_atomically,
    write_bytes_atomically,
    write_text_atomically,
)
from dlscale.runtime.output_directory import OutputDirectoryLock
from dlscale.runtime.storage import as_storage_error, remove_stale_temporaries, require_free_space
from dlscale.runtime.strict_json import to_json
from dlscale.version import __version__

STATS_FILES = ("global_means.npy", "global_stds.npy", "time_means.npy")
OUT_OPTION = "--out"  # the option that chooses where an import writes, for the advice of a failed write
YEAR_FILE_OVERHEAD = (
    64 << 10
)  # HDF5's own bytes in a year file beyond its fields and coordinates (6 kB measured)
# Held in OUT while an import writes there: a second import of the same OUT is refused instead of removing the
# first one's unfinished files as a killed import's (the lock is in OUT, whose parent an import need not write).
IMPORT_LOCK = ".dlscale-import.lock"


@dataclass(frozen=True)
class ImportRequest:
    """What to import (``dlscale data import-era5 --help`` lists the matching options)."""

    source: str
    out: Path
    channels: tuple[str, ...] = ERA5_CHANNELS
    dt_hours: int = 6
    split: str = DEFAULT_SPLIT
    allow_nan: bool = False
    block_mb: float = 256.0
    readers: int = 4
    progress: str = "auto"
    climatology_years: tuple[int, int] | None = None  # None: from the first to the last train year
    climatology_memory_bytes: int = 2 * 2**30  # one latitude band's sums (dlscale.data.era5.climatology)


@dataclass
class ImportResult:
    """What an import did, for the closing lines and the next step."""

    out: Path
    height: int
    width: int
    channels: list[str]
    written: list[str] = field(default_factory=list)  # split/year.h5 written by this run
    skipped: list[str] = field(default_factory=list)  # finished by an earlier run
    bytes_written: int = 0
    seconds: float = 0.0
    peak_rss_bytes: int = 0
    already_complete: bool = False
    climatology: dict | None = None  # what ClimatologyResult.describe() says, when one was computed

    @property
    def gb_per_s(self) -> float:
        return self.bytes_written / 1e9 / self.seconds if self.seconds > 0 else 0.0


def import_era5(request: ImportRequest, report: Callable[[str], None] = print) -> ImportResult:
    """Import ``request.source`` into ``request.out``; every check that needs no data values comes before the
    first write, so bad input leaves nothing behind. A write that fails (a full or read-only disk) is one
    StorageError line naming the file and ``--out``; another import writing ``request.out`` now is refused
    (RunDirectoryLocked) before anything is touched."""
    check_dt(request.dt_hours)
    split_of_year = parse_split(request.split)
    _check_out_outside_source(request.source, request.out)
    started = time.perf_counter()
    source = open_source(request.source)
    try:
        for note in source.notes:
            report(f"import-era5: {note}")
        bindings = resolve_channels(request.channels, source.levels_of_variables(), source.description)
        files = _plan_files(source, bindings, request, split_of_year)
        climatology_years = _climatology_years(request, files, source.description)
        latitude = source.latitude if source.north_to_south else source.latitude[::-1]
        result = ImportResult(request.out, len(latitude), len(source.longitude), list(request.channels))
        selection = _selection(bindings, request, files, latitude, source.longitude)
        with _storage_errors():
            status = claim_output(request.out, selection)
        with OutputDirectoryLock(request.out, OUT_OPTION, lock_file=request.out / IMPORT_LOCK) as lock:
            if status == "complete":
                result.already_complete = True
                with _storage_errors():
                    result.climatology = ensure_climatology(request, files, climatology_years, report)
                    if result.climatology is not None:
                        _write_manifest(request, source, selection, files, result.climatology)
                return result
            try:
                _import_files(source, bindings, request, files, latitude, result, status, report)
            except BaseException as exc:
                lock.release()  # before release_new_output removes a new OUT, the lock file in it included
                release_new_output(request.out, status)
                storage = as_storage_error(exc, option=OUT_OPTION) if isinstance(exc, OSError) else None
                if storage is not None:
                    raise storage from exc
                if isinstance(exc, DataError) and result.written + result.skipped:
                    kept = len(result.written) + len(result.skipped)
                    raise DataError(
                        f"{exc} ({kept} finished year files in {request.out} are kept; a rerun continues)"
                    ) from exc
                raise
            with _storage_errors():
                result.climatology = ensure_climatology(request, files, climatology_years, report)
                _write_manifest(request, source, selection, files, result.climatology)
    finally:
        source.close()
    result.seconds = time.perf_counter() - started
    result.peak_rss_bytes = peak_rss_bytes()
    return result


def _check_out_outside_source(source: str, out: Path) -> None:
    """Refuse an --out that is a local source store or lies inside it (the import would write into what it reads)."""
    if "://" in source:
        return
    store = Path(source).expanduser()
    if not store.is_dir():
        return  # netCDF files (or a glob of them): an --out beside them writes nothing into them
    store, target = store.resolve(), out.expanduser().resolve()
    if target == store or store in target.parents:
        raise DataError(
            f"import-era5: --out {out} is inside the source store {source}; the import would write into what it "
            "reads: choose an --out outside it"
        )


@contextlib.contextmanager
def _storage_errors() -> Iterator[None]:
    """A failed write inside the block (its OSError names the file) as one StorageError line naming --out."""
    try:
        yield
    except OSError as exc:
        storage = as_storage_error(exc, option=OUT_OPTION)
        if storage is None:
            raise
        raise storage from exc


def _plan_files(
    source: ERA5Source, bindings: list[ChannelSource], request: ImportRequest, split_of_year: dict[int, str]
) -> list[YearFile]:
    """The year files, from the first channel's time axis; every other variable must have those steps."""
    first = source.variables[bindings[0].variable]
    files = year_files(first.times, request.dt_hours, split_of_year, source.description)
    wanted = np.concatenate([file.times for file in files])
    for binding in bindings[1:]:
        times = source.variables[binding.variable].times
        missing = wanted[~np.isin(wanted, times)]
        if len(missing):
            raise DataError(
                f"{source.description}: variable {binding.variable!r} (channel {binding.name}) lacks "
                f"{len(missing)} of the selected time steps, the first {hour_text(missing[0])}"
                f" (variable {first.name!r} has them); every channel needs every step"
            )
    return files


def _selection(
    bindings: list[ChannelSource],
    request: ImportRequest,
    files: list[YearFile],
    latitude: np.ndarray,
    longitude: np.ndarray,
) -> dict:
    """What makes two imports the same data set (the source's path may move; its content is checked per year)."""
    return {
        "channels": [{"name": b.name, "variable": b.variable, "level_hpa": b.level_hpa} for b in bindings],
        "dt_hours": request.dt_hours,
        "years": {split: [f.year for f in files if f.split == split] for split in ("train", "valid", "test")},
        "grid": {
            "height": len(latitude),
            "width": len(longitude),
            "latitude": [float(latitude[0]), float(latitude[-1])],
            "longitude": [float(longitude[0]), float(longitude[-1])],
        },
    }


def _import_files(
    source: ERA5Source,
    bindings: list[ChannelSource],
    request: ImportRequest,
    files: list[YearFile],
    latitude: np.ndarray,
    result: ImportResult,
    status: str,
    report: Callable[[str], None],
) -> None:
    out, channels = request.out, list(request.channels)
    height, width = len(latitude), len(source.longitude)
    step_bytes = len(channels) * height * width * 4
    if status == "resume":
        # The unfinished year files of an interrupted import (killed, out of power), in the split directories.
        for stale, _ in remove_stale_temporaries([path for path in out.iterdir() if path.is_dir()]):
            report(f"import-era5: removed {stale}, the unfinished file of an interrupted import")
    finished = {
        (f.split, f.year): finished_year_matches(
            out / f.split / f"{f.year}.h5", f.times, latitude, source.longitude, channels
        )
        for f in files
    }
    to_write = [f for f in files if not finished[(f.split, f.year)]]
    if len(to_write) < len(files):
        report(
            f"import-era5: {len(files) - len(to_write)} finished year files kept, {len(to_write)} to import"
        )
    coordinates_bytes = 8 * (height + width)
    year_bytes = {
        id(f): len(f.times) * (step_bytes + 8) + coordinates_bytes + YEAR_FILE_OVERHEAD for f in files
    }
    if to_write:  # the whole import before any of it, so that a disk too small is said now, not hours in
        out.mkdir(parents=True, exist_ok=True)
        count = f"{len(to_write)} year file{'s' if len(to_write) > 1 else ''}"
        require_free_space(
            out, sum(year_bytes[id(f)] for f in to_write), f"the {count} to import", OUT_OPTION
        )
    stats = StreamingChannelStats(len(channels), height, width)
    progress = ByteProgress(sum(len(f.times) for f in to_write) * step_bytes, report, request.progress)
    steps_per_block = max(1, int(request.block_mb * 2**20) // step_bytes)
    max_steps = max((len(f.times) for f in to_write), default=1)
    try:
        with ThreadPoolExecutor(max_workers=max(1, request.readers)) as pool:
            reader = BlockReader(pool, source, bindings, min(steps_per_block, max_steps))
            for file in files:
                path = out / file.split / f"{file.year}.h5"
                name = f"{file.split}/{file.year}.h5"
                if finished[(file.split, file.year)]:
                    result.skipped.append(name)
                    if file.split == "train":
                        add_finished_file(stats, path, steps_per_block)
                    continue
                path.parent.mkdir(parents=True, exist_ok=True)
                require_free_space(
                    path.parent, year_bytes[id(file)], name, OUT_OPTION
                )  # others write there too
                blocks = reader.blocks(file.times)

                def fill(tmp: Path, file: YearFile = file, blocks: Iterator = blocks) -> None:
                    write_year(
                        tmp,
                        file,
                        blocks,
                        bindings,
                        (latitude, source.longitude),
                        stats,
                        progress,
                        dt_hours=request.dt_hours,
                        allow_nan=request.allow_nan,
                        source=source.description,
                    )

                write_atomically(path, fill)
                result.written.append(name)
                result.bytes_written += len(file.times) * step_bytes
    finally:
        progress.close()
    _write_stats(out / "stats", stats)


def _write_stats(directory: Path, stats: StreamingChannelStats) -> None:
    directory.mkdir(exist_ok=True)
    arrays = (stats.means(), stats.stds(), stats.time_means())
    for name, array in zip(STATS_FILES, arrays, strict=True):
        write_bytes_atomically(directory / name, lambda f, array=array: np.save(f, array, allow_pickle=False))


def _climatology_years(request: ImportRequest, files: list[YearFile], where: str) -> tuple[int, int]:
    """--climatology-years, checked against the years the import writes (before anything is written)."""
    imported = {file.year for file in files}
    if request.climatology_years is not None:
        years = request.climatology_years
    else:
        train = [file.year for file in files if file.split == "train"]
        years = (min(train), max(train))
    check_years_held(years, imported, "--climatology-years", f"the import of {where}")
    return years


def ensure_climatology(
    request: ImportRequest, files: list[YearFile], years: tuple[int, int], report: Callable[[str], None]
) -> dict | None:
    """Compute ``stats/climatology.zarr`` over ``years`` from the written files, unless a store of those years
    is there already; None (and a line saying how to compute it later) without zarr."""
    out = request.out
    from dlscale.data.era5.climatology.building import (
        ClimatologyRequest,
        build_climatology,
        warn_of_lacking_days,
    )
    from dlscale.data.era5.climatology.store_layout import (
        climatology_path,
        stored_days_without_data,
        stored_years,
    )

    try:
        import zarr  # noqa: F401
    except ImportError:
        report(
            "import-era5: no climatology by day of year (zarr is not installed: pip install 'dlscale[era5]', then "
            f"dlscale data climatology --root {out} --split train,valid,test --years {years[0]}-{years[1]})"
        )
        return None
    path = climatology_path(out)
    if stored_years(path) == years:
        report(f"import-era5: {path} already holds the climatology of {years[0]}-{years[1]}")
        warn_of_lacking_days(path, stored_days_without_data(path), years)
        return {"path": str(path), "years": list(years), "kept": True}
    splits = tuple(split for split in SPLITS if any(file.split == split for file in files))
    wanted = ClimatologyRequest(
        out,
        splits,
        years,
        memory_bytes=request.climatology_memory_bytes,
        years_flag="--climatology-years",
        root_flag=OUT_OPTION,
    )
    return build_climatology(wanted, report).describe()


def _write_manifest(
    request: ImportRequest,
    source: ERA5Source,
    selection: dict,
    files: list[YearFile],
    climatology: dict | None = None,
) -> None:
    manifest = {
        "generator": GENERATOR,
        "selection": selection,
        "source": {
            "path": source.description,
            "format": source.kind,
            "latitude_flipped": not source.north_to_south,
        },
        "steps": {f"{f.split}/{f.year}.h5": len(f.times) for f in files},
        "statistics": "global_means, global_stds and time_means over the train years",
        "climatology": climatology,
        "versions": versions(),
    }
    write_text_atomically(request.out / MANIFEST_FILE, to_json(manifest))
    (request.out / PLAN_FILE).unlink(missing_ok=True)


def versions() -> dict[str, str]:
    """The versions of dlscale and of the libraries that read the source and wrote the files."""
    found = {"dlscale": __version__, "python": sys.version.split()[0]}
    for package in ("xarray", "zarr", "h5netcdf", "h5py", "numpy"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def peak_rss_bytes() -> int:
    """This process's peak resident memory (its high-water mark since it started)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def default_readers() -> int:
    return max(1, min(8, os.cpu_count() or 1))
