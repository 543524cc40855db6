"""Write the heat2d data set: ``DIR/train.h5`` and ``DIR/valid.h5``, trajectories of the reference solver.

    python -m heat2d.generate --out data/heat2d_demo --preset demo

Each trajectory draws its own problem from a random generator seeded by ``(data_seed, split, index)``, so a file
is the same on every machine and every rank, trajectories do not depend on how many there are, and the
validation split never repeats a training problem:

* an initial temperature made of 3 to 6 Gaussian blobs of random sign, amplitude, width and position, summed
  over the neighbouring periodic images so that the field is smooth across the boundary;
* a diffusivity ``kappa = KAPPA_MIN * (KAPPA_MAX / KAPPA_MIN) ** sigmoid(g)``, ``g`` a smooth Gaussian random
  field (white noise low-pass filtered in Fourier space), so kappa is smooth, positive and bounded.

All trajectories share one time step, set by ``KAPPA_MAX`` rather than by their own kappa, so that the interval
between two frames, which the surrogate learns to step over, is the same for every sample.

File layout (HDF5, float32)::

    u       (trajectories, frames, grid, grid)   frame f is the solution after f * steps_per_frame steps
    kappa   (trajectories, grid, grid)
    attrs   grid, frames, trajectories, steps_per_frame, data_seed, split, generator_version, dt, dx,
            kappa_min, kappa_max; train.h5 only: u_mean, u_std, kappa_mean, kappa_std

The normalization statistics are computed on the training split and stored in train.h5 only: both splits'
data sets read them from there, so validation is normalized exactly like training and there is one copy.

A file is written as ``<name>.tmp-<host>-<pid>`` and renamed into place (``os.replace``, atomic on POSIX), so
every rank of a run may generate a missing file at the same moment: none ever sees a half-written file, and the
last rename leaves identical content. An existing file is never rewritten; the data set checks that its
attributes match the config instead.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np

from heat2d.config import SPLITS, Heat2DDataConfig
from heat2d.solver import advance, stable_dt

GENERATOR_VERSION = 1  # raise when the problems drawn for a seed change, so old files are refused
KAPPA_MIN, KAPPA_MAX = 0.1, 1.0
KAPPA_CORRELATION = 0.1  # length (in domain units) over which log-kappa varies
SPLIT_IDS = {"train": 0, "valid": 1}

# Data sections of the configs in heat2d.yaml (a test keeps the two in step).
PRESETS = {
    "base": Heat2DDataConfig(),
    "demo": Heat2DDataConfig(
        root="data/heat2d_demo",
        grid=32,
        train_trajectories=96,
        valid_trajectories=16,
        frames=16,
        steps_per_frame=10,
    ),
    "tiny": Heat2DDataConfig(
        root="data/heat2d_tiny",
        grid=16,
        train_trajectories=8,
        valid_trajectories=2,
        frames=6,
        steps_per_frame=4,
    ),
}


def trajectory_rng(data_seed: int, split: str, index: int) -> np.random.Generator:
    return np.random.default_rng([data_seed, SPLIT_IDS[split], index])


def periodic_gaussian(coords: np.ndarray, centre: float, width: float) -> np.ndarray:
    """A 1D Gaussian on the unit circle: the sum over the nearest periodic images keeps it smooth at 0 = 1."""
    return sum(np.exp(-0.5 * ((coords - centre - image) / width) ** 2) for image in (-1.0, 0.0, 1.0))


def initial_field(rng: np.random.Generator, grid: int) -> np.ndarray:
    """A few Gaussian blobs of random sign, amplitude, width and position (grid x grid, float64)."""
    coords = (np.arange(grid) + 0.5) / grid
    u = np.zeros((grid, grid))
    for _ in range(rng.integers(3, 7)):
        amplitude = rng.choice((-1.0, 1.0)) * rng.uniform(0.5, 1.0)
        width = rng.uniform(0.06, 0.15)
        cx, cy = rng.uniform(0.0, 1.0, size=2)
        u += amplitude * np.outer(periodic_gaussian(coords, cy, width), periodic_gaussian(coords, cx, width))
    return u


def diffusivity_field(rng: np.random.Generator, grid: int) -> np.ndarray:
    """A smooth random diffusivity in (KAPPA_MIN, KAPPA_MAX) (grid x grid, float64)."""
    wavenumbers = 2 * np.pi * np.fft.fftfreq(grid, d=1.0 / grid)
    k2 = wavenumbers[:, None] ** 2 + wavenumbers[None, :] ** 2
    smooth = np.fft.ifft2(
        np.fft.fft2(rng.standard_normal((grid, grid))) * np.exp(-0.5 * k2 * KAPPA_CORRELATION**2)
    )
    g = smooth.real
    g = (g - g.mean()) / max(g.std(), 1e-12)
    # sigmoid(1.5 g) spreads typical values over most of the range while keeping kappa strictly inside it.
    return KAPPA_MIN * (KAPPA_MAX / KAPPA_MIN) ** (1.0 / (1.0 + np.exp(-1.5 * g)))


def simulate_split(cfg: Heat2DDataConfig, split: str) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """(u, kappa, attributes) of ``split``: every trajectory's frames, solved together as one batch."""
    count, grid = cfg.trajectories(split), cfg.grid
    dx = 1.0 / grid
    dt = stable_dt(dx, KAPPA_MAX)
    u0 = np.empty((count, grid, grid))
    kappa = np.empty((count, grid, grid))
    for index in range(count):
        rng = trajectory_rng(cfg.data_seed, split, index)
        u0[index] = initial_field(rng, grid)
        kappa[index] = diffusivity_field(rng, grid)
    frames = np.empty((count, cfg.frames, grid, grid), dtype=np.float32)
    frames[:, 0] = u = u0
    for f in range(1, cfg.frames):
        u = advance(u, kappa, dt, dx, cfg.steps_per_frame)
        frames[:, f] = u
    attrs = {
        "grid": grid,
        "frames": cfg.frames,
        "trajectories": count,
        "steps_per_frame": cfg.steps_per_frame,
        "data_seed": cfg.data_seed,
        "split": split,
        "generator_version": GENERATOR_VERSION,
        "dt": dt,
        "dx": dx,
        "kappa_min": KAPPA_MIN,
        "kappa_max": KAPPA_MAX,
    }
    if split == "train":
        attrs.update(
            u_mean=float(frames.mean(dtype=np.float64)),
            u_std=float(frames.std(dtype=np.float64)),
            kappa_mean=float(kappa.mean()),
            kappa_std=float(kappa.std()),
        )
    return frames, kappa.astype(np.float32), attrs


def write_split(cfg: Heat2DDataConfig, split: str) -> Path:
    """Simulate ``split`` and write its file atomically (see the module docstring); returns the path."""
    path = cfg.path(split)
    u, kappa, attrs = simulate_split(cfg, split)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Host and pid: ranks on different nodes of a shared file system can have the same pid (containers).
    tmp = path.with_name(f"{path.name}.tmp-{socket.gethostname()}-{os.getpid()}")
    try:
        with h5py.File(tmp, "w") as handle:
            handle.create_dataset("u", data=u)
            handle.create_dataset("kappa", data=kappa)
            handle.attrs.update(attrs)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def generate_missing(cfg: Heat2DDataConfig) -> list[Path]:
    """Write the files of ``cfg`` that do not exist yet (existing ones are kept as they are); returns those written."""
    return [write_split(cfg, split) for split in SPLITS if not cfg.path(split).exists()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m heat2d.generate", description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="directory for train.h5 and valid.h5 (default: the preset's data root)")
    parser.add_argument("--preset", choices=PRESETS, default="demo", help="problem size (default: demo)")
    args = parser.parse_args(argv)
    cfg = PRESETS[args.preset]
    if args.out:
        cfg = replace(cfg, root=args.out)
    start = time.perf_counter()
    written = generate_missing(cfg)
    for split in SPLITS:
        state = "written" if cfg.path(split) in written else "exists, kept"
        print(f"{cfg.path(split)}: {state}")
    print(f"preset {args.preset}: {time.perf_counter() - start:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
