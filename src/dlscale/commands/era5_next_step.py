"""What ``dlscale data import-era5`` suggests training next: a config of the shipped ``configs/vit_era5.yaml``
that fits the imported grid, with the ``img_size`` (and, on a finer grid, the patch size) that make it fit.

A 32 x 64 grid (WeatherBench2's 5.625 degrees) gets ``demo``, the model sized for such a grid, not ``short``'s
24 M parameters made for 360 x 720. The configs are tried largest first: the first whose own grid fits inside
the imported one is taken, its patch grown until the imported grid has no more patches than the config's own
grid (so a 721 x 1440 grid trains ``short`` at patch 16: as many tokens as the tutorial's 360 x 720 at patch 8;
WeatherBench2's 1.5 degrees, 121 x 240, trains ``demo`` at patch 15), and ``img_size`` is the largest crop of
the grid into whole patches.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from dlscale.config import load_run_config
from dlscale.config.yaml_source import DEFAULT_YAML

# The configs of DEFAULT_YAML a first run on new data starts from, largest grid first.
STARTING_CONFIGS = ("short", "demo", "tiny")


@dataclass(frozen=True)
class ConfigGrid:
    """A config's own image size and patch size, as its YAML resolves them."""

    name: str
    img_size: tuple[int, int]
    patch_size: int

    @property
    def patches(self) -> int:
        return (self.img_size[0] // self.patch_size) * (self.img_size[1] // self.patch_size)

    def fits_in(self, height: int, width: int) -> bool:
        return self.img_size[0] <= height and self.img_size[1] <= width


@dataclass(frozen=True)
class GridFit:
    """The config to train on a ``height`` x ``width`` grid, and the crop and patch size that fit it."""

    config: ConfigGrid
    img_size: tuple[int, int]
    patch_size: int


def starting_configs() -> list[ConfigGrid]:
    """The grids of :data:`STARTING_CONFIGS`, read from the shipped YAML (found from any directory)."""
    grids = []
    for name in STARTING_CONFIGS:
        cfg = load_run_config(DEFAULT_YAML, name, [], {})
        grids.append(ConfigGrid(name, tuple(cfg.data.img_size), cfg.model.patch_size))
    return grids


def fit_grid(height: int, width: int, configs: list[ConfigGrid]) -> GridFit | None:
    """The first of ``configs`` whose grid fits in ``height`` x ``width`` (else the last, the smallest), with
    the smallest patch from its own on that leaves the grid no more patches than the config's own grid has;
    None when not one patch fits in the grid."""
    config = next((c for c in configs if c.fits_in(height, width)), configs[-1])
    patch = config.patch_size
    while (height // patch) * (width // patch) > config.patches:
        patch += 1  # any size: the patch embedding is a convolution with the patch as kernel and stride
    crop = (height // patch * patch, width // patch * patch)
    if 0 in crop:
        return None
    return GridFit(config, crop, patch)


def next_step_lines(out: Path, height: int, width: int, channels: int) -> list[str]:
    """The ``dlscale train`` command for an imported data set, and why its config and img_size."""
    configs = starting_configs()
    fit = fit_grid(height, width, configs)
    if fit is None:
        smallest = configs[-1].patch_size
        return [
            f"import-era5: the {height} x {width} grid is smaller than the ViT's patch ({smallest}); "
            "set a smaller model.patch_size to train on it"
        ]
    config, patch = fit.config, fit.patch_size
    settings = [f"data.root={out}", f"data.img_size=[{fit.img_size[0]},{fit.img_size[1]}]"]
    if patch != config.patch_size:
        settings.append(f"model.patch_size={patch}")
    settings += [f"data.n_in_channels={channels}", f"data.n_out_channels={channels}"]
    command = f"dlscale train --yaml_config {DEFAULT_YAML} --config {config.name} " + " ".join(
        f"--set {shlex.quote(setting)}" for setting in settings
    )
    own = f"{config.img_size[0]} x {config.img_size[1]} at patch {config.patch_size}"
    return [
        f"import-era5: next step: {command}",
        f"import-era5: config {config.name} is made for {own} ({config.patches:,} patches per sample); "
        f"img_size crops [H, W] from the top-left of the {height} x {width} grid (north-west corner): with "
        f"model.patch_size={patch} both must be multiples of {patch} up to [{fit.img_size[0]}, {fit.img_size[1]}] "
        f"(the largest, used above: {(fit.img_size[0] // patch) * (fit.img_size[1] // patch):,} patches)",
    ]
