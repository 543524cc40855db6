"""The truth a forecast file is scored against, for ``dlscale score``: an ERA5 store that ``dlscale data
import-era5`` reads (a WeatherBench2 or ARCO-ERA5 zarr store, CDS netCDF files; :mod:`.importing.source`), read
on the forecast's grid at its valid times.

The channels are found as import-era5 finds them (:func:`.importing.names.resolve_channels`: long names first,
then the short ones); one the store lacks is left out (:attr:`TruthStore.lacking` says why). The forecast's
grid is found among the store's latitudes and longitudes by coordinates (:mod:`.grid_matching`), whatever order
each keeps them in: a forecast on a grid the store lacks is one line, not an interpolation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dlscale.data.era5.grid_matching import TOLERANCE_DEGREES, coordinate_positions
from dlscale.data.era5.importing.names import ChannelSource, resolve_channels
from dlscale.data.era5.importing.source import ERA5Source, open_source
from dlscale.errors import DataError


@dataclass
class TruthStore:
    """An opened store, the channels it holds of those asked for, and where the scoring grid lies in it."""

    source: ERA5Source
    channels: list[ChannelSource]
    lacking: dict[str, str]  # channel -> why the store cannot give it
    rows: np.ndarray  # the store's row of each of the scoring grid's latitudes
    columns: np.ndarray
    times: np.ndarray  # datetime64[ns]: the times every channel's variable has

    @classmethod
    def open(
        cls, where: str, channel_names: Sequence[str], latitudes: np.ndarray, longitudes: np.ndarray
    ) -> TruthStore:
        """The store ``where`` with those of ``channel_names`` it holds, read on the grid ``latitudes`` x
        ``longitudes``; DataError when it holds none of them or lacks a point of the grid."""
        source = open_source(where)
        try:
            variables = source.levels_of_variables()
            channels: list[ChannelSource] = []
            lacking: dict[str, str] = {}
            for name in channel_names:
                try:
                    channels.extend(resolve_channels([name], variables, source.description))
                except DataError as exc:
                    lacking[name] = str(exc)
            if not channels:
                raise DataError(
                    f"{where}: holds none of the forecast's channels ({', '.join(channel_names)}); it has "
                    f"{', '.join(sorted(variables)) or 'no data variables'}"
                )
            rows = _positions(where, source.latitude, latitudes, "latitude", wrap=False)
            columns = _positions(where, source.longitude, longitudes, "longitude", wrap=True)
            used = {channel.variable for channel in channels}
            times = source.variables[channels[0].variable].times
            for variable in used:
                times = np.intersect1d(times, source.variables[variable].times)
        except BaseException:
            source.close()
            raise
        return cls(source, channels, lacking, rows, columns, times.astype("datetime64[ns]"))

    @property
    def channel_names(self) -> tuple[str, ...]:
        return tuple(channel.name for channel in self.channels)

    def read(self, times: np.ndarray) -> np.ndarray:
        """float32 (N, C, H, W): the store's channels at ``times`` (each one of :attr:`times`) on the scoring
        grid; the levels of a variable are read together."""
        height, width = len(self.source.latitude), len(self.source.longitude)
        full = np.empty((len(self.channels), len(times), height, width), np.float32)
        by_variable: dict[str, list[int]] = {}
        for c, channel in enumerate(self.channels):
            by_variable.setdefault(channel.variable, []).append(c)
        for variable, indices in by_variable.items():
            levels = [self.channels[c].level_hpa for c in indices]
            self.source.read_levels(variable, levels, times, [full[c] for c in indices])
        return np.ascontiguousarray(full[:, :, self.rows][:, :, :, self.columns].transpose(1, 0, 2, 3))

    def close(self) -> None:
        self.source.close()


def _positions(where: str, have: np.ndarray, wanted: np.ndarray, name: str, wrap: bool) -> np.ndarray:
    positions, missing = coordinate_positions(have, wanted, wrap)
    if missing is not None:
        raise DataError(
            f"{where}: has no {name} within {TOLERANCE_DEGREES:g} degrees of the forecast's {wanted[missing]:g} "
            f"(its {len(have)} {name}s run from {have[0]:g} to {have[-1]:g}): the forecast is on a grid the truth "
            "lacks; score it against a store on its grid"
        )
    return positions
