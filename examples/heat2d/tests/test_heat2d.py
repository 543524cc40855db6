"""Tests of the heat2d example: the solver's physics, the data files, the samples, the configs and the model."""

from __future__ import annotations

import dataclasses
import importlib
import os
import pickle
import re
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from heat2d.config import Heat2DDataConfig, Heat2DModelConfig
from heat2d.dataset import Heat2DDataset
from heat2d.generate import (
    KAPPA_MAX,
    KAPPA_MIN,
    PRESETS,
    diffusivity_field,
    generate_missing,
    initial_field,
    simulate_split,
)
from heat2d.model import HeatSurrogate
from heat2d.solver import advance, stable_dt
from heat2d.workload import WORKLOAD

from dlscale.config.typed import build_section
from dlscale.errors import ConfigError

PACKAGE = Path(__file__).resolve().parents[1]
TINY = PRESETS["tiny"]


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Heat2DDataConfig:
    cfg = dataclasses.replace(TINY, root=str(tmp_path_factory.mktemp("heat2d_tiny")))
    generate_missing(cfg)
    return cfg


# ---- solver -------------------------------------------------------------------------------------------


def random_problem(grid: int = 32, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return initial_field(rng, grid), diffusivity_field(rng, grid)


def test_solver_conserves_heat_and_obeys_the_maximum_principle():
    u0, kappa = random_problem()
    dx = 1.0 / u0.shape[-1]
    dt = stable_dt(dx, float(kappa.max()), safety=0.99)  # near the limit, where the principle is tightest
    u = u0
    peaks = [np.abs(u0).max()]
    for _ in range(20):
        u = advance(u, kappa, dt, dx, steps=25)
        peaks.append(np.abs(u).max())
    # 500 steps: heat moved (the field flattened a lot), but its total only changed by rounding.
    assert peaks[-1] < 0.8 * peaks[0]
    assert abs(u.sum() - u0.sum()) <= 1e-12 * np.abs(u0).sum() * 500
    assert np.all(np.diff(peaks) <= 1e-12)
    assert u.max() <= u0.max() and u.min() >= u0.min()


def test_a_constant_field_stays_constant():
    _, kappa = random_problem()
    u = advance(np.full_like(kappa, 2.5), kappa, stable_dt(1 / 32, KAPPA_MAX), 1 / 32, steps=100)
    np.testing.assert_array_equal(u, 2.5)


def test_a_fourier_mode_decays_at_the_analytic_rate():
    grid, kappa0, (m, n), steps = 64, 0.5, (1, 2), 80
    dx = 1.0 / grid
    x = np.arange(grid) * dx
    mode = np.cos(2 * np.pi * (m * x[None, :] + n * x[:, None]))
    dt = stable_dt(dx, kappa0)
    u = advance(mode, np.full((grid, grid), kappa0), dt, dx, steps)
    amplitude = float((u * mode).sum() / (mode * mode).sum())
    # A pure mode stays a pure mode ...
    np.testing.assert_allclose(u, amplitude * mode, atol=1e-12)
    # ... decaying exactly like forward Euler on the discrete Laplacian's eigenvalue,
    rate = kappa0 * 4 / dx**2 * (np.sin(np.pi * m * dx) ** 2 + np.sin(np.pi * n * dx) ** 2)
    np.testing.assert_allclose(amplitude, (1 - dt * rate) ** steps, rtol=1e-10)
    # ... and within 1% of the continuum's exp(-kappa |k|^2 t): the O(dx^2) and O(dt) errors come to 0.2% here.
    t = steps * dt
    continuum = np.exp(-kappa0 * 4 * np.pi**2 * (m**2 + n**2) * t)
    assert 0.3 < continuum < 0.7  # a decay that tells rates apart
    np.testing.assert_allclose(amplitude, continuum, rtol=0.01)


def test_the_solver_refuses_an_unstable_time_step():
    u0, kappa = random_problem()
    with pytest.raises(ValueError, match="stability"):
        advance(u0, kappa, 1.01 * (1 / 32) ** 2 / (4 * kappa.max()), 1 / 32, steps=1)


def test_random_diffusivities_are_smooth_positive_and_bounded():
    _, kappa = random_problem(grid=64)
    assert kappa.min() > KAPPA_MIN and kappa.max() < KAPPA_MAX
    assert kappa.max() / kappa.min() > 3  # heterogeneous, not nearly uniform
    # Smooth: neighbouring cells (periodic ones included) are strongly correlated, unlike white noise.
    for axis in (-1, -2):
        assert np.corrcoef(kappa.ravel(), np.roll(kappa, 1, axis=axis).ravel())[0, 1] > 0.95
        assert np.abs(np.roll(kappa, 1, axis=axis) - kappa).max() < 0.25 * (kappa.max() - kappa.min())


# ---- generation ---------------------------------------------------------------------------------------


def test_generation_is_deterministic_and_differs_between_splits_and_seeds():
    u1, k1, _ = simulate_split(TINY, "train")
    u2, k2, _ = simulate_split(TINY, "train")
    np.testing.assert_array_equal(u1, u2)
    np.testing.assert_array_equal(k1, k2)
    valid, _, _ = simulate_split(TINY, "valid")
    assert not np.allclose(valid[0], u1[0])
    reseeded, _, _ = simulate_split(dataclasses.replace(TINY, data_seed=1), "train")
    assert not np.allclose(reseeded[0], u1[0])
    # A trajectory depends on its own seed only, not on how many trajectories the file holds.
    fewer, _, _ = simulate_split(dataclasses.replace(TINY, train_trajectories=3), "train")
    np.testing.assert_array_equal(fewer, u1[:3])


def test_files_are_written_atomically_and_never_rewritten(tmp_path: Path):
    cfg = dataclasses.replace(TINY, root=str(tmp_path / "data"))
    assert generate_missing(cfg) == [cfg.path("train"), cfg.path("valid")]
    assert sorted(os.listdir(cfg.root_path())) == ["train.h5", "valid.h5"]  # no temporary file left
    before = {p: (os.stat(p).st_ino, os.stat(p).st_mtime_ns) for p in (cfg.path("train"), cfg.path("valid"))}
    assert generate_missing(cfg) == []
    assert before == {p: (os.stat(p).st_ino, os.stat(p).st_mtime_ns) for p in before}
    with h5py.File(cfg.path("train"), "r") as handle:
        assert handle["u"].shape == (TINY.train_trajectories, TINY.frames, TINY.grid, TINY.grid)
        assert handle["u"].dtype == np.float32 and handle["kappa"].dtype == np.float32
        assert handle.attrs["u_std"] > 0 and handle.attrs["kappa_std"] > 0


def test_an_interrupted_write_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    cfg = dataclasses.replace(TINY, root=str(tmp_path))

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(h5py.Group, "create_dataset", fail)
    with pytest.raises(OSError, match="disk full"):
        generate_missing(cfg)
    assert os.listdir(tmp_path) == []


# ---- data set -----------------------------------------------------------------------------------------


def test_samples_pair_each_frame_with_the_next(tiny_data: Heat2DDataConfig):
    data = Heat2DDataset(tiny_data, "train")
    pairs = TINY.frames - 1
    assert len(data) == TINY.train_trajectories * pairs
    inputs, target = data[0]
    assert inputs.shape == (2, TINY.grid, TINY.grid) and target.shape == (1, TINY.grid, TINY.grid)
    assert inputs.dtype == target.dtype == torch.float32
    for index in range(len(data) - 1):
        trajectory, k = divmod(index, pairs)
        if k + 1 < pairs:
            torch.testing.assert_close(data[index][1][0], data[index + 1][0][0], rtol=0, atol=0)
            torch.testing.assert_close(data[index][0][1], data[index + 1][0][1], rtol=0, atol=0)  # same kappa
    # Sample (trajectory 1, frame 2) against the file, undoing the normalization.
    with h5py.File(tiny_data.path("train"), "r") as handle:
        inputs, target = data[pairs + 2]
        np.testing.assert_allclose(inputs[0] * data.u_std + data.u_mean, handle["u"][1, 2], atol=1e-6)
        np.testing.assert_allclose(target[0] * data.u_std + data.u_mean, handle["u"][1, 3], atol=1e-6)
        np.testing.assert_allclose(
            inputs[1] * data.kappa_std + data.kappa_mean, handle["kappa"][1], atol=1e-6
        )
    with pytest.raises(IndexError):
        data[len(data)]


def test_both_splits_are_normalized_with_the_training_statistics(tiny_data: Heat2DDataConfig):
    train, valid = Heat2DDataset(tiny_data, "train"), Heat2DDataset(tiny_data, "valid")
    assert len(valid) == TINY.valid_trajectories * (TINY.frames - 1)
    with h5py.File(tiny_data.path("train"), "r") as handle:
        assert valid.u_std == train.u_std == handle.attrs["u_std"]
        assert valid.kappa_mean == train.kappa_mean == handle.attrs["kappa_mean"]
    # Over the training split's frames (every sample's input, plus each trajectory's last target), the
    # normalized u has mean 0 and standard deviation 1; so has kappa over its trajectories.
    pairs = TINY.frames - 1
    frames = [train[i][0][0] for i in range(len(train))] + [
        train[i][1][0] for i in range(pairs - 1, len(train), pairs)
    ]
    kappas = torch.stack([train[i][0][1] for i in range(0, len(train), pairs)])
    for normalized in (torch.stack(frames).double(), kappas.double()):
        assert abs(float(normalized.mean())) < 1e-5
        assert abs(float(normalized.std(unbiased=False)) - 1) < 1e-5


def test_the_normalization_stats_map_raw_fields_to_the_samples_and_back(tiny_data: Heat2DDataConfig):
    """What `dlscale export` saves: (x - input_mean) / input_std of the raw (u, kappa) is the sample's input, bit
    for bit, and y * output_std + output_mean of its target is the next frame's temperature."""
    stats = {name: torch.from_numpy(array) for name, array in WORKLOAD.normalization_stats(tiny_data).items()}
    inputs, target = Heat2DDataset(tiny_data, "valid")[0]
    with h5py.File(tiny_data.path("valid"), "r") as handle:
        u, kappa = torch.from_numpy(handle["u"][0, 0:2]), torch.from_numpy(handle["kappa"][0])
    assert torch.equal((torch.stack([u[0], kappa]) - stats["input_mean"]) / stats["input_std"], inputs)
    torch.testing.assert_close(target * stats["output_std"] + stats["output_mean"], u[1:2])


def test_a_data_set_pickles_without_its_file_handle(tiny_data: Heat2DDataConfig):
    data = Heat2DDataset(tiny_data, "valid")
    first = data[0]
    copy = pickle.loads(pickle.dumps(data))  # what a spawned DataLoader worker receives
    assert copy._handle is None
    torch.testing.assert_close(copy[0], first)


# ---- configs ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "cls", "key", "value", "message"),
    [
        ("data", Heat2DDataConfig, "grid", 3, "data.grid: must be >= 8, got 3"),
        ("data", Heat2DDataConfig, "frames", 1, "data.frames: must be >= 2"),
        ("data", Heat2DDataConfig, "valid_trajectories", 0, "data.valid_trajectories: must be >= 1, got 0"),
        ("data", Heat2DDataConfig, "steps_per_frame", 0, "data.steps_per_frame: must be >= 1, got 0"),
        ("data", Heat2DDataConfig, "data_seed", -1, "data.data_seed: must be >= 0, got -1"),
        ("model", Heat2DModelConfig, "width", 0, "model.width: must be >= 1, got 0"),
        ("model", Heat2DModelConfig, "depth", 1, "model.depth: must be >= 2"),
        ("model", Heat2DModelConfig, "kernel_size", 4, "model.kernel_size: must be odd"),
    ],
)
def test_config_errors_name_the_key(section, cls, key, value, message):
    with pytest.raises(ConfigError) as raised:
        build_section(cls, {key: value}, "heat2d.yaml [config 'x']", section)
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [("grid", 32), ("frames", 5), ("data_seed", 1), ("valid_trajectories", 3), ("steps_per_frame", 2)],
)
def test_files_made_for_another_config_are_refused(tiny_data: Heat2DDataConfig, key: str, value: int):
    other = dataclasses.replace(tiny_data, **{key: value})
    mtime = os.stat(tiny_data.path("valid")).st_mtime_ns
    with pytest.raises(ConfigError) as raised:
        WORKLOAD.build_datasets(other)  # generate_if_missing is on, yet the existing files are kept
    assert f"data.{key}:" in str(raised.value)
    assert f"{key} {getattr(tiny_data, key)}, the config asks for {value}" in str(raised.value)
    assert os.stat(tiny_data.path("valid")).st_mtime_ns == mtime


def test_missing_files_name_the_path_and_the_command(tmp_path: Path):
    cfg = dataclasses.replace(TINY, root=str(tmp_path / "nothing"), generate_if_missing=False)
    with pytest.raises(ConfigError) as raised:
        WORKLOAD.build_datasets(cfg)
    assert str(cfg.path("train")) in str(raised.value)
    assert f"python -m heat2d.generate --out {cfg.root_path()} --preset tiny" in str(raised.value)
    assert not cfg.root_path().exists()


def test_missing_files_are_generated_when_allowed(tmp_path: Path):
    cfg = dataclasses.replace(TINY, root=str(tmp_path / "fresh"))
    datasets = WORKLOAD.build_datasets(cfg)
    assert set(datasets) == {"train", "valid"} and len(datasets["valid"]) == 10


def test_data_and_model_keys_do_not_collide_with_dlscale_keys():
    # dlscale accepts keys written flat at the top of a config, so each name must have a single home.
    from dlscale.config.run_config import GENERIC_SECTIONS
    from dlscale.config.typed import field_types

    ours = [*field_types(Heat2DDataConfig), *field_types(Heat2DModelConfig)]
    theirs = {key for cls in GENERIC_SECTIONS.values() for key in field_types(cls)}
    assert len(set(ours)) == len(ours)
    assert not set(ours) & theirs


def _resolved_yaml_section(document: dict, name: str, section: str) -> dict:
    config = document[name]
    parent = _resolved_yaml_section(document, config["extends"], section) if "extends" in config else {}
    return {**parent, **config.get(section, {})}


@pytest.mark.parametrize("name", ["base", "demo", "tiny"])
def test_yaml_data_sections_match_the_generator_presets(name: str):
    document = yaml.safe_load((PACKAGE / "heat2d.yaml").read_text())
    assert document[name].get("workload", document["base"]["workload"]) == "heat2d"
    data = Heat2DDataConfig(**_resolved_yaml_section(document, name, "data"))
    assert data == PRESETS[name]
    Heat2DModelConfig(**_resolved_yaml_section(document, name, "model"))


def test_the_yaml_loads_in_dlscale():
    from dlscale.config.run_config import load_run_config

    try:
        cfg = load_run_config(PACKAGE / "heat2d.yaml", "tiny")
    except ConfigError as exc:
        if "unknown workload 'heat2d'" in str(exc):
            pytest.skip("this dlscale does not find out-of-tree workloads (or heat2d is not pip-installed)")
        raise
    assert cfg.data == PRESETS["tiny"] and cfg.log.expdir == "runs/heat2d"


def test_the_entry_point_names_the_workload():
    # A regular expression rather than tomllib, which Python 3.10 lacks.
    pyproject = (PACKAGE / "pyproject.toml").read_text()
    found = re.search(
        r'\[project\.entry-points\."dlscale\.workloads"\]\s*heat2d = "([\w.]+):(\w+)"', pyproject
    )
    assert found, "pyproject.toml registers no heat2d entry point in the dlscale.workloads group"
    workload = getattr(importlib.import_module(found[1]), found[2])
    assert workload is WORKLOAD and workload.name == "heat2d"
    assert workload.data_config is Heat2DDataConfig and workload.model_config is Heat2DModelConfig


# ---- model --------------------------------------------------------------------------------------------


def model_with_a_nonzero_increment(cfg: Heat2DModelConfig | None = None) -> HeatSurrogate:
    torch.manual_seed(0)
    model = HeatSurrogate(cfg or Heat2DModelConfig(width=8, depth=3))
    torch.nn.init.normal_(model.increment.weight, std=0.1)
    return model


def test_the_untrained_model_is_persistence_in_residual_form():
    model = HeatSurrogate(Heat2DModelConfig(width=8, depth=3))
    x = torch.randn(3, 2, 12, 20)  # any grid, also a non-square one
    out = model(x)
    assert out.shape == (3, 1, 12, 20)
    torch.testing.assert_close(out, x[:, :1], rtol=0, atol=0)  # a zero increment returns u_k itself
    trained = model_with_a_nonzero_increment()
    torch.testing.assert_close(trained(x) - x[:, :1], trained.increment(trained.body(x)))
    assert not torch.allclose(trained(x), x[:, :1])


def test_the_model_commutes_with_periodic_shifts():
    model = model_with_a_nonzero_increment(Heat2DModelConfig(width=8, depth=3, kernel_size=5))
    x = torch.randn(2, 2, 16, 16)
    shift = dict(shifts=(3, -5), dims=(-2, -1))
    with torch.no_grad():
        torch.testing.assert_close(
            model(torch.roll(x, **shift)), torch.roll(model(x), **shift), atol=1e-5, rtol=1e-5
        )


def test_the_model_has_no_batch_dependent_layers():
    # Data-parallel ranks would see different batch statistics, so 2 ranks would not train like 1.
    model = HeatSurrogate(Heat2DModelConfig())
    banned = (torch.nn.modules.batchnorm._NormBase, torch.nn.modules.dropout._DropoutNd)
    assert not any(isinstance(module, banned) for module in model.modules())
    x = torch.randn(4, 2, 16, 16)
    torch.testing.assert_close(
        model_with_a_nonzero_increment()(x)[:1], model_with_a_nonzero_increment()(x[:1])
    )


def test_the_evaluator_reports_rmse_against_persistence_and_its_skill(tiny_data: Heat2DDataConfig):
    valid = WORKLOAD.build_datasets(tiny_data)["valid"]
    inputs, targets = (torch.stack(t) for t in zip(*(valid[i] for i in range(len(valid))), strict=True))
    persistence_rmse = float((inputs[:, :1] - targets).flatten(1).pow(2).mean(1).sqrt().mean())
    evaluator = WORKLOAD.evaluator(valid)
    halfway = 0.5 * (inputs[:, :1] + targets)  # half the error of persistence on every sample
    untrained = WORKLOAD.build_model(Heat2DModelConfig(), tiny_data)  # its zero increment is persistence
    with torch.no_grad():
        predictions = {"untrained": untrained(inputs), "halfway": halfway}
    for name, expected_skill in (("untrained", 0.0), ("halfway", 0.5)):
        evaluator.reset()
        evaluator.update(inputs[:3], targets[:3], predictions[name][:3])  # two batches of unequal size
        evaluator.update(inputs[3:], targets[3:], predictions[name][3:])
        summary = evaluator.summary()
        assert summary.headline == "RMSE" and summary.baseline_name == "persistence"
        assert summary.samples == len(valid)
        assert summary.baseline_scalars["RMSE"] == pytest.approx(persistence_rmse, rel=1e-6)
        assert summary.scalars["RMSE"] == pytest.approx((1 - expected_skill) * persistence_rmse, rel=1e-5)
        assert summary.scalars["skill/RMSE"] == pytest.approx(expected_skill, abs=1e-5)
        assert summary.scalars["skill/max_error"] == pytest.approx(expected_skill, abs=1e-5)
        assert summary.loss == pytest.approx(float(WORKLOAD.loss(predictions[name], targets)), rel=1e-5)


def test_rollout_training_targets_hold_the_next_frames_and_validation_stays_one_step(tiny_data):
    cfg = dataclasses.replace(tiny_data, rollout_frames=2)
    train, valid = Heat2DDataset(cfg, "train"), Heat2DDataset(cfg, "valid")
    assert len(train) == TINY.train_trajectories * (TINY.frames - 2)
    assert len(valid) == TINY.valid_trajectories * (TINY.frames - 1)
    one_step = Heat2DDataset(tiny_data, "train")
    per_trajectory = TINY.frames - 2
    for index in (0, per_trajectory + 1):  # trajectory 0 frame 0, trajectory 1 frame 1
        trajectory, k = divmod(index, per_trajectory)
        inputs, targets = train[index]
        first = one_step[trajectory * (TINY.frames - 1) + k]
        second = one_step[trajectory * (TINY.frames - 1) + k + 1]
        assert targets.shape == (2, TINY.grid, TINY.grid)
        assert torch.equal(inputs, first[0])
        assert torch.equal(targets[:1], first[1]) and torch.equal(targets[1:], second[1])
    with pytest.raises(ConfigError, match="data.rollout_frames: must be >= 1 and below frames"):
        build_section(Heat2DDataConfig, {"rollout_frames": TINY.frames, "frames": TINY.frames}, "x", "data")


def test_the_rollout_loss_feeds_each_prediction_back_with_the_same_kappa(tiny_data):
    from heat2d.workload import Heat2DRollout

    assert WORKLOAD.configured(Heat2DModelConfig(), tiny_data) is WORKLOAD and WORKLOAD.training_loss is None
    rollout = WORKLOAD.configured(Heat2DModelConfig(), dataclasses.replace(tiny_data, rollout_frames=2))
    assert isinstance(rollout, Heat2DRollout)
    train = Heat2DDataset(dataclasses.replace(tiny_data, rollout_frames=2), "train")
    inputs, targets = (torch.stack(t) for t in zip(*(train[i] for i in range(4)), strict=True))
    model = model_with_a_nonzero_increment()
    first = model(inputs)
    second = model(torch.cat([first, inputs[:, 1:]], dim=1))
    expected = (F.mse_loss(first, targets[:, :1]) + F.mse_loss(second, targets[:, 1:])) / 2
    loss = rollout.training_loss(model, (inputs, targets), step=0)
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=0)
    # the second step is trained through the first: its gradient reaches the weights twice
    assert not torch.allclose(loss, F.mse_loss(first, targets[:, :1]))


def test_the_surrogate_learns_the_tiny_data_well_beyond_persistence(tiny_data: Heat2DDataConfig):
    data = WORKLOAD.build_datasets(tiny_data)
    inputs, targets = (
        torch.stack(t) for t in zip(*(data["train"][i] for i in range(len(data["train"]))), strict=True)
    )
    torch.manual_seed(0)
    model = WORKLOAD.build_model(Heat2DModelConfig(), tiny_data)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(100):
        batch = torch.randint(len(inputs), (16,), generator=generator)
        loss = WORKLOAD.loss(model(inputs[batch]), targets[batch])
        assert loss.ndim == 0
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        persistence = float(WORKLOAD.loss(inputs[:, :1], targets))
        learned = float(WORKLOAD.loss(model(inputs), targets))
    assert learned < 0.2 * persistence
