"""Where on Earth the rows and columns of an ERA5 split lie: the files' own coordinates, else the tutorial's grid.

Files written by ``dlscale data import-era5`` hold 1-D datasets ``latitude`` (H_file,) and ``longitude``
(W_file,) in degrees; they are the truth, whatever the grid: ERA5's 721 x 1440 with pole rows, or
WeatherBench2's equiangular 32 x 64 whose rows lie at +-87.1875 with no pole row. The tutorial's files (and
``dlscale data synth-era5``'s) have no coordinates; for them the grid is taken to be the tutorial's: rows from
+90 to -90 inclusive, columns from 0 degrees east at 360 / W_file spacing. Each axis is taken from the files
when they hold it, independently, and every file of a split must agree.

Everything that needs a position uses these: the cos(latitude) weights of the validation RMSE and the forecast
scores, the coordinates of the forecast files, the axes of the figures. (The training loss is the tutorial's
relative L2, with no latitude weights.) On the tutorial's files the formula gives the latitudes dlscale always
used, so their scores do not change.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from dlscale.errors import DataError

LATITUDE_KEY, LONGITUDE_KEY = "latitude", "longitude"


@dataclass(frozen=True)
class GridCoordinates:
    """Degrees north of each row and east of each column of the files' grid, and where they came from."""

    latitudes: np.ndarray  # (H_file,) float64
    longitudes: np.ndarray  # (W_file,) float64
    latitudes_from_files: bool
    longitudes_from_files: bool

    def describe(self) -> str:
        """One line for the start of a run: the grid's extent and whether the files or the formula gave it."""
        lat, lon = self.latitudes, self.longitudes
        span = f"rows at {lat[0]:.4g} to {lat[-1]:.4g} N, columns at {lon[0]:.4g} to {lon[-1]:.4g} E"
        if self.latitudes_from_files and self.longitudes_from_files:
            return f"{span}, from the files' latitude/longitude datasets"
        formula = "the tutorial's grid (rows +90 to -90 inclusive, columns from 0 E)"
        if not (self.latitudes_from_files or self.longitudes_from_files):
            return f"{span}: the files hold no latitude/longitude, so {formula}"
        read, missing = ("latitude", "longitude") if self.latitudes_from_files else ("longitude", "latitude")
        return f"{span}: {read} from the files, {missing} (absent there) from {formula}"


def formula_latitudes(file_height: int) -> np.ndarray:
    """The tutorial's rows: ``file_height`` latitudes from +90 to -90 inclusive (pole rows included)."""
    rows = np.arange(file_height, dtype=np.float64)
    return 90.0 - 180.0 * rows / max(file_height - 1, 1)


def formula_longitudes(file_width: int) -> np.ndarray:
    """The tutorial's columns: ``file_width`` longitudes from 0 degrees east, 360 / ``file_width`` apart."""
    return 360.0 * np.arange(file_width, dtype=np.float64) / file_width


def read_coordinates(handle: h5py.File, path: Path, file_height: int, file_width: int) -> GridCoordinates:
    """The grid of one open year file: its ``latitude``/``longitude`` datasets where present (checked: 1-D, one
    value per row or column, finite, strictly monotonic, latitudes within +-90), else the formula."""
    latitudes = _axis(handle, path, LATITUDE_KEY, file_height, "rows")
    longitudes = _axis(handle, path, LONGITUDE_KEY, file_width, "columns")
    if latitudes is not None and np.abs(latitudes).max() > 90.0:
        raise DataError(
            f"{path}: dataset '{LATITUDE_KEY}' has a value of {np.abs(latitudes).max():g} degrees, "
            "expected latitudes within -90 to 90"
        )
    return GridCoordinates(
        latitudes if latitudes is not None else formula_latitudes(file_height),
        longitudes if longitudes is not None else formula_longitudes(file_width),
        latitudes_from_files=latitudes is not None,
        longitudes_from_files=longitudes is not None,
    )


def _axis(handle: h5py.File, path: Path, key: str, length: int, what: str) -> np.ndarray | None:
    if key not in handle:
        return None
    dataset = handle[key]
    where = f"{path}: dataset '{key}'"
    expected = f"expected one value in degrees per grid {what[:-1]} ({length} {what})"
    if not isinstance(dataset, h5py.Dataset) or dataset.ndim != 1 or dataset.shape[0] != length:
        shape = getattr(dataset, "shape", "a group")
        raise DataError(f"{where} has shape {shape}; {expected}")
    if not np.issubdtype(dataset.dtype, np.number) or np.iscomplexobj(dataset):
        raise DataError(f"{where} has dtype {dataset.dtype}; {expected}")
    values = np.asarray(dataset[...], dtype=np.float64)
    if not np.isfinite(values).all():
        raise DataError(f"{where} holds a non-finite value; {expected}")
    steps = np.diff(values)
    if length > 1 and not ((steps > 0).all() or (steps < 0).all()):
        raise DataError(f"{where} is not strictly increasing or decreasing; {expected}, in order")
    return values


def check_same_grid(first: GridCoordinates, first_path: Path, other: GridCoordinates, path: Path) -> None:
    """Refuse a split whose files place their rows or columns differently (the scores would mix grids)."""
    for axis in ("latitudes", "longitudes"):
        mine, theirs = getattr(other, axis), getattr(first, axis)
        from_files = (
            getattr(other, f"{axis}_from_files"),
            getattr(first, f"{axis}_from_files"),
        )
        if from_files[0] != from_files[1] or not np.array_equal(mine, theirs):
            how = {True: "its own", False: "no"}
            raise DataError(
                f"{path}: its {axis} ({how[from_files[0]]} '{axis[:-1]}' dataset, {mine[0]:g} to {mine[-1]:g}) "
                f"differ from those of {first_path.name} ({how[from_files[1]]} dataset, {theirs[0]:g} to "
                f"{theirs[-1]:g}) in the same split; every file of a split must share one grid"
            )
