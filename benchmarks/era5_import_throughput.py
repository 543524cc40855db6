"""How fast `dlscale data import-era5` writes, against the disk's own sequential write speed, and why it writes
`fields` contiguous (what dlscale's reader then reads, per layout).

    PYTHONPATH=src python benchmarks/era5_import_throughput.py [--height 181 --width 360 --steps 146 --trials 5]

Source: a zarr (format 2) store in ARCO-ERA5's schema (long names, a `level` dimension, one chunk per time step,
zarr's default compressor) with the 20 channels' variables on an H x W grid, two years (train, valid) of
``--steps`` 6-hourly steps each, written into a temporary directory on the disk that receives the output.

(a) import: the wall time of ``import_era5`` (open the store, read every channel, check for NaN, the statistics,
    write each year file and fsync it) -> GB/s of ``fields`` written.
(b) disk: a plain sequential write of the same number of bytes in 64 MiB buffers, then fsync -> GB/s.
(a) and (b) alternate, ``--trials`` of each, so a change in the machine's load hits both; each mean has its 95 %
interval and so has the ratio (a)/(b) (perf/bench/intervals.py). After the first trial the store is read from
the page cache: the numbers are the importer's own cost, not that of a cold or remote source.
(c) reader: dlscale's ERA5 reader (``read_batch`` of 16 random samples, the full grid cropped to multiples of 8)
    on the imported file as written (contiguous: read through a memory map, and through HDF5 calls) and on a
    copy chunked by time step (one chunk per step, HDF5 calls only: a chunked dataset cannot be mapped).

Results: ``benchmarks/results/<date>-cpu-era5-import-throughput.json``, ``.md`` and ``.png``.
"""

from __future__ import annotations

import argparse
import inspect
import os
import platform
import shutil
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from benchmark_text import command_line

REPO = Path(__file__).resolve().parents[1]
CHANNELS_PER_LEVEL = {
    "geopotential": (50, 500, 850, 1000),
    "temperature": (500, 850),
    "u_component_of_wind": (500, 850, 1000),
}
BUFFER_BYTES = 64 << 20


def write_source(path: Path, height: int, width: int, steps: int, years: list[int]) -> Path:
    """An ARCO-ERA5-like zarr store with every variable the tutorial's 20 channels need."""
    import pandas as pd
    import xarray as xr

    from dlscale.data.era5.importing.names import PRESSURE_LEVEL_VARIABLES, SURFACE_VARIABLES

    times = np.concatenate([pd.date_range(f"{y}-01-01", periods=steps, freq="6h").values for y in years])
    rng = np.random.default_rng(0)
    levels = np.array([50, 500, 850, 1000])
    smooth = np.sin(np.linspace(0, 3, height))[:, None] * np.cos(np.linspace(0, 6, width))[None]
    data_vars = {}
    for channel in ("u10", "v10", "t2m", "sp", "msl", "tcwv"):
        values = 100 * smooth + rng.standard_normal((len(times), height, width))
        data_vars[SURFACE_VARIABLES[channel][0]] = (
            ("time", "latitude", "longitude"),
            values.astype(np.float32),
        )
    for letter in ("z", "t", "u", "v", "r"):
        values = 100 * smooth + rng.standard_normal((len(times), len(levels), height, width))
        dims = ("time", "level", "latitude", "longitude")
        data_vars[PRESSURE_LEVEL_VARIABLES[letter][0]] = (dims, values.astype(np.float32))
    dataset = xr.Dataset(
        data_vars,
        coords={
            "time": times,
            "level": levels,
            "latitude": np.linspace(90, -90, height),
            "longitude": np.arange(width) * 360.0 / width,
        },
    )
    for variable in dataset.data_vars.values():
        variable.encoding["chunks"] = (1, *variable.shape[1:])
    keywords = {"zarr_format": 2} if "zarr_format" in inspect.signature(xr.Dataset.to_zarr).parameters else {}
    dataset.to_zarr(path, mode="w", consolidated=True, **keywords)
    return path


def import_trial(source: Path, out: Path, years: list[int]) -> tuple[float, int]:
    """Seconds and bytes of one import into a fresh ``out``."""
    from dlscale.data.era5.importing.importer import ImportRequest, default_readers, import_era5

    shutil.rmtree(out, ignore_errors=True)
    split = f"{years[0]}:train,{years[1]}:valid"
    request = ImportRequest(str(source), out, split=split, progress="none", readers=default_readers())
    started = time.perf_counter()
    result = import_era5(request, report=lambda line: None)
    return time.perf_counter() - started, result.bytes_written


def disk_trial(directory: Path, size: int) -> float:
    """Seconds to write ``size`` bytes sequentially and fsync them."""
    buffer = np.random.default_rng(1).integers(0, 255, BUFFER_BYTES, dtype=np.uint8).tobytes()
    path = directory / "sequential.bin"
    started = time.perf_counter()
    with open(path, "wb") as file:
        left = size
        while left > 0:
            file.write(buffer[: min(left, BUFFER_BYTES)])
            left -= BUFFER_BYTES
        file.flush()
        os.fsync(file.fileno())
    seconds = time.perf_counter() - started
    path.unlink()
    return seconds


def reader_rates(out: Path, height: int, width: int, trials: int, batches: int) -> dict[str, list[float]]:
    """samples/s of read_batch on the contiguous file (mmap, hdf5) and on a copy chunked by time step."""
    import h5py

    from dlscale.data.era5.config import ERA5DataConfig
    from dlscale.data.era5.dataset import ERA5Dataset

    chunked = out.parent / "chunked"
    shutil.rmtree(chunked, ignore_errors=True)
    shutil.copytree(out, chunked)
    for path in (chunked / "train").glob("*.h5"):
        with h5py.File(out / "train" / path.name, "r") as source, h5py.File(path, "w") as target:
            fields = source["fields"]
            copy = target.create_dataset(
                "fields", shape=fields.shape, dtype="f4", chunks=(1, *fields.shape[1:])
            )
            copy.attrs["channels"] = fields.attrs["channels"]
            for start in range(0, fields.shape[0], 16):
                copy[start : start + 16] = fields[start : start + 16]
    crop = (height // 8 * 8, width // 8 * 8)
    layouts = {
        "contiguous, mmap": (out, "mmap"),
        "contiguous, hdf5": (out, "hdf5"),
        "chunked, hdf5": (chunked, "hdf5"),
    }
    rates: dict[str, list[float]] = {name: [] for name in layouts}
    rng = np.random.default_rng(2)
    for _ in range(trials):
        for name, (root, method) in layouts.items():
            dataset = ERA5Dataset(ERA5DataConfig(root=str(root), img_size=crop, read_method=method), "train")
            dataset.read_batch(list(range(16)))  # opens (and maps) the file outside the timing
            # the chunked copy reads about 30 times slower: fewer batches measure it as well
            count = batches if name.startswith("contiguous") else max(2, batches // 10)
            order = [rng.integers(0, len(dataset), 16).tolist() for _ in range(count)]
            started = time.perf_counter()
            for indices in order:
                dataset.read_batch(indices)
            rates[name].append(16 * count / (time.perf_counter() - started))
            dataset.close()
    return rates


def interval_json(values: list[float]) -> dict[str, Any]:
    from dlscale.perf.bench.intervals import mean_interval

    interval = mean_interval(values)
    return {"mean": interval.mean, "low": interval.low, "high": interval.high, "trials": values}


def markdown(record: dict[str, Any]) -> str:
    setup, ratio = record["setup"], record["import_over_disk"]
    lines = [
        f"# import-era5 throughput ({record['date']}, {record['machine']})",
        "",
        f"`{record['command']}`",
        "",
        f"Source: zarr format 2, ARCO-ERA5 schema, {setup['height']} x {setup['width']} grid, 20 channels, "
        f"2 years x {setup['steps']} 6-hourly steps; {setup['gigabytes']:.2f} GB of `fields` per import, "
        f"{setup['readers']} reader threads, {record['cpus']} CPUs. Source read from the page cache (warm).",
        "",
        "| what | GB/s (95% CI) | trials |",
        "|---|---|---|",
    ]
    for name in ("import", "disk"):
        row = record[name]
        trials = ", ".join(f"{value:.3f}" for value in row["trials"])
        lines.append(f"| {name} | {row['mean']:.3f} ({row['low']:.3f} to {row['high']:.3f}) | {trials} |")
    lines += [
        "",
        f"Import / disk: {ratio['ratio']:.2f} (95% CI {ratio['low']:.2f} to {ratio['high']:.2f}).",
        "",
        "dlscale's reader on the imported file (`read_batch`, 16 random samples, grid cropped to multiples of 8):",
        "",
        "| layout, read method | samples/s (95% CI) |",
        "|---|---|",
    ]
    for name, row in record["reader"].items():
        lines.append(f"| {name} | {row['mean']:.3g} ({row['low']:.3g} to {row['high']:.3g}) |")
    return "\n".join(lines) + "\n"


def plot(record: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [2, 3]})
    for axis, rows, unit, title in (
        (
            left,
            {n: record[n] for n in ("import", "disk")},
            "GB/s written",
            "import-era5 vs the disk's own write",
        ),
        (right, record["reader"], "samples/s (batches of 16)", "dlscale's reader on the imported file"),
    ):
        names = list(rows)
        means = [rows[n]["mean"] for n in names]
        errors = [
            [rows[n]["mean"] - rows[n]["low"] for n in names],
            [rows[n]["high"] - rows[n]["mean"] for n in names],
        ]
        positions = np.arange(len(names))
        axis.bar(
            positions, means, yerr=errors, capsize=6, color=["#4c72b0", "#999999", "#55a868"][: len(names)]
        )
        for position, name in zip(positions, names, strict=True):
            trials = rows[name]["trials"]
            axis.scatter([position] * len(trials), trials, color="black", s=10, zorder=3)
        for position, mean in zip(positions, means, strict=True):
            axis.annotate(
                f"{mean:.3g}", (position, mean), xytext=(14, 3), textcoords="offset points", fontsize=9
            )
        axis.set_xticks(positions, names)
        axis.set_ylabel(unit)
        axis.set_title(title, fontsize=10)
        axis.set_ylim(0, max(r["high"] for r in rows.values() if np.isfinite(r["high"])) * 1.15)
    ratio = record["import_over_disk"]
    ratio_text = f"import/disk {ratio['ratio']:.2f} (95% CI {ratio['low']:.2f} to {ratio['high']:.2f})"
    left.text(0.5, 0.97, ratio_text, transform=left.transAxes, ha="center", va="top", fontsize=9)
    setup = record["setup"]
    figure.suptitle(
        f"{setup['height']} x {setup['width']} x 20 channels, {setup['gigabytes']:.2f} GB per import, "
        f"{record['cpus']} CPUs; bars: mean and 95% CI, dots: trials",
        fontsize=10,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--height", type=int, default=181)
    parser.add_argument("--width", type=int, default=360)
    parser.add_argument("--steps", type=int, default=146, help="6-hourly steps per year (two years)")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--batches", type=int, default=40, help="reader batches per trial")
    parser.add_argument(
        "--workdir", default=None, help="where the store and the output go (default: a temp dir)"
    )
    parser.add_argument("--results", default=str(REPO / "benchmarks" / "results"))
    args = parser.parse_args(argv)
    from dlscale.data.era5.importing.importer import default_readers
    from dlscale.perf.bench.intervals import ratio_interval

    years = [1979, 1980]
    with tempfile.TemporaryDirectory(dir=args.workdir) as work:
        work_dir = Path(work)
        source = write_source(work_dir / "era5.zarr", args.height, args.width, args.steps, years)
        imports, disks, size = [], [], 0
        for trial in range(args.trials):
            seconds, size = import_trial(source, work_dir / "out", years)
            imports.append(size / 1e9 / seconds)
            disks.append(size / 1e9 / disk_trial(work_dir, size))
            print(f"trial {trial + 1}: import {imports[-1]:.3f} GB/s, disk {disks[-1]:.3f} GB/s", flush=True)
        reader = reader_rates(work_dir / "out", args.height, args.width, args.trials, args.batches)
    ratio = ratio_interval(imports, disks)
    record = {
        "date": datetime.now().strftime("%Y-%m-%d"),
        "machine": platform.node() or "cpu",
        "cpus": os.cpu_count(),
        "command": command_line(
            "benchmarks/era5_import_throughput.py", sys.argv[1:] if argv is None else argv
        ),
        "setup": {
            "height": args.height,
            "width": args.width,
            "steps": args.steps,
            "gigabytes": size / 1e9,
            "readers": default_readers(),
        },
        "import": interval_json(imports),
        "disk": interval_json(disks),
        "import_over_disk": {"ratio": ratio.ratio, "low": ratio.low, "high": ratio.high},
        "reader": {name: interval_json(values) for name, values in reader.items()},
    }
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    stem = results / f"{record['date']}-cpu-era5-import-throughput"
    from dlscale.runtime.strict_json import to_json

    stem.with_suffix(".json").write_text(to_json(record))
    stem.with_suffix(".md").write_text(markdown(record))
    plot(record, stem.with_suffix(".png"))
    print(markdown(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
