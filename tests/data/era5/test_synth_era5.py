"""The synthetic atmosphere and `write_synthetic_era5`: layout, stats, determinism, continuity, learnability,
safe replacement, and reading the result back with ERA5Dataset."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np
import pytest
from mounted_disks import mounted_tmpfs

from dlscale.cli import main
from dlscale.data.era5 import synth as synth_era5
from dlscale.data.era5.atmosphere import Grid, SyntheticAtmosphere
from dlscale.data.era5.config import ERA5DataConfig
from dlscale.data.era5.dataset import ERA5_CHANNELS, ERA5Dataset
from dlscale.data.era5.synth import (
    PRESETS,
    SynthERA5Spec,
    existing_spec,
    spec_from_preset,
    write_synthetic_era5,
)
from dlscale.data.synth_output import MANIFEST
from dlscale.errors import DataError

SMALL = SynthERA5Spec(height=8, width=16, steps_per_year=12, train_years=2, valid_years=1, test_years=1)
EXPECTED_FILES = {"train": ["1979.h5", "1980.h5"], "valid": ["1981.h5"], "test": ["1982.h5"]}
C = len(ERA5_CHANNELS)


def quiet(_: str) -> None:
    pass


def write(out: Path, spec: SynthERA5Spec = SMALL) -> Path:
    return write_synthetic_era5(out, spec, progress=quiet)


def read_fields(path: Path) -> np.ndarray:
    with h5py.File(path, "r") as handle:
        return handle["fields"][:]


def read_split(root: Path, split: str) -> np.ndarray:
    """The fields of all years of a split, concatenated in time."""
    return np.concatenate([read_fields(path) for path in sorted((root / split).glob("*.h5"))])


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes, to check that a directory was left untouched."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def small_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("synth") / "era5")


# ---- layout and stats ------------------------------------------------------------------------------------


def test_writes_the_tutorial_layout(small_set: Path) -> None:
    for split, names in EXPECTED_FILES.items():
        assert sorted(p.name for p in (small_set / split).iterdir()) == names
        for name in names:
            with h5py.File(small_set / split / name, "r") as handle:
                fields = handle["fields"]
                assert fields.dtype == np.float32
                assert fields.shape == (12, 20, 8, 16)
                channels = [c.decode() if isinstance(c, bytes) else str(c) for c in fields.attrs["channels"]]
                assert tuple(channels) == ERA5_CHANNELS
                assert np.all(np.isfinite(fields[:]))
    assert sorted(p.name for p in (small_set / "stats").iterdir()) == [
        "global_means.npy",
        "global_stds.npy",
        "time_means.npy",
    ]
    assert not small_set.with_name(small_set.name + ".partial").exists()


def test_manifest_records_the_spec(small_set: Path) -> None:
    manifest = json.loads((small_set / MANIFEST).read_text())
    assert manifest["channels"] == list(ERA5_CHANNELS)
    assert SynthERA5Spec(**manifest["spec"]) == SMALL
    assert existing_spec(small_set) == SMALL
    assert existing_spec(small_set / "train") is None


def test_stats_are_those_of_the_training_years(small_set: Path) -> None:
    train = read_split(small_set, "train").astype(np.float64)
    assert train.shape == (24, C, 8, 16)
    means = np.load(small_set / "stats" / "global_means.npy")
    stds = np.load(small_set / "stats" / "global_stds.npy")
    time_means = np.load(small_set / "stats" / "time_means.npy")
    assert means.shape == stds.shape == (1, C, 1, 1)
    assert time_means.shape == (1, C, 8, 16)
    assert means.dtype == stds.dtype == time_means.dtype == np.float32
    np.testing.assert_allclose(means[0, :, 0, 0], train.mean(axis=(0, 2, 3)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(stds[0, :, 0, 0], train.std(axis=(0, 2, 3)), rtol=1e-4)
    np.testing.assert_allclose(time_means[0], train.mean(axis=0), rtol=1e-6, atol=1e-5)
    # Over the training years only: the validation year has different statistics.
    everything = np.concatenate([train, read_split(small_set, "valid")])
    assert not np.allclose(stds[0, :, 0, 0], everything.std(axis=(0, 2, 3)), rtol=1e-4)
    assert np.all(stds > 0)


def test_era5_dataset_reads_the_output(small_set: Path) -> None:
    cfg = ERA5DataConfig(root=str(small_set), img_size=(8, 16))
    train, valid = ERA5Dataset(cfg, "train"), ERA5Dataset(cfg, "valid")
    assert len(train) == 2 * (12 - 1)
    assert len(valid) == 12 - 1
    assert train.channel_names == ERA5_CHANNELS
    fields = read_split(small_set, "train")
    means = np.load(small_set / "stats" / "global_means.npy")[0]
    stds = np.load(small_set / "stats" / "global_stds.npy")[0]
    inputs, targets = train[11]  # the second file's first sample (11 pairs per 12-step file)
    assert inputs.shape == targets.shape == (20, 8, 16)
    np.testing.assert_allclose(inputs.numpy(), (fields[12] - means) / stds, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(targets.numpy(), (fields[13] - means) / stds, rtol=1e-5, atol=1e-5)
    normalized = np.stack([train[i][0].numpy() for i in range(len(train))])
    assert np.abs(normalized.mean(axis=(0, 2, 3))).max() < 0.3
    assert np.all(normalized.std(axis=(0, 2, 3)) > 0.5)


# ---- determinism and continuity --------------------------------------------------------------------------


def test_same_seed_gives_identical_files_and_another_seed_different_ones(
    small_set: Path, tmp_path: Path
) -> None:
    again = write(tmp_path / "again")
    other = write(tmp_path / "other", replace(SMALL, seed=1))
    for split, names in EXPECTED_FILES.items():
        for name in names:
            reference = read_fields(small_set / split / name)
            np.testing.assert_array_equal(read_fields(again / split / name), reference)
            assert not np.allclose(read_fields(other / split / name), reference)
    for stat in ("global_means.npy", "global_stds.npy", "time_means.npy"):
        np.testing.assert_array_equal(np.load(again / "stats" / stat), np.load(small_set / "stats" / stat))


@pytest.mark.parametrize("noise", [0.0, 0.1])
def test_worker_threads_write_the_same_bytes(tmp_path: Path, noise: float) -> None:
    # Blocks computed by several threads arrive out of order; the noise and the statistics must still be the
    # serial ones (SMALL has two blocks per file, so the threads really do overlap).
    spec = replace(SMALL, noise=noise)
    serial = write_synthetic_era5(tmp_path / "serial", spec, progress=quiet, workers=1)
    threaded = write_synthetic_era5(tmp_path / "threaded", spec, progress=quiet, workers=3)
    assert snapshot(threaded) == snapshot(serial)


def test_workers_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="workers must be at least 1, got 0"):
        write_synthetic_era5(tmp_path / "era5", SMALL, progress=quiet, workers=0)
    assert not (tmp_path / "era5").exists()


def test_noise_changes_the_data(small_set: Path, tmp_path: Path) -> None:
    noisy = write(tmp_path / "noisy", replace(SMALL, noise=0.1))
    clean, with_noise = read_fields(small_set / "train" / "1979.h5"), read_fields(noisy / "train" / "1979.h5")
    spread = clean.std(axis=(0, 2, 3), keepdims=True)
    relative = np.abs(with_noise - clean) / spread
    assert 0.03 < relative.mean() < 0.3  # about 0.1 * sqrt(2/pi) of each channel's spread


# A longer run on a slightly larger grid, shared by the continuity and learnability checks.
DYNAMICS = SynthERA5Spec(height=12, width=24, steps_per_year=48, train_years=2, valid_years=1, test_years=0)


@pytest.fixture(scope="module")
def dynamics_set(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    root = write(tmp_path_factory.mktemp("dynamics") / "era5", DYNAMICS)
    means = np.load(root / "stats" / "global_means.npy").astype(np.float64)
    stds = np.load(root / "stats" / "global_stds.npy").astype(np.float64)
    return {split: (read_split(root, split) - means) / stds for split in ("train", "valid")}


def step_sizes(fields: np.ndarray) -> np.ndarray:
    """RMS change of the normalized state from each step to the next."""
    return np.sqrt((np.diff(fields, axis=0) ** 2).mean(axis=(1, 2, 3)))


def test_trajectory_is_continuous_across_files(dynamics_set: dict[str, np.ndarray]) -> None:
    steps_per_year = DYNAMICS.steps_per_year
    train, valid = dynamics_set["train"], dynamics_set["valid"]
    within = np.concatenate([step_sizes(train[:steps_per_year]), step_sizes(train[steps_per_year:])])
    typical = np.median(within)
    boundaries = {
        "1979 -> 1980": np.sqrt(((train[steps_per_year] - train[steps_per_year - 1]) ** 2).mean()),
        "1980 -> 1981 (train -> valid)": np.sqrt(((valid[0] - train[-1]) ** 2).mean()),
    }
    for name, size in boundaries.items():
        assert 0.5 * typical < size < 1.5 * typical, f"{name}: step {size:.3f}, typical {typical:.3f}"
    # A jump (e.g. restarting the trajectory) would be far larger than a 6-hourly step.
    restart = np.sqrt(((train[0] - train[steps_per_year - 1]) ** 2).mean())
    assert restart > 2 * typical


def neighbourhood_features(fields: np.ndarray) -> np.ndarray:
    """Each interior pixel's 3x3 neighbourhood of all channels (longitude wraps), plus a constant."""
    shifted = [
        np.roll(fields, (-dy, -dx), axis=(2, 3))[:, :, 1:-1, :] for dy in (-1, 0, 1) for dx in (-1, 0, 1)
    ]
    stacked = np.stack(shifted, axis=2)  # (T, C, 9, H - 2, W)
    rows = stacked.transpose(0, 3, 4, 1, 2).reshape(-1, stacked.shape[1] * 9)
    return np.hstack([rows, np.ones((len(rows), 1))])


def test_dynamics_are_learnable_and_beat_persistence(dynamics_set: dict[str, np.ndarray]) -> None:
    u10 = ERA5_CHANNELS.index("u10")
    train, valid = dynamics_set["train"], dynamics_set["valid"]
    x_train, y_train = neighbourhood_features(train[:-1]), train[1:, u10, 1:-1, :].reshape(-1)
    x_valid, y_valid = neighbourhood_features(valid[:-1]), valid[1:, u10, 1:-1, :].reshape(-1)
    gram = x_train.T @ x_train + 1e-6 * np.eye(x_train.shape[1])
    coefficients = np.linalg.solve(gram, x_train.T @ y_train)
    linear_rmse = np.sqrt(np.mean((x_valid @ coefficients - y_valid) ** 2))
    persistence_rmse = np.sqrt(np.mean((valid[:-1, u10, 1:-1, :] - valid[1:, u10, 1:-1, :]) ** 2))
    assert persistence_rmse > 0.05, "the state hardly changes in a step: nothing to learn"
    assert linear_rmse < persistence_rmse / 2, (linear_rmse, persistence_rmse)


# ---- the atmosphere on different grids -------------------------------------------------------------------

OROGRAPHY_CHANNELS = ("t2m", "sp")  # the channels that carry the static orography


def coarse_and_fine(steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The same points from a 9 x 16 grid and from every other row and column of a 17 x 32 grid."""
    coarse = SyntheticAtmosphere(Grid(9, 16), seed=0).channels(steps).astype(np.float64)
    fine = SyntheticAtmosphere(Grid(17, 32), seed=0).channels(steps)[..., ::2, ::2].astype(np.float64)
    return coarse, fine


def test_grids_sample_the_same_flow() -> None:
    coarse, fine = coarse_and_fine(np.arange(4))
    assert coarse.shape == (4, C, 9, 16)
    for c, name in enumerate(ERA5_CHANNELS):
        if name not in OROGRAPHY_CHANNELS:
            spread = fine[:, c].std()
            np.testing.assert_allclose(coarse[:, c], fine[:, c], atol=1e-5 * spread, err_msg=name)


def test_grids_sample_the_same_orography() -> None:
    coarse, fine = coarse_and_fine(np.arange(2))
    for name in OROGRAPHY_CHANNELS:
        c = ERA5_CHANNELS.index(name)
        np.testing.assert_allclose(coarse[:, c], fine[:, c], atol=1e-3 * fine[:, c].std(), err_msg=name)


# ---- replacing, refusing and interrupted writes ----------------------------------------------------------


def test_replaces_a_previous_synthetic_set(tmp_path: Path) -> None:
    out = write(tmp_path / "era5")
    smaller = SynthERA5Spec(height=6, width=12, steps_per_year=5, train_years=1, valid_years=1, test_years=0)
    assert write(out, smaller) == out
    assert existing_spec(out) == smaller
    assert sorted(p.name for p in (out / "train").iterdir()) == ["1979.h5"]
    assert not (out / "test" / "1982.h5").exists()  # nothing of the old set is left
    assert read_fields(out / "valid" / "1980.h5").shape == (5, 20, 6, 12)
    assert not out.with_name("era5.partial").exists()


def test_an_empty_directory_is_used(tmp_path: Path) -> None:
    out = tmp_path / "era5"
    out.mkdir()
    write(out)
    assert existing_spec(out) == SMALL


@pytest.mark.parametrize("as_file", [False, True], ids=["directory", "file"])
def test_refuses_to_replace_something_else(tmp_path: Path, as_file: bool) -> None:
    out = tmp_path / "precious"
    if as_file:
        out.write_text("not a data set")
        before = out.read_bytes()
    else:
        (out / "train").mkdir(parents=True)
        (out / "train" / "1990.h5").write_bytes(b"real data")
        (out / "notes.txt").write_text("keep me")
        before = snapshot(out)
    with pytest.raises(DataError, match=f"{re.escape(str(out))}.*{MANIFEST}"):
        write(out)
    assert (out.read_bytes() if as_file else snapshot(out)) == before
    assert not out.with_name("precious.partial").exists()


class FailingAtmosphere(SyntheticAtmosphere):
    """Raises on the n-th block of fields, as if the run were killed midway."""

    calls_before_failure = 3

    def noiseless_channels(self, steps: np.ndarray) -> np.ndarray:
        type(self).calls_before_failure -= 1
        if type(self).calls_before_failure < 0:
            raise KeyboardInterrupt("interrupted")
        return super().noiseless_channels(steps)


@pytest.fixture
def failing_atmosphere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(FailingAtmosphere, "calls_before_failure", 2)
    monkeypatch.setattr(synth_era5, "SyntheticAtmosphere", FailingAtmosphere)


def test_interrupted_write_leaves_no_manifest(tmp_path: Path, failing_atmosphere: None) -> None:
    out = tmp_path / "era5"
    with pytest.raises(KeyboardInterrupt):
        write(out)
    assert not (out / MANIFEST).exists()
    assert existing_spec(out) is None


def test_interrupted_write_keeps_the_previous_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = write(tmp_path / "era5")
    before = snapshot(out)
    monkeypatch.setattr(FailingAtmosphere, "calls_before_failure", 2)
    monkeypatch.setattr(synth_era5, "SyntheticAtmosphere", FailingAtmosphere)
    with pytest.raises(KeyboardInterrupt):
        write(out, replace(SMALL, seed=7))
    assert snapshot(out) == before
    assert existing_spec(out) == SMALL
    # The next complete run replaces both the old set and the leftovers of the interrupted one.
    monkeypatch.setattr(synth_era5, "SyntheticAtmosphere", SyntheticAtmosphere)
    write(out, replace(SMALL, seed=7))
    assert existing_spec(out).seed == 7
    assert not out.with_name("era5.partial").exists()


# ---- presets and spec validation -------------------------------------------------------------------------


def test_presets() -> None:
    assert {"tiny", "demo", "full"} <= set(PRESETS)
    assert PRESETS["full"].height == 361 and PRESETS["full"].width == 720
    assert PRESETS["tiny"].size_bytes() < PRESETS["demo"].size_bytes() < PRESETS["full"].size_bytes()
    spec = spec_from_preset("tiny", seed=5, height=None, steps_per_year=30)
    assert spec.seed == 5 and spec.steps_per_year == 30
    assert spec.height == PRESETS["tiny"].height  # None means "keep the preset's value"
    assert spec_from_preset("demo") == PRESETS["demo"]


def test_unknown_preset_raises() -> None:
    with pytest.raises(DataError, match="'huge'.*tiny"):
        spec_from_preset("huge")


@pytest.mark.parametrize(
    "changes",
    [
        {"height": 1},
        {"width": 0},
        {"steps_per_year": 1},
        {"train_years": 0},
        {"valid_years": 0},
        {"test_years": -1},
        {"noise": -0.5},
    ],
    ids=lambda changes: next(iter(changes)),
)
def test_bad_spec_values_raise(changes: dict) -> None:
    with pytest.raises(DataError, match="synth-era5"):
        SynthERA5Spec(**changes)


def test_years_are_consecutive_across_splits() -> None:
    assert SMALL.years() == {"train": [1979, 1980], "valid": [1981], "test": [1982]}
    assert SynthERA5Spec(first_year=2000, test_years=0).years()["test"] == []


# ---- a full disk ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("generator", ["synth-era5", "synth-mnist"])
def test_a_full_disk_is_one_line_exit_74_naming_out_and_leaves_nothing(generator, tmp_path, capsys):
    """synth-era5 knows its size and refuses before its first file; synth-mnist fails in its middle: both one
    line naming --out, nothing left (neither the data set nor its .partial directory)."""
    place = tmp_path / "place"
    options = ["--preset", "tiny"] if generator == "synth-era5" else []
    with mounted_tmpfs(place, "size=200k"):
        assert main(["data", generator, "--out", str(place / "data"), *options]) == 74
        error = capsys.readouterr().err.strip().splitlines()
        assert list(place.iterdir()) == []
    assert len(error) == 1 and error[0].startswith(f"dlscale: error: {place / 'data'}: cannot write"), error
    assert error[0].endswith("the disk is full: free some space or choose another --out"), error
    if generator == "synth-era5":
        assert "needed" in error[0], error
