"""The training command ``dlscale data import-era5`` prints for the grid it imported: a config that fits the grid
(not the 24 M-parameter ``short`` for a 32 x 64 grid), and a command that resolves as printed."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from dlscale.commands.era5_next_step import next_step_lines
from dlscale.config import load_run_config


def printed_config(line: str):
    """The config the printed ``dlscale train`` command resolves to, and its --config name."""
    words = shlex.split(line.split("next step: ", 1)[1])
    assert words[:2] == ["dlscale", "train"]
    yaml_config, name = words[words.index("--yaml_config") + 1], words[words.index("--config") + 1]
    settings = [words[i + 1] for i, word in enumerate(words) if word == "--set"]
    return load_run_config(yaml_config, name, settings, {}), name, settings


def patches(img_size, patch_size) -> int:
    return (img_size[0] // patch_size) * (img_size[1] // patch_size)


@pytest.mark.parametrize(
    ("height", "width", "config", "img_size", "patch_size"),
    [
        (32, 64, "demo", (32, 64), 4),  # WeatherBench2's 5.625 degrees: the demo's own grid
        (16, 32, "tiny", (16, 32), 4),  # synth-era5's tiny preset
        (361, 720, "short", (360, 720), 8),  # the tutorial's 0.5 degrees
        (721, 1440, "short", (720, 1440), 16),  # 0.25 degrees: the tutorial's tokens, at twice the patch
        (64, 128, "demo", (64, 128), 8),  # 2.8 degrees: the demo's tokens at twice the patch
        (
            121,
            240,
            "demo",
            (120, 240),
            15,
        ),  # 1.5 degrees: patch 16 would crop 9 rows, patch 14 give more tokens
    ],
)
def test_the_suggested_config_fits_the_grid(height, width, config, img_size, patch_size):
    command, why = next_step_lines(Path("/data/era5"), height, width, 7)
    cfg, name, settings = printed_config(command)
    assert name == config
    own = load_run_config(cfg.source, name)  # the config as the YAML has it
    assert (tuple(cfg.data.img_size), cfg.model.patch_size) == (img_size, patch_size)
    assert ("model.patch_size" in " ".join(settings)) == (patch_size != own.model.patch_size)
    assert (cfg.data.root, cfg.data.n_in_channels, cfg.data.n_out_channels) == ("/data/era5", 7, 7)
    # the crop lies inside the grid, in whole patches, with no more patches than the config is made for
    assert img_size[0] <= height and img_size[1] <= width
    assert img_size[0] % patch_size == 0 and img_size[1] % patch_size == 0
    assert patches(img_size, patch_size) <= patches(own.data.img_size, own.model.patch_size)
    assert f"multiples of {patch_size} up to [{img_size[0]}, {img_size[1]}]" in why


def test_a_grid_below_the_smallest_patch_says_so():
    (line,) = next_step_lines(Path("x"), 3, 64, 20)
    assert "smaller than the ViT's patch (4)" in line
