"""`dlscale data synth-cosmo`: dark-matter -> gas volumes in the layout of the sc21 U-Net tutorial's files.

    OUT/train.h5, OUT/valid.h5   datasets `Nbody` (4, L, L, L) and `Hydro` (5, L, L, L), float32, channel-first
    OUT/manifest.json           how it was generated (written last)

The mapping is learnable and local, like the real one (N-body -> hydrodynamics):

* dark matter: a Gaussian random field ``delta`` with power spectrum ``P(k) = k exp(-(k/k_c)^2)`` (``k`` in
  cycles per voxel), made by filtering white noise with FFTs; channel 0 is its log-density, ``delta / 4``
  (the tutorial's convention: density = exp(14 x)); channels 1-3 its velocity ``v = -grad(phi)`` with
  ``laplace(phi) = -delta`` (computed spectrally, so it really is a vector field), divided by 4 sigma_v;
* gas: from the same field smoothed with a Gaussian of ``smoothing`` voxels, standardized (``s``): density
  ``0.6 tanh(s)``, temperature ``tanh(0.5 s^2 + 0.5 s - 0.5)``, velocities = the smoothed dark-matter
  velocities (same scale as the inputs).

Everything is clipped to [-1, 1], the range of the tutorial's data (its model ends in tanh). Normalizations
use the spectrum's analytic variances, not each box's own, so every box and crop obeys the same mapping.
Train and validation are independent realizations.

The ``full`` preset has the tutorial's sizes (1024^3 train, 512^3 valid): 40.5 GiB on disk, and generating it
needs about 20 GB of memory and several minutes (each field is one whole-box FFT; it is not chunked).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import h5py
import numpy as np

from dlscale.data.synth_output import MANIFEST, preset_spec, read_manifest, write_data_set
from dlscale.errors import ConfigError

log = logging.getLogger(__name__)

NBODY_CHANNELS = ("dm_log_density", "dm_vx", "dm_vy", "dm_vz")
HYDRO_CHANNELS = ("gas_log_density", "temperature", "gas_vx", "gas_vy", "gas_vz")
SPLIT_FILES = {"train": "train.h5", "valid": "valid.h5"}


@dataclass(frozen=True)
class SynthCosmoSpec:
    """What to generate: box sides of the two files and the statistics of the fields."""

    train_box: int = 64
    valid_box: int = 48
    seed: int = 0
    cutoff: float = 0.08  # k_c of the power spectrum, cycles per voxel (structures of ~1/k_c voxels)
    smoothing: float = 1.5  # Gaussian radius (voxels) between the dark matter and the gas fields

    def __post_init__(self) -> None:
        for name in ("train_box", "valid_box"):
            if getattr(self, name) < 4 or getattr(self, name) % 2:
                raise ConfigError(
                    f"synth-cosmo: {name} must be an even number >= 4, got {getattr(self, name)}"
                )
        if not 0 < self.cutoff < 0.5 or self.smoothing < 0 or self.seed < 0:
            raise ConfigError("synth-cosmo: need 0 < cutoff < 0.5 cycles/voxel, smoothing >= 0 and seed >= 0")

    def size_bytes(self) -> int:
        channels = len(NBODY_CHANNELS) + len(HYDRO_CHANNELS)
        return sum(4 * channels * side**3 for side in (self.train_box, self.valid_box))


# tiny: tests (well under a second); demo: the CPU demo config; full: the tutorial's box sizes.
PRESETS: dict[str, SynthCosmoSpec] = {
    "tiny": SynthCosmoSpec(train_box=48, valid_box=40),
    "demo": SynthCosmoSpec(train_box=64, valid_box=48),
    "full": SynthCosmoSpec(train_box=1024, valid_box=512),
}


def spec_from_preset(preset: str, seed: int | None = None) -> SynthCosmoSpec:
    """A preset, with its seed replaced when ``seed`` is given."""
    return preset_spec("synth-cosmo", PRESETS, preset, seed=seed)


def existing_spec(out: Path) -> SynthCosmoSpec | None:
    """The spec of the complete data set in ``out``, or None if there is none."""
    found = read_manifest(out, SynthCosmoSpec)
    return found[0] if found else None


def generate(
    out: Path,
    preset: str,
    seed: int | None = None,
    if_missing: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Write the ``preset`` data set to ``out`` (see the module docstring); return ``out``."""
    spec = spec_from_preset(preset, seed)
    out = Path(out)
    report = progress or log.info
    if if_missing and existing_spec(out) == spec:
        report(f"synth-cosmo: {out} already holds this data set ({MANIFEST}); nothing to do")
        return out
    if spec.size_bytes() > 2**33:
        log.warning(
            "synth-cosmo: preset %r writes %.1f GiB (train %d^3, valid %d^3) and needs about %.0f GB of memory",
            preset,
            spec.size_bytes() / 2**30,
            spec.train_box,
            spec.valid_box,
            20 * spec.train_box**3 / 1e9,
        )
    return write_synthetic_cosmo(out, spec, report)


def write_synthetic_cosmo(out: Path, spec: SynthCosmoSpec, progress: Callable[[str], None]) -> Path:
    """Generate both files into ``<out>.partial`` and move it into place (no half-written data set)."""
    return write_data_set(
        out,
        "synth-cosmo",
        recognized=lambda path: existing_spec(path) is not None,
        fill=lambda partial: _write_files(partial, spec, progress),
        size_bytes=spec.size_bytes(),
    )


def _write_files(partial: Path, spec: SynthCosmoSpec, progress: Callable[[str], None]) -> dict:
    """The training and validation volumes; returns the manifest."""
    started = time.perf_counter()
    for stream, (split, name) in enumerate(SPLIT_FILES.items()):
        side = spec.train_box if split == "train" else spec.valid_box
        rng = np.random.default_rng([spec.seed, stream])  # independent realizations per split
        write_volume_pair(partial / name, side, spec, rng)
        progress(f"synth-cosmo: wrote {name} ({side}^3, {time.perf_counter() - started:.2f} s)")
    return {
        "generator": "dlscale synth-cosmo",
        "spec": asdict(spec),
        "files": SPLIT_FILES,
        "channels": {"Nbody": list(NBODY_CHANNELS), "Hydro": list(HYDRO_CHANNELS)},
    }


class _Spectrum:
    """Fourier-space filters of one box (rfftn layout) and the analytic variances that normalize them."""

    def __init__(self, side: int, spec: SynthCosmoSpec):
        dtype = np.float32
        full = np.fft.fftfreq(side).astype(dtype)
        half = np.fft.rfftfreq(side).astype(dtype)
        self.axes = (full[:, None, None], full[None, :, None], half[None, None, :])
        k2 = self.axes[0] ** 2 + self.axes[1] ** 2 + self.axes[2] ** 2
        nyquist = (np.abs(self.axes[0]) == 0.5) | (np.abs(self.axes[1]) == 0.5) | (self.axes[2] == 0.5)
        # sqrt(P) with P(k) = k exp(-(k/k_c)^2); no mean (k = 0) and no Nyquist modes, whose derivative is ill-defined
        amplitude = np.where(k2 > 0, k2**0.25 * np.exp(-k2 / (2 * spec.cutoff**2)), 0).astype(dtype)
        amplitude[np.broadcast_to(nyquist, amplitude.shape)] = 0
        self.amplitude = amplitude
        self.inverse_k2 = np.where(k2 > 0, 1 / np.maximum(k2, 1e-12), 0).astype(dtype)
        self.smooth = np.exp(-2 * math.pi**2 * spec.smoothing**2 * k2).astype(dtype)
        # Continuous-limit variances (mean over the grid of |filter|^2 ~ integral over k in cycles/voxel).
        cutoff_smoothed2 = 1 / (1 / spec.cutoff**2 + 4 * math.pi**2 * spec.smoothing**2)
        self.sigma_delta = math.sqrt(2 * math.pi * spec.cutoff**4)
        self.sigma_smoothed = math.sqrt(2 * math.pi * cutoff_smoothed2**2)
        self.sigma_velocity = math.sqrt(2 * math.pi * spec.cutoff**2 / 3)  # per component
        self.side = side

    def field(self, modes: np.ndarray) -> np.ndarray:
        return np.fft.irfftn(modes, s=(self.side,) * 3, axes=(0, 1, 2)).astype(np.float32, copy=False)


def write_volume_pair(path: Path, side: int, spec: SynthCosmoSpec, rng: np.random.Generator) -> None:
    """One file: the dark-matter fields (`Nbody`) and the gas fields (`Hydro`) of one random box."""
    spectrum = _Spectrum(side, spec)
    white = rng.standard_normal((side, side, side), dtype=np.float32)
    modes = np.fft.rfftn(white).astype(np.complex64, copy=False) * spectrum.amplitude
    del white
    with h5py.File(path, "w") as handle:
        nbody = handle.create_dataset("Nbody", shape=(4, side, side, side), dtype="f4")
        hydro = handle.create_dataset("Hydro", shape=(5, side, side, side), dtype="f4")
        nbody.attrs["channels"] = list(NBODY_CHANNELS)
        hydro.attrs["channels"] = list(HYDRO_CHANNELS)

        nbody[0] = np.clip(spectrum.field(modes) / (4 * spectrum.sigma_delta), -1, 1)
        smoothed = spectrum.field(modes * spectrum.smooth) / spectrum.sigma_smoothed
        hydro[0] = 0.6 * np.tanh(smoothed)
        hydro[1] = np.tanh(0.5 * smoothed**2 + 0.5 * smoothed - 0.5)
        del smoothed
        velocity_scale = 4 * spectrum.sigma_velocity
        for axis, k_axis in enumerate(spectrum.axes):
            # v = -grad(phi), laplace(phi) = -delta  =>  v_k = -i k delta_k / |k|^2 (up to 2 pi, absorbed in sigma_v)
            component = modes * (-1j * k_axis * spectrum.inverse_k2).astype(np.complex64)
            nbody[1 + axis] = np.clip(spectrum.field(component) / velocity_scale, -1, 1)
            hydro[2 + axis] = np.clip(spectrum.field(component * spectrum.smooth) / velocity_scale, -1, 1)
