"""``dlscale data synth-*``: write synthetic data sets in the real on-disk formats."""

from __future__ import annotations

import argparse
import importlib
import logging
import time
from pathlib import Path

from dlscale.data.era5.synth import existing_spec, spec_from_preset, write_synthetic_era5
from dlscale.data.synth_output import MANIFEST
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
    write_synthetic_era5(out, spec, progress=log.info)
    log.info("synth-era5: done in %.1f s", time.perf_counter() - started)
    return 0
