"""The year files a climatology is computed from: dlscale's HDF5 layout (:mod:`dlscale.data.era5.layout`), one
or more split directories of a data root, each file's dates, and the years they hold.

A file's dates are those :class:`~dlscale.data.era5.trajectories.ERA5Trajectories` gives it
(:mod:`dlscale.data.era5.file_dates`) (its ``time``
dataset, else 6-hourly steps from 1 January of the year it is named after), so an import's files and
``synth-era5``'s alike have them; a file with neither has no day of year, and is refused. Every file must share
one grid and one list of channels, across splits too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlscale.data.era5.climatology.calendar import minutes_of_day, year_of
from dlscale.data.era5.config import ERA5DataConfig
from dlscale.data.era5.coordinates import GridCoordinates, check_same_grid
from dlscale.data.era5.file_dates import file_dates, hours_per_step
from dlscale.data.era5.layout import scan_split
from dlscale.errors import DataError

SPLIT_KEYS = {"train": "train_data_path", "valid": "valid_data_path", "test": "inf_data_path"}


@dataclass(frozen=True)
class DatedFile:
    """One year file and the date of each of its time indices (datetime64[m])."""

    path: Path
    times: np.ndarray


@dataclass(frozen=True)
class ClimatologySources:
    """The dated year files of the chosen splits, their channels and their grid."""

    files: list[DatedFile]
    channel_names: tuple[str, ...]
    grid: GridCoordinates
    splits: tuple[str, ...]

    def years(self) -> set[int]:
        """The calendar years with at least one state."""
        return {int(year) for file in self.files for year in np.unique(year_of(file.times))}


def find_sources(root: Path, splits: tuple[str, ...]) -> ClimatologySources:
    """Scan ``root/<split>/*.h5`` of each of ``splits`` (``train``, ``valid``, ``test``), checking them as
    training does, and date every file."""
    unknown = [split for split in splits if split not in SPLIT_KEYS]
    if unknown or not splits:
        raise DataError(
            f"--split {','.join(splits)}: expected one or more of {', '.join(SPLIT_KEYS)}, comma-separated"
        )
    files: list[DatedFile] = []
    channel_names: tuple[str, ...] = ()
    grid: GridCoordinates | None = None
    first_path: Path | None = None
    for split in splits:
        base = ERA5DataConfig(root=str(root), img_size=(1, 1), n_in_channels=1, n_out_channels=1)
        layout = scan_split(base, SPLIT_KEYS[split])
        # Scanned again with every channel the files hold, to learn all their names.
        layout = scan_split(dataclasses.replace(base, n_in_channels=layout.n_channels), SPLIT_KEYS[split])
        if grid is None or first_path is None:
            channel_names, grid, first_path = layout.channel_names, layout.grid, layout.files[0]
        else:
            check_same_grid(grid, first_path, layout.grid, layout.files[0])
            if layout.channel_names != channel_names:
                raise DataError(
                    f"{layout.files[0]}: holds channels {', '.join(layout.channel_names)}, but {first_path} "
                    f"holds {', '.join(channel_names)}; a climatology needs one list of channels in every file"
                )
        for path, steps in zip(layout.files, layout.steps_per_file, strict=True):
            files.append(DatedFile(path, _dates(path, steps)))
    assert grid is not None
    _check_distinct_times(files)
    return ClimatologySources(files, channel_names, grid, tuple(splits))


def _dates(path: Path, steps: int) -> np.ndarray:
    # The dates the forecast's trajectories give the same file, so the two never disagree.
    dates = file_dates(path, steps, hours_per_step(path))
    if dates is None:
        raise DataError(
            f"{path}: has no dates (no 'time' dataset, and its name is not a year such as 2018.h5); a "
            "climatology by day of year and hour of day needs the date of every state"
        )
    off_the_hour = minutes_of_day(dates) % 60 != 0
    if off_the_hour.any():
        raise DataError(
            f"{path}: its state at {dates[np.argmax(off_the_hour)]} is not on a whole hour; a climatology by "
            "hour of day needs states at whole hours"
        )
    return dates


def _check_distinct_times(files: list[DatedFile]) -> None:
    """The same date in two places would count twice in its day's mean."""
    seen: dict[np.datetime64, Path] = {}
    for file in files:
        unique, counts = np.unique(file.times, return_counts=True)
        if (counts > 1).any():
            raise DataError(f"{file.path}: holds the date {unique[np.argmax(counts > 1)]} more than once")
        for time in unique:
            if time in seen:
                raise DataError(f"{file.path} and {seen[time]} both hold the date {time}; each date once")
            seen[time] = file.path
