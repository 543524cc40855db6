"""Finding one grid's rows and columns in another's coordinates: a forecast's grid in a truth store or a
climatology store, whatever order either keeps its latitudes in, longitudes compared modulo 360.

A coordinate is found when the other grid has one within ``TOLERANCE_DEGREES`` (float32 coordinates of a fine
grid differ from float64 ones in their last digits); a grid with a point the other lacks is another grid, which
the callers refuse in one line rather than interpolate.
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
