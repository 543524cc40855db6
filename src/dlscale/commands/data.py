"""``dlscale data synth-*``: write synthetic data sets in the real on-disk formats; ``dlscale data import-era5``:
bring real ERA5 (zarr or netCDF) into the layout dlscale reads; ``dlscale data climatology``: WeatherBench2's
climatology by day of year and hour of day of either, into ``stats/climatology.zarr``."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import shlex
import time
from pathlib import Path

from dlscale.commands.era5_next_step import next_step_lines
from dlscale.data.synth_output import MANIFEST
from dlscale.errors import ConfigError
from dlscale.report.run_dir import setup_logging

log = logging.getLogger("dlscale.data")


# The generators of the other workloads: each module has
# ``generate(out: Path, preset: str, seed: int | None, if_missing: bool, progress) -> Path``.
GENERATORS = {
    "synth-cosmo": "dlscale.data.cosmo.synth",
    "synth-mnist": "dlscale.data.mnist.synth",
    "synth-cifar": "dlscale.data.cifar.synth",
}


def run_data(args: argparse.Namespace) -> int:
    setup_logging(None)
    if args.generator in GENERATORS:
        started = time.perf_counter()
        module = importlib.import_module(GENERATORS[args.generator])
        out = module.generate(Path(args.out), args.preset, args.seed, args.if_missing, progress=log.info)
        log.info("%s: %s ready in %.1f s", args.generator, out, time.perf_counter() - started)
        return 0
    from dlscale.data.era5.synth import existing_spec, spec_from_preset, write_synthetic_era5

    out = Path(args.out)
    spec = spec_from_preset(
        args.preset,
        height=args.height,
        width=args.width,
        train_years=args.train_years,
        valid_years=args.valid_years,
        test_years=args.test_years,
        steps_per_year=args.steps_per_year,
        first_year=args.first_year,
        seed=args.seed,
        noise=args.noise,
    )
    found = existing_spec(out)
    if args.if_missing and found == spec:
        log.info("synth-era5: %s already holds this data set (%s); nothing to do", out, MANIFEST)
        return 0
    log.info(
        "synth-era5: writing %s: %dx%d grid, years train %s valid %s test %s, %d steps each (%.2f GB)",
        out,
        spec.height,
        spec.width,
        *spec.years().values(),
        spec.steps_per_year,
        spec.size_bytes() / 1e9,
    )
    started = time.perf_counter()
    workers = args.workers if args.workers is not None else min(8, os.cpu_count() or 1)
    write_synthetic_era5(out, spec, progress=log.info, workers=workers)
    log.info("synth-era5: done in %.1f s", time.perf_counter() - started)
    return 0


def run_import_era5(args: argparse.Namespace) -> int:
    """``dlscale data import-era5 SOURCE --out DIR``: ERA5 from zarr or netCDF into the tutorial's layout."""
    from dlscale.data.era5.climatology.years import parse_years
    from dlscale.data.era5.importing.importer import ImportRequest, default_readers, import_era5
    from dlscale.data.era5.importing.names import parse_channels
    from dlscale.data.era5.importing.plan import DEFAULT_SPLIT

    setup_logging(None)
    climatology_years = (
        parse_years(args.climatology_years, "--climatology-years")
        if args.climatology_years is not None
        else None
    )
    request = ImportRequest(
        source=args.source,
        out=Path(args.out),
        channels=parse_channels(args.channels),
        dt_hours=args.dt,
        split=args.split or DEFAULT_SPLIT,
        allow_nan=args.allow_nan,
        block_mb=args.block_mb,
        readers=args.readers or default_readers(),
        progress=args.progress,
        climatology_years=climatology_years,
    )
    log.info(
        "import-era5: %s -> %s (%d channels, every %d h)",
        request.source,
        shlex.quote(str(request.out)),
        len(request.channels),
        request.dt_hours,
    )
    result = import_era5(request, report=log.info)
    if result.already_complete:
        log.info("import-era5: %s already holds this import (%s); nothing to do", request.out, MANIFEST)
    else:
        log.info(
            "import-era5: wrote %d year files (%d kept from an earlier run), %.2f GB in %.1f s = %.2f GB/s; "
            "peak memory %.0f MB (the process's high-water mark)",
            len(result.written),
            len(result.skipped),
            result.bytes_written / 1e9,
            result.seconds,
            result.gb_per_s,
            result.peak_rss_bytes / 1e6,
        )
    if result.climatology is not None:
        log.info("import-era5: climatology by day of year and hour of day: %s", result.climatology["path"])
    for line in next_step_lines(request.out, result.height, result.width, len(result.channels)):
        log.info("%s", line)
    return 0


def run_climatology(args: argparse.Namespace) -> int:
    """``dlscale data climatology --root DIR [--split train] [--years A-B]``: ROOT/stats/climatology.zarr."""
    from dlscale.data.era5.climatology.building import ClimatologyRequest, build_climatology
    from dlscale.data.era5.climatology.years import parse_years

    setup_logging(None)
    if args.memory_gb <= 0:
        raise ConfigError(f"--memory-gb {args.memory_gb}: expected a number of GB > 0")
    request = ClimatologyRequest(
        root=Path(args.root).expanduser(),
        splits=tuple(part.strip() for part in args.split.split(",") if part.strip()),
        years=parse_years(args.years, "--years") if args.years is not None else None,
        window_days=args.window,
        memory_bytes=int(args.memory_gb * 2**30),
    )
    result = build_climatology(request, report=log.info)
    log.info(
        "climatology: wrote %s (years %d-%d, %d channels) in %.1f s%s",
        result.path,
        *result.years,
        len(result.channels),
        result.seconds,
        f"; {len(result.days_without_data)} days of the year have no data (NaN; the warning above says which)"
        if result.days_without_data
        else "",
    )
    return 0
