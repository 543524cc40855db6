"""The ``era5`` extra's modules (xarray, h5netcdf, zarr) are optional: importing one that is missing is one line
saying how to install them, from anywhere that needs one (and imports nothing else: no torch)."""

from __future__ import annotations

import importlib
from typing import Any

from dlscale.errors import ConfigError


def require_era5_module(module: str, what: str) -> Any:
    """The module ``module`` of the ``era5`` extra, or a ConfigError: ``what`` needs it, and how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"{what} needs {module}, which is not installed: pip install 'dlscale[era5]' (xarray, h5netcdf, zarr)"
        ) from None
