"""Reading values from a store or file that may be damaged: one line instead of a decoder's traceback.

A chunk that is truncated, overwritten, empty or a link to a file that is no chunk fails to decode deep inside
zarr or numcodecs (blosc: ``RuntimeError``; zlib: ``zlib.error``; zstd and lz4: ``RuntimeError`` or
``ValueError``), a link loop fails with ``OSError`` (ELOOP), a damaged netCDF file with HDF5's ``OSError`` or
``RuntimeError``, and the classes differ between zarr 2 and zarr 3 and between codecs. So a read that fails with
any exception but ``MemoryError`` and dlscale's own errors (:func:`is_read_failure`) becomes one DataError
naming the store, what was read and the failure's first line (:func:`dlscale.errors.exception_line`); the original is its
``__cause__``, which ``--debug`` prints.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from dlscale.errors import DataError, DlscaleError, exception_line

DAMAGED_ADVICE = (
    "the store is damaged (a chunk truncated or overwritten, or a link to a file that is no chunk of it)"
)
REPAIR = "repair it or download it again"


def is_read_failure(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a read of stored values, says the data cannot be read (rather than that the
    process is out of memory, interrupted, or already reported in dlscale's words)."""
    return isinstance(exc, Exception) and not isinstance(exc, (DlscaleError, MemoryError))


@contextmanager
def refusing_damage(where: str, what: str) -> Iterator[None]:
    """Turn a read failure (:func:`is_read_failure`) inside the block into ``DataError('{where}: {what} cannot be
    read (...)')``."""
    try:
        yield
    except Exception as exc:
        if not is_read_failure(exc):
            raise
        raise DataError(
            f"{where}: {what} cannot be read ({exception_line(exc)}): {DAMAGED_ADVICE}; {REPAIR}"
        ) from exc


def read_values(array: Any, where: str, what: str) -> np.ndarray:
    """The values of a lazily opened xarray DataArray (or anything with ``.values``) as an ndarray; a DataError
    naming ``where`` and ``what`` when they cannot be read."""
    with refusing_damage(where, what):
        return np.asarray(array.values)
