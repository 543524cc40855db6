"""`dlscale data synth-era5`: write a synthetic ERA5 data set in exactly the layout of the real tutorial data.

    OUT/train/<year>.h5, OUT/valid/<year>.h5, OUT/test/<year>.h5   dataset `fields`, float32 (T, 20, H, W)
    OUT/stats/global_means.npy, global_stds.npy                   (1, 20, 1, 1), over the training years
    OUT/stats/time_means.npy                                      (1, 20, H, W), over the training years
    OUT/manifest.json                                             how it was generated (written last)

The years form one continuous 6-hourly trajectory of :class:`~dlscale.data.era5.atmosphere.SyntheticAtmosphere`
(training years first, then validation, then test), so validation and test states were never seen in training.
Files are written in time chunks, so data sets far larger than memory (the benchmark's full-size set) are fine.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from dlscale.data.era5.atmosphere import Grid, SyntheticAtmosphere
from dlscale.data.era5.dataset import ERA5_CHANNELS
from dlscale.data.synth_output import preset_spec, read_manifest, write_data_set
from dlscale.errors import DataError

log = logging.getLogger(__name__)

# Time steps computed and written at once: bounds memory at any grid size, and gives each worker thread a block
# of its own. The same with any number of workers, so the statistics sum in the same order.
CHUNK_STEPS = 8


@dataclass(frozen=True)
class SynthERA5Spec:
    """What to generate. ``dlscale data synth-era5 --help`` lists the matching options."""

    height: int = 32
    width: int = 64
    train_years: int = 2
    valid_years: int = 1
    test_years: int = 1
    steps_per_year: int = 512  # 6-hourly steps per file (a real year has 1460)
    first_year: int = 1979
    seed: int = 0
    noise: float = 0.0  # i.i.d. noise, as a fraction of each channel's spread

    def __post_init__(self) -> None:
        for name in ("height", "width", "steps_per_year", "train_years", "valid_years"):
            if getattr(self, name) < (2 if name in ("height", "width", "steps_per_year") else 1):
                raise DataError(f"synth-era5: {name.replace('_', '-')} is too small ({getattr(self, name)})")
        if self.test_years < 0 or self.noise < 0:
            raise DataError("synth-era5: test-years and noise must be >= 0")

    def years(self) -> dict[str, list[int]]:
        """The year numbers (file names) of each split, consecutive in time."""
        counts = {"train": self.train_years, "valid": self.valid_years, "test": self.test_years}
        result, year = {}, self.first_year
        for split, count in counts.items():
            result[split] = list(range(year, year + count))
            year += count
        return result

    def size_bytes(self) -> int:
        years = self.train_years + self.valid_years + self.test_years
        return years * self.steps_per_year * len(ERA5_CHANNELS) * self.height * self.width * 4


# Named sizes: `demo` trains on a laptop CPU in about a minute; `tiny` is for tests; `full` has the real
# tutorial grid (361 x 720, cropped to 360 x 720 by the configs) and a year of 6-hourly steps per file.
PRESETS: dict[str, SynthERA5Spec] = {
    "tiny": SynthERA5Spec(height=16, width=32, steps_per_year=24, test_years=1),
    "demo": SynthERA5Spec(),
    "full": SynthERA5Spec(
        height=361, width=720, steps_per_year=1460, train_years=4, valid_years=1, test_years=1
    ),
}


def spec_from_preset(preset: str, **changes: int | float | None) -> SynthERA5Spec:
    """A preset with some fields changed (``None`` values are ignored)."""
    return preset_spec("synth-era5", PRESETS, preset, DataError, **changes)


def existing_spec(out: Path) -> SynthERA5Spec | None:
    """The spec a complete data set in ``out`` was generated with, or None if there is none."""
    found = read_manifest(out, SynthERA5Spec)
    return found[0] if found else None


def write_synthetic_era5(
    out: str | Path,
    spec: SynthERA5Spec,
    progress: Callable[[str], None] | None = None,
    workers: int = 1,
) -> Path:
    """Generate the data set into ``out`` (replacing a previous one) and return ``out``.

    Everything is written into ``<out>.partial`` first and moved into place at the end, so an interrupted run
    never leaves something that looks like a complete data set. ``workers`` threads compute the fields (the
    files are the same, bit for bit, whatever their number: only the writing order matters, and it is kept).
    """
    if workers < 1:
        raise DataError(f"synth-era5: workers must be at least 1, got {workers}")
    report = progress or (lambda message: log.info(message))
    return write_data_set(
        Path(out),
        "synth-era5",
        recognized=lambda path: existing_spec(path) is not None,
        fill=lambda partial: _write_files(partial, spec, report, workers),
        size_bytes=spec.size_bytes(),
    )


def _in_order(
    pool: ThreadPoolExecutor, function: Callable[[Any], Any], arguments: Iterable[Any], ahead: int
) -> Iterator[Any]:
    """``function(argument)`` for each argument, computed by the pool at most ``ahead`` pieces in advance (so
    memory stays a few blocks) and yielded in the arguments' order."""
    pending: deque[Future] = deque()
    for argument in arguments:
        pending.append(pool.submit(function, argument))
        if len(pending) > ahead:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def _written_blocks(
    pool: ThreadPoolExecutor,
    atmosphere: SyntheticAtmosphere,
    fields: h5py.Dataset,
    first_step: int,
    ahead: int,
) -> Iterator[np.ndarray]:
    """Each block of a file's ``fields`` (its steps count from ``first_step`` along the trajectory), yielded once
    written: the pool computes the noiseless fields of the next blocks, the noise is added here in time order."""
    steps = fields.shape[0]
    starts = range(0, steps, CHUNK_STEPS)
    ranges = (np.arange(first_step + start, first_step + min(start + CHUNK_STEPS, steps)) for start in starts)
    noiseless = _in_order(pool, atmosphere.noiseless_channels, ranges, ahead)
    for start, values in zip(starts, noiseless, strict=True):
        block = atmosphere.add_noise(values)
        fields[start : start + len(block)] = block
        yield block


def _block_sums(block: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-channel sum and sum of squares, and the sum over time per grid point, of one block, in float64."""
    return (
        block.sum(axis=(0, 2, 3), dtype=np.float64),
        np.einsum("tchw,tchw->c", block, block, dtype=np.float64),
        block.sum(axis=0, dtype=np.float64),
    )


def _write_files(partial: Path, spec: SynthERA5Spec, report: Callable[[str], None], workers: int) -> dict:
    """The yearly HDF5 files and the statistics of the training years; returns the manifest.

    Threads compute the noiseless fields of the next blocks and the sums of the training blocks written; the
    noise is added, and the sums are added up, in time order, so the files and the statistics are the same bit
    for bit with any number of ``workers``.
    """
    atmosphere = SyntheticAtmosphere(Grid(spec.height, spec.width), seed=spec.seed, noise=spec.noise)
    started = time.perf_counter()
    channel_sum = np.zeros(len(ERA5_CHANNELS))
    channel_sumsq = np.zeros(len(ERA5_CHANNELS))
    time_sum = np.zeros((len(ERA5_CHANNELS), spec.height, spec.width))
    step_offset = 0
    pool = ThreadPoolExecutor(workers, thread_name_prefix="synth-era5")
    try:
        for split, years in spec.years().items():
            (partial / split).mkdir()
            for year in years:
                with h5py.File(partial / split / f"{year}.h5", "w") as handle:
                    fields = handle.create_dataset(
                        "fields",
                        shape=(spec.steps_per_year, len(ERA5_CHANNELS), spec.height, spec.width),
                        dtype="f4",
                    )
                    fields.attrs["channels"] = list(ERA5_CHANNELS)
                    fields.attrs["hours_per_step"] = 6
                    blocks = _written_blocks(pool, atmosphere, fields, step_offset, ahead=workers)
                    if split == "train":
                        for sums in _in_order(pool, _block_sums, blocks, ahead=workers):
                            channel_sum += sums[0]
                            channel_sumsq += sums[1]
                            time_sum += sums[2]
                    else:
                        deque(blocks, maxlen=0)  # write them all
                step_offset += spec.steps_per_year
                report(
                    f"synth-era5: wrote {split}/{year}.h5 ({spec.steps_per_year} steps, "
                    f"{time.perf_counter() - started:.1f} s)"
                )
    finally:  # an interrupted write (an error, Ctrl-C) computes no further blocks
        pool.shutdown(wait=True, cancel_futures=True)

    train_steps = spec.train_years * spec.steps_per_year
    count = train_steps * spec.height * spec.width
    means = channel_sum / count
    stds = np.sqrt(np.maximum(channel_sumsq / count - means**2, 0.0))
    stats = partial / "stats"
    stats.mkdir()
    np.save(stats / "global_means.npy", means.reshape(1, -1, 1, 1).astype(np.float32))
    np.save(stats / "global_stds.npy", stds.reshape(1, -1, 1, 1).astype(np.float32))
    np.save(stats / "time_means.npy", (time_sum / train_steps)[None].astype(np.float32))
    return {"generator": "dlscale synth-era5", "channels": list(ERA5_CHANNELS), "spec": asdict(spec)}
