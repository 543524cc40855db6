"""Finding one grid's rows and columns in another's coordinates: a forecast's grid in a truth store or a
climatology store, whatever order either keeps its latitudes in, longitudes compared modulo 360.

A coordinate is found when the other grid has one within ``TOLERANCE_DEGREES`` (float32 coordinates of a fine
grid differ from float64 ones in their last digits); a grid with a point the other lacks is another grid, which
the callers refuse in one line rather than interpolate. :func:`same_points` says whether two grids' coordinates
are the same set (what ``dlscale score`` asks of a forecast and its truth: WeatherBench2 scores a forecast on its
truth's whole grid, never on a crop or a subsample of it), :func:`grid_text` describes a grid in a message.
"""

from __future__ import annotations

import numpy as np

TOLERANCE_DEGREES = 1e-3


def coordinate_positions(have: np.ndarray, wanted: np.ndarray, wrap: bool) -> tuple[np.ndarray, int | None]:
    """(the index in ``have`` of each of ``wanted``, the index in ``wanted`` of the first one ``have`` lacks or
    None); ``wrap``: longitudes, compared modulo 360."""
    have, wanted = np.asarray(have, np.float64), np.asarray(wanted, np.float64)
    difference = wanted[:, None] - have[None, :]
    if wrap:
        difference = (difference + 180.0) % 360.0 - 180.0
    nearest = np.abs(difference).argmin(axis=1)
    off = np.abs(difference[np.arange(len(wanted)), nearest]) > TOLERANCE_DEGREES
    return nearest, (int(np.argmax(off)) if off.any() else None)


def same_points(have: np.ndarray, wanted: np.ndarray, wrap: bool) -> bool:
    """Whether ``have`` and ``wanted`` hold the same coordinates, in any order (``wrap``: modulo 360)."""
    if len(have) != len(wanted):
        return False
    positions, missing = coordinate_positions(have, wanted, wrap)
    return missing is None and len(np.unique(positions)) == len(wanted)


def grid_text(latitudes: np.ndarray, longitudes: np.ndarray) -> str:
    """``32 latitudes x 64 longitudes (-87.2..87.2, 0..354.4)``: the grid's size and the ranges it spans."""
    latitudes, longitudes = np.asarray(latitudes, np.float64), np.asarray(longitudes, np.float64)

    def span(values: np.ndarray) -> str:
        return f"{values.min():g}..{values.max():g}" if len(values) else "none"

    return (
        f"{len(latitudes)} latitudes x {len(longitudes)} longitudes ({span(latitudes)}, {span(longitudes)})"
    )


def on_grid(values: np.ndarray, rows: np.ndarray, columns: np.ndarray) -> np.ndarray:
    """``values`` (..., H, W) at ``rows`` and ``columns`` (positions from :func:`coordinate_positions`); as they
    are, without a copy, where those are every row and column in order (a forecast on its truth's grid in the
    truth's order, the common case)."""
    height, width = values.shape[-2:]
    if not np.array_equal(rows, np.arange(height)):
        values = values[..., rows, :]
    if not np.array_equal(columns, np.arange(width)):
        values = values[..., columns]
    return values
