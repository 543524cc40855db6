"""One year file of an import: the source's time steps read in blocks and written into ``fields``.

A block is whole time steps of every channel, (steps, C, H, W) float32. Its channels are read by a thread pool
(zarr decompresses outside the GIL; netCDF reads are serialized by HDF5's lock but still overlap the writes),
and the next block is read while the current one is checked, added to the statistics and written, so memory
holds about three blocks whatever the length of a year. ``fields`` is contiguous and unfiltered, the tutorial's
layout and the one dlscale's reader maps into memory (benchmarks/era5_import_throughput.py measures it
against a chunked one).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import h5py
import numpy as np

from dlscale.data.era5.coordinates import LATITUDE_KEY, LONGITUDE_KEY
from dlscale.data.era5.importing.names import ChannelSource
from dlscale.data.era5.importing.plan import YearFile, hour_text
from dlscale.data.era5.importing.progress import ByteProgress
from dlscale.data.era5.importing.source import ERA5Source
from dlscale.data.era5.importing.statistics import StreamingChannelStats
from dlscale.data.era5.layout import FIELDS_KEY, TIME_KEY
from dlscale.errors import DataError
from dlscale.runtime.atomic_files import fsync_file


class BlockReader:
    """Reads a year's steps block by block into two buffers that take turns: while the caller writes one block,
    the pool's threads read the next one straight into the other buffer (each channel into its slot, flipped
    north first where the source runs south to north). Reusing the buffers matters: a fresh block of hundreds
    of MB per step would be mapped and page-faulted anew each time."""

    def __init__(
        self,
        pool: ThreadPoolExecutor,
        source: ERA5Source,
        bindings: list[ChannelSource],
        steps_per_block: int,
    ):
        self.pool = pool
        self.source = source
        self.bindings = bindings
        self.steps_per_block = steps_per_block
        shape = (steps_per_block, len(bindings), len(source.latitude), len(source.longitude))
        self._buffers = [np.empty(shape, dtype=np.float32) for _ in range(2)]
        self._flip = not source.north_to_south

    def blocks(self, times: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        """(first step, block (steps, C, H, W) float32) of ``times``; a block is valid until the next one is
        asked for."""
        starts = list(range(0, len(times), self.steps_per_block))
        if not starts:
            return
        pending = self._submit(times, starts[0], self._buffers[0])
        try:
            for position, start in enumerate(starts):
                reads, block = pending
                if position + 1 < len(starts):
                    # the other buffer is free: its block was written before this one was asked for
                    pending = self._submit(times, starts[position + 1], self._buffers[(position + 1) % 2])
                for read in reads:
                    read.result()
                yield start, block
        finally:
            for read in pending[0]:
                read.cancel()
            for read in pending[0]:
                if not read.cancelled():
                    read.exception()  # wait: a thread must not write into a buffer after the year ended

    def _submit(self, times: np.ndarray, start: int, buffer: np.ndarray) -> tuple[list[Future], np.ndarray]:
        chunk = times[start : start + self.steps_per_block]
        block = buffer[: len(chunk)]
        channels_of: dict[str, list[int]] = {}  # variable -> its channels, read in one request
        for channel, binding in enumerate(self.bindings):
            channels_of.setdefault(binding.variable, []).append(channel)
        reads = []
        for variable, channels in channels_of.items():
            levels = [self.bindings[channel].level_hpa for channel in channels]
            slots = [block[:, c, ::-1] if self._flip else block[:, c] for c in channels]
            reads.append(self.pool.submit(self.source.read_levels, variable, levels, chunk, slots))
        return reads, block


def write_year(
    tmp: Path,
    file: YearFile,
    blocks: Iterator[tuple[int, np.ndarray]],
    bindings: list[ChannelSource],
    grid: tuple[np.ndarray, np.ndarray],
    stats: StreamingChannelStats,
    progress: ByteProgress,
    *,
    dt_hours: int,
    allow_nan: bool,
    source: str,
) -> None:
    """Write year ``file`` into the new HDF5 file ``tmp`` from ``blocks`` (``grid``: its latitudes, north
    first, and longitudes)."""
    latitude, longitude = grid
    channels = [binding.name for binding in bindings]
    name = f"{file.split}/{file.year}.h5"
    shape = (len(file.times), len(channels), len(latitude), len(longitude))
    with h5py.File(tmp, "w") as handle:
        # Contiguous and unfiltered: the layout dlscale's reader maps into memory (see mapped_fields.py).
        fields = handle.create_dataset(FIELDS_KEY, shape=shape, dtype="f4")
        fields.attrs["channels"] = channels
        fields.attrs["hours_per_step"] = dt_hours
        # The coordinates, so that a rerun can check a finished year against the source.
        handle.create_dataset(TIME_KEY, data=file.times.astype("datetime64[s]").astype(np.int64))
        handle[TIME_KEY].attrs["units"] = "seconds since 1970-01-01"
        handle.create_dataset(LATITUDE_KEY, data=latitude)
        handle.create_dataset(LONGITUDE_KEY, data=longitude)
        for start, block in blocks:
            if not allow_nan:
                _check_finite(block, file.times[start:], bindings, source)
            fields[start : start + len(block)] = block
            if file.split == "train":
                stats.update(block, finite=not allow_nan)
            progress.advance(block.nbytes, name)
    fsync_file(tmp)


def _check_finite(block: np.ndarray, times: np.ndarray, bindings: list[ChannelSource], where: str) -> None:
    bad = ~np.isfinite(block)
    if not bad.any():
        return
    step, channel = (int(i) for i in np.argwhere(bad.any(axis=(2, 3)))[0])
    rows, columns = np.nonzero(bad[step, channel])
    value = block[step, channel, rows[0], columns[0]]
    binding = bindings[channel]
    level = f" at {binding.level_hpa} hPa" if binding.level_hpa is not None else ""
    raise DataError(
        f"{where}: channel {binding.name} (variable {binding.variable!r}{level}) has "
        f"{'NaN' if np.isnan(value) else value} at {hour_text(times[step])} "
        f"({len(rows)} of its grid points at that time, the first at output row {rows[0]}, column "
        f"{columns[0]}); --allow-nan keeps them (the statistics skip them)"
    )


def add_finished_file(stats: StreamingChannelStats, path: Path, steps_per_block: int) -> None:
    """The statistics of a training year a previous run wrote, read back block by block."""
    with h5py.File(path, "r") as handle:
        fields = handle[FIELDS_KEY]
        for start in range(0, fields.shape[0], steps_per_block):
            stats.update(fields[start : start + steps_per_block])
