"""Per-channel perturbation scales: the file fit-perturbation writes and --perturb gaussian:auto / FILE reads (every
hostile input one clear error naming the file and what is wrong), the members they make (each channel's noise
times its own scale), the forecast directory's label, and the fit's update rule."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from dlscale.data.trajectories import ForecastStart
from dlscale.errors import ConfigError
from dlscale.run.perturbation_fit import STEP_LIMIT, FitOptions, check_fit_options, next_scales, worst_miss
from dlscale.run.results_directory import forecast_name_parts
from dlscale.scoring.perturbation_scales import (
    SCALES_FILE,
    ChannelScales,
    read_scales,
    with_channel_scales,
)
from dlscale.scoring.perturbation_spec import MAX_SCALE, Perturbation, parse_perturbation
from dlscale.scoring.perturbations import ensemble_members, noise_in_units

CHANNELS = ["z500", "t850", "t2m", "u10"]


def scales_file(path: Path, **changes) -> Path:
    document = ChannelScales({"z500": 1.5, "t850": 0.5, "t2m": 0.6, "u10": 2.0}, 500.0).to_json()
    document.update(changes)
    path.write_text(json.dumps(document))
    return path


def test_a_scales_file_round_trips_in_the_models_channel_order(tmp_path: Path):
    path = scales_file(tmp_path / "s.json")
    found = read_scales(path)
    assert found.length_km == 500.0
    assert found.for_channels(["u10", "z500", "t850", "t2m"], str(path)) == (2.0, 1.5, 0.5, 0.6)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{not json", "not a JSON scales file"),
        ('{"kind": "dlscale perturbation scales", "version": 1, "scales": {"z500": NaN}}', "not a JSON"),
        ('["a list"]', "not a scales file"),
        ('{"kind": "something else", "version": 1, "scales": {"z500": 1}}', "not a scales file"),
        ('{"kind": "dlscale perturbation scales", "version": 7, "scales": {"z500": 1}}', "version 7"),
        ('{"kind": "dlscale perturbation scales", "version": 1, "scales": {}}', '"scales" must be an object'),
        ('{"kind": "dlscale perturbation scales", "version": 1, "scales": [1, 2]}', '"scales" must be'),
        ('{"kind": "dlscale perturbation scales", "version": 1, "scales": {"z500": "1"}}', "finite number"),
        ('{"kind": "dlscale perturbation scales", "version": 1, "scales": {"z500": true}}', "finite number"),
        (
            '{"kind": "dlscale perturbation scales", "version": 1, "scales": {"z500": 0}}',
            "lies in [1e-06, 10]",
        ),
        ('{"kind": "dlscale perturbation scales", "version": 1, "scales": {"z500": -1}}', "lies in"),
        ('{"kind": "dlscale perturbation scales", "version": 1, "scales": {"z500": 1e30}}', "lies in"),
        (
            '{"kind": "dlscale perturbation scales", "version": 1, "scales": {"z500": 1}, "length_km": -5}',
            '"length_km" must be null',
        ),
        ("", "not a JSON scales file"),
        ("[" * 100_000 + "]" * 100_000, "nested too deep"),
    ],
)
def test_a_bad_scales_file_is_one_error_naming_it(tmp_path: Path, text: str, expected: str):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=str(path)) as raised:
        read_scales(path)
    assert expected in str(raised.value)


def test_a_missing_unreadable_or_directory_scales_file_is_named(tmp_path: Path):
    with pytest.raises(ConfigError, match="no such scales file .*fit-perturbation"):
        read_scales(tmp_path / "absent.json")
    with pytest.raises(ConfigError, match="is a directory"):
        read_scales(tmp_path)
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    with pytest.raises(ConfigError, match="cannot read the scales file"):
        read_scales(loop)
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match=str(binary)):
        read_scales(binary)


def test_scales_for_other_channels_name_the_missing_and_the_extra(tmp_path: Path):
    path = scales_file(tmp_path / "s.json")
    with pytest.raises(ConfigError) as raised:
        read_scales(path).for_channels(["z500", "t850", "t2m", "v10"], str(path))
    message = str(raised.value)
    assert "no scale for v10" in message and "channels the model does not read: u10" in message


def test_auto_reads_the_runs_own_file_and_a_bare_checkpoint_has_none(tmp_path: Path):
    scales_file(tmp_path / SCALES_FILE)
    resolved = with_channel_scales(parse_perturbation("gaussian:auto"), tmp_path, CHANNELS)
    assert resolved.channel_scales == (1.5, 0.5, 0.6, 2.0) and resolved.length_km == 500.0
    assert resolved.scales_from == str(tmp_path / SCALES_FILE)
    with pytest.raises(ConfigError, match="bare checkpoint has no run directory"):
        with_channel_scales(parse_perturbation("gaussian:auto"), None, CHANNELS)
    plain = parse_perturbation("gaussian:0.3")
    assert with_channel_scales(plain, tmp_path, CHANNELS) is plain  # one scale: nothing to read


def test_the_perturb_option_takes_auto_and_files_and_refuses_a_length_with_them():
    assert parse_perturbation("gaussian:auto") == Perturbation("gaussian", scales_from="auto")
    assert (
        parse_perturbation("gaussian:/runs/a:b/s.json").scales_from == "/runs/a:b/s.json"
    )  # colons in paths
    with pytest.raises(ConfigError, match="takes no LENGTH_KM"):
        parse_perturbation("gaussian:auto:500")
    with pytest.raises(ConfigError, match="SCALE 'scales.txt' is not a number"):
        parse_perturbation("gaussian:scales.txt")


def test_each_channels_noise_is_its_own_scale_times_the_same_draw():
    latitudes, longitudes = np.linspace(-80, 80, 8), np.arange(0, 360, 22.5)
    starts = [ForecastStart(0, 3), ForecastStart(1, 7)]
    state = torch.randn(2, 4, 8, 16)
    scales = (0.5, 2.0, 0.1, 1.0)
    one = ensemble_members(Perturbation("gaussian", 1.0), 3, latitudes, longitudes, None, None, seed=11)
    per_channel = Perturbation("gaussian", max(scales), channel_scales=scales, scales_from="s.json")
    each = ensemble_members(per_channel, 3, latitudes, longitudes, None, None, seed=11)
    unit = one.perturb(starts, state) - state.unsqueeze(1)
    scaled = each.perturb(starts, state) - state.unsqueeze(1)
    for channel, scale in enumerate(scales):
        torch.testing.assert_close(scaled[:, :, channel], scale * unit[:, :, channel], rtol=1e-5, atol=1e-6)
    assert "per-channel scales (0.5, 2, 0.1, 1 standard deviations, from s.json)" in each.description
    with pytest.raises(ConfigError, match="4 per-channel scales for a state of 3 channels"):
        each.perturb(starts, state[:, :3])


def test_the_noise_in_units_is_each_channels_scale_times_its_std():
    std = torch.tensor([100.0, 2.0, 3.0], dtype=torch.float64).view(1, 3, 1, 1)

    def to_physical(x):
        return x * std + 5.0

    found = noise_in_units((0.5, 1.0, 2.0), to_physical, (3, 2, 2))
    assert found[:, 0, 0].tolist() == pytest.approx([50.0, 2.0, 6.0])


def test_the_directory_names_auto_and_a_file_apart(tmp_path: Path):
    def label(perturb: str) -> str:
        return forecast_name_parts("10d", "every:12h", None, None, 6.0, None, "wb2", None, 16, perturb)[-1]

    assert label("gaussian:auto") == "ens16-gaussianauto"
    first, second = label(f"gaussian:{tmp_path}/a.json"), label(f"gaussian:{tmp_path}/b.json")
    assert first.startswith("ens16-gaussianfile-") and first != second


def test_the_fit_centres_the_ratios_and_reshapes_each_channel_by_the_root_of_its_miss():
    # all twice too dispersive: the common factor halves every scale, and no channel is reshaped
    assert next_scales({"a": 1.0, "b": 0.4}, {"a": 2.0, "b": 2.0}) == pytest.approx({"a": 0.5, "b": 0.2})
    # ratios 0.5 and 2 are centred already: a is raised and b lowered by the root of their misses (x2, /2)
    found = next_scales({"a": 1.0, "b": 1.0}, {"a": 0.5, "b": 2.0})
    assert found == pytest.approx({"a": 2**0.5, "b": 2**-0.5})
    # a ratio near 0 moves its scale by the step limit only; the bounds of gaussian:SCALE hold
    assert next_scales({"a": 1.0}, {"a": 1e-9})["a"] == pytest.approx(STEP_LIMIT)
    assert next_scales({"a": 8.0}, {"a": 0.5})["a"] == MAX_SCALE
    # only the fitted channels' ratios count: c (ratio 9) is ignored, and moves with the common factor alone
    found = next_scales({"a": 1.0, "b": 1.0, "c": 1.0}, {"a": 0.5, "b": 2.0, "c": 9.0}, fitted=["a", "b"])
    assert found == pytest.approx({"a": 2**0.5, "b": 2**-0.5, "c": 1.0})
    assert worst_miss({"a": 0.5, "b": 1.5}) == pytest.approx(2.0)
    assert worst_miss({"a": 1.0}) == pytest.approx(1.0)
    assert math.isclose(worst_miss({"a": 1.25, "b": 0.9}), 1.25)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"members": 1}, "--members 1: a spread needs"),
        ({"init_count": 1}, "--init-count 1"),
        ({"iterations": 0}, "--iterations 0"),
        ({"start": 0.0}, "--start 0.0"),
        ({"start": float("nan")}, "--start nan"),
        ({"length_km": -1.0}, "--length-km -1.0"),
        ({"lead": "5 parsecs"}, "5 parsecs"),
        ({"batch_size": 0}, "--batch-size 0"),
        ({"channels": ()}, "--channels: no channel names"),
    ],
)
def test_bad_fit_options_are_named(changes: dict, expected: str):
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(")):
        check_fit_options(FitOptions(**changes))
