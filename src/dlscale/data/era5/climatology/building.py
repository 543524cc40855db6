"""``dlscale data climatology`` (and the end of ``dlscale data import-era5``): find the year files, check the
years, compute the climatology into a temporary store beside ``stats/climatology.zarr`` and rename it into
place, so a reader sees the previous store or the complete new one, never half of one.

The store is written under its lock (:mod:`dlscale.runtime.output_directory`: another process writing it is
refused, what killed writers left is removed first), a failed write waits for zarr's writer threads before its
temporary store is removed (:mod:`dlscale.data.era5.zarr_writes`), and a full or read-only disk is one line
naming the command's option. The days of the year the store has no data for are said on the console
(:mod:`dlscale.data.era5.climatology.coverage`)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from dlscale.data.era5.climatology.computing import (
    DEFAULT_MEMORY_BYTES,
    band_rows,
    climatology_hours,
    compute_climatology,
)
from dlscale.data.era5.climatology.coverage import lacking_days_line
from dlscale.data.era5.climatology.sources import ClimatologySources, find_sources
from dlscale.data.era5.climatology.store_layout import (
    ClimatologyWriter,
    climatology_path,
    require_zarr,
    stored_generator,
    stored_years,
)
from dlscale.data.era5.climatology.window import DEFAULT_WINDOW_DAYS, window_weights
from dlscale.data.era5.climatology.years import check_years_held, years_text
from dlscale.data.era5.zarr_writes import zarr_writes_finished_on_failure
from dlscale.errors import ConfigError, DataError
from dlscale.runtime.output_directory import write_results_directory
from dlscale.version import __version__

log = logging.getLogger("dlscale.data")

GENERATOR = "dlscale data climatology"
METHOD = (
    "WeatherBench2's hourly climatology (weatherbench2.utils.compute_hourly_stat): per hour of day, the states "
    "grouped by plain day of year (1..366), years stacked, a year's missing day 366 filled from its day 365, a "
    "centred window of triangular weights around the year (wrap-around), the weighted mean over (window, year) "
    "skipping missing values"
)


@dataclass(frozen=True)
class ClimatologyRequest:
    """What ``dlscale data climatology --help`` lists: the data root, its splits, the years and the window."""

    root: Path
    splits: tuple[str, ...] = ("train",)
    years: tuple[int, int] | None = None  # None: from the first to the last year the splits hold
    window_days: int = DEFAULT_WINDOW_DAYS
    memory_bytes: int = DEFAULT_MEMORY_BYTES
    years_flag: str = "--years"  # how the user named the years, for the messages
    root_flag: str = "--root"  # the option that chose the data root, for the advice of a failed write


@dataclass
class ClimatologyResult:
    """Where the store went and what it holds."""

    path: Path
    years: tuple[int, int]
    window_days: int
    hours: list[int]
    channels: tuple[str, ...]
    days_without_data: list[int] = field(default_factory=list)
    seconds: float = 0.0

    def describe(self) -> dict:
        """For manifest.json."""
        return {
            "path": str(self.path),
            "years": list(self.years),
            "window_days": self.window_days,
            "hours": self.hours,
            "days_without_data": len(self.days_without_data),
        }


def build_climatology(
    request: ClimatologyRequest, report: Callable[[str], None] = print
) -> ClimatologyResult:
    """Compute and publish the climatology; every check comes before the first write."""
    require_zarr("dlscale data climatology")
    try:
        window_weights(request.window_days)
    except ValueError as exc:
        raise ConfigError(f"--window {request.window_days}: {exc}") from None
    started = time.perf_counter()
    sources = find_sources(request.root, request.splits)
    years = _chosen_years(request, sources)
    hours = climatology_hours(sources, years)
    grid = sources.grid
    height, width = len(grid.latitudes), len(grid.longitudes)
    max_steps = max(len(file.times) for file in sources.files)
    rows = band_rows(len(hours), width, height, max_steps, request.memory_bytes)
    path = climatology_path(request.root)
    _check_replaceable(path, years)
    result = ClimatologyResult(path, years, request.window_days, hours, sources.channel_names)
    report(
        f"climatology: {len(sources.channel_names)} channels of {request.root} ({', '.join(request.splits)}), "
        f"years {years_text(years)}, hours {', '.join(str(h) for h in hours)}, {request.window_days}-day window, "
        f"{height} x {width} grid in bands of {rows} rows -> {path}"
    )

    def fill(tmp: Path) -> None:
        with zarr_writes_finished_on_failure():
            compute_into(tmp)

    def compute_into(tmp: Path) -> None:
        attributes = {
            "title": "climatology by day of year and hour of day",
            "method": METHOD,
            "years": list(years),
            "window_days": request.window_days,
            "hours": hours,
            "source": str(request.root),
            "splits": list(request.splits),
            "generator": GENERATOR,
            "dlscale_version": __version__,
        }
        writer = ClimatologyWriter(
            tmp, sources.channel_names, hours, grid.latitudes, grid.longitudes, rows, attributes
        )
        result.days_without_data = compute_climatology(
            sources, years, request.window_days, writer, hours, rows, report
        )
        writer.finish({"days_without_data": result.days_without_data})

    write_results_directory(path, fill, "the climatology", request.root_flag)
    result.seconds = time.perf_counter() - started
    warn_of_lacking_days(path, result.days_without_data, years)
    return result


def warn_of_lacking_days(path: Path, days: list[int], years: tuple[int, int]) -> None:
    """A warning naming the days of the year the store at ``path`` has no data for (none when it has all)."""
    line = lacking_days_line(path, days, years)
    if line is not None:
        log.warning("%s", line)


def _check_replaceable(path: Path, years: tuple[int, int]) -> None:
    """Refuse to replace anything at ``path`` but a store this command wrote (a store of WeatherBench2's copied
    there, a user's files); say so when it replaces one of ours."""
    if not os.path.lexists(path):
        return
    if path.is_symlink() or not path.is_dir() or stored_generator(path) != GENERATOR:
        what = "a store" if path.is_dir() else "a file"
        raise DataError(
            f"{path}: holds {what} that {GENERATOR} did not write; refusing to replace it: move it away (dlscale "
            "forecast reads a climatology store anywhere with --climatology PATH), then run this again"
        )
    held = stored_years(path)
    log.info(
        "climatology: replaces %s (years %s, written %s) with the climatology of %s",
        path,
        years_text(held) if held is not None else "not recorded",
        datetime.fromtimestamp(path.stat().st_mtime).strftime("%Y-%m-%d %H:%M"),
        years_text(years),
    )


def _chosen_years(request: ClimatologyRequest, sources: ClimatologySources) -> tuple[int, int]:
    held = sources.years()
    where = f"{request.root} ({', '.join(request.splits)})"
    if request.years is None:
        if not held:
            raise DataError(f"{where}: no dated state to compute a climatology from")
        years = (min(held), max(held))
    else:
        years = request.years
    check_years_held(years, held, request.years_flag, where)
    return years
