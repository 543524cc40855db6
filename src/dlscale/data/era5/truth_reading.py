"""The truth a forecast file is scored against, for ``dlscale score``: an ERA5 store that ``dlscale data
import-era5`` reads (a WeatherBench2 or ARCO-ERA5 zarr store, CDS netCDF files; :mod:`.importing.source`) or a
dlscale data root (the year files ``dlscale data synth-era5`` and ``import-era5`` write;
:mod:`.data_root_truth`), read on the forecast's grid at its valid times. Both offer the same methods (their
variables and levels, grid, times, reads of a variable's levels at some times; :func:`open_truth_source` opens
either), so everything below reads them alike.

The channels are found as import-era5 finds them (:func:`.importing.names.resolve_channels`: long names first,
then the short ones); one the store lacks is left out (:attr:`TruthStore.lacking` says why). The forecast's
grid is found among the store's latitudes and longitudes by coordinates (:mod:`.grid_matching`), whatever order
each keeps them in: a forecast on a grid the store lacks is one line, not an interpolation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlscale.data.era5.data_root_truth import DataRootSource, is_data_root
from dlscale.data.era5.file_dates import minute_text
from dlscale.data.era5.grid_matching import TOLERANCE_DEGREES, coordinate_positions, on_grid
from dlscale.data.era5.importing.names import ChannelSource, resolve_channels
from dlscale.data.era5.importing.source import ERA5Source, open_source
from dlscale.errors import DataError

SCAN_BYTES = 64 << 20  # the most one read of unusable_times holds: one variable, its levels, some times

TruthSource = ERA5Source | DataRootSource


def open_truth_source(where: str) -> TruthSource:
    """A dlscale data root (or one of its split directories) as :class:`DataRootSource`, anything else as the
    ERA5 store ``import-era5`` would read (:func:`~dlscale.data.era5.importing.source.open_source`)."""
    if "://" not in where and is_data_root(Path(where).expanduser()):
        return DataRootSource(Path(where).expanduser())
    return open_source(where)


@dataclass
class TruthStore:
    """An opened store, the channels it holds of those asked for, and where the scoring grid lies in it."""

    source: TruthSource
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
        ``longitudes``; DataError when it holds none of them or lacks a point of the grid. A data root whose
        files' grid the forecast's is the top-left crop of is read on that crop (:meth:`DataRootSource.crop_to`)."""
        source = open_truth_source(where)
        try:
            if isinstance(source, DataRootSource):
                source.crop_to(latitudes, longitudes)
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

    def holdings(self) -> str:
        """The times the truth holds, for a message: how many and their span (a data root's split by split)."""
        if isinstance(self.source, DataRootSource):
            return self.source.holdings()
        if not len(self.times):
            return "no time"
        return f"{len(self.times)} times, {minute_text(self.times[0])} .. {minute_text(self.times[-1])}"

    def read(self, times: np.ndarray) -> np.ndarray:
        """float32 (N, C, H, W): the store's channels at ``times`` (each one of :attr:`times`) on the scoring
        grid; the levels of a variable are read together. A chunk that cannot be read (truncated, garbage, a
        link loop, a directory in its place) is a DataError naming the store, the variable and the time."""
        height, width = len(self.source.latitude), len(self.source.longitude)
        full = np.empty((len(times), len(self.channels), height, width), np.float32)
        for variable, indices in self._channels_by_variable().items():
            levels = [self.channels[c].level_hpa for c in indices]
            self.source.read_levels(variable, levels, times, [full[:, c] for c in indices])
        return np.ascontiguousarray(on_grid(full, self.rows, self.columns))  # in the scoring grid's order

    def unusable_times(self, valid_times: np.ndarray) -> dict[np.datetime64, str]:
        """The times among ``valid_times`` (datetime64, repeats allowed) whose truth cannot be scored, each with
        why: a channel with NaN or inf at a point of the scoring grid (a chunk missing from a zarr store reads as
        NaN, its fill value, and the reason names that chunk), or a time the store lacks. Keys are
        datetime64[ns]; a usable store gives ``{}``.

        The scorer calls this once, before scoring, with every valid time it will read (initial times plus
        every lead): an initial time whose valid time is unusable at some lead is then left out of every lead,
        so every score averages over the same initial times, as the document says. Found while scoring, it
        would leave a lead's RMSE null or its ACC averaged over fewer times than the others.

        Cost: one read of each distinct valid time, a variable (all its levels) at a time, as many times per
        read as fit in :data:`SCAN_BYTES` (one state of one variable on a 0.25 degree grid; many on a coarse
        one, where a read's own overhead would dominate); scoring reads each valid time once per initial time
        and lead, so the scan reads a small share of what scoring reads (the distinct valid times of N initial
        times and L leads are about N + L, scoring reads N x L). A chunk that cannot be read at all is a
        DataError, as in :meth:`read`."""
        wanted = np.unique(np.asarray(valid_times).astype("datetime64[ns]"))
        held = np.isin(wanted, self.times)
        unusable = {time: f"{self.source.description} has no state at this time" for time in wanted[~held]}
        height, width = len(self.source.latitude), len(self.source.longitude)
        reasons: dict[np.datetime64, list[str]] = {}
        for variable, indices in self._channels_by_variable().items():
            levels = [self.channels[c].level_hpa for c in indices]
            per_read = max(1, SCAN_BYTES // (len(levels) * height * width * 4))
            times = wanted[held]
            for at in range(0, len(times), per_read):
                batch = times[at : at + per_read]
                outs = [np.empty((len(batch), height, width), np.float32) for _ in indices]
                self.source.read_levels(variable, levels, batch, outs)
                for c, out in zip(indices, outs, strict=True):
                    values = out[:, self.rows][:, :, self.columns]
                    for row in np.flatnonzero(~np.isfinite(values).all(axis=(1, 2))):
                        reason = self._nonfinite_reason(c, batch[row], values[row])
                        reasons.setdefault(batch[row], []).append(reason)
        unusable.update((time, "; ".join(found)) for time, found in sorted(reasons.items()))
        return unusable

    def _nonfinite_reason(self, c: int, time: np.datetime64, values: np.ndarray) -> str:
        channel = self.channels[c]
        level = f" at {channel.level_hpa} hPa" if channel.level_hpa is not None else ""
        where = f"channel {channel.name} (variable {channel.variable!r}{level})"
        missing = self.source.missing_chunks(channel.variable, time, [channel.level_hpa])
        if missing:
            return f"{where}: its chunk {missing[0]} is missing from the store (zarr reads it as NaN)"
        counts = {"NaN": int(np.isnan(values).sum()), "inf": int(np.isinf(values).sum())}
        found = " and ".join(f"{kind} at {count}" for kind, count in counts.items() if count)
        return f"{where} has {found} of {values.size} grid points"

    def _channels_by_variable(self) -> dict[str, list[int]]:
        """variable -> the positions of its channels, so that the levels of a variable are read together."""
        by_variable: dict[str, list[int]] = {}
        for c, channel in enumerate(self.channels):
            by_variable.setdefault(channel.variable, []).append(c)
        return by_variable

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
