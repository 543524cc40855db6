"""The U-Net's data: the 24 cube rotations, the HDF5 reader and its random crops, the gpu pipeline's device
crops and rotations, and the synthetic generator."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from dlscale.cli import main
from dlscale.data.cosmo.config import CosmoDataConfig
from dlscale.data.cosmo.dataset import CosmoCropDataset
from dlscale.data.cosmo.orientations import (
    NUM_ORIENTATIONS,
    ORIENTATIONS,
    compose,
    inverse,
    orient_array,
    orient_batch,
    orient_tensor,
)
from dlscale.data.cosmo.synth import MANIFEST, generate
from dlscale.data.loading.gpu_pipeline import GpuPipeline
from dlscale.data.loading.loader_config import LoaderConfig
from dlscale.data.loading.pipeline import build_batch_source
from dlscale.data.loading.sampler import EvaluationSampler, TrainingSampler
from dlscale.data.values.normalization import EpochIndex
from dlscale.errors import ConfigError, DataError, InvalidValue
from dlscale.runtime.device import Device

CPU = Device("cpu")
VECTORS = (1, 2, 3)


@pytest.fixture(scope="session")
def tiny_cosmo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`dlscale data synth-cosmo --preset tiny`: train 48^3, valid 40^3."""
    return generate(tmp_path_factory.mktemp("data") / "cosmo_tiny", "tiny")


def periodic_gradient(field: np.ndarray) -> np.ndarray:
    """Central differences along x, y, z of a (X, Y, Z) field on a periodic grid."""
    return np.stack([(np.roll(field, -1, axis) - np.roll(field, 1, axis)) / 2 for axis in range(3)])


def gradient_volume(side: int = 8, seed: int = 0) -> np.ndarray:
    """(4, L, L, L): a random scalar field and its gradient (the velocity field of a potential)."""
    potential = np.random.default_rng(seed).standard_normal((side, side, side)).astype(np.float32)
    return np.concatenate([potential[None], periodic_gradient(potential)]).astype(np.float32)


# --- the rotation group ----------------------------------------------------------------------------------------


def test_the_24_orientations_are_the_distinct_proper_rotations_of_the_cube():
    matrices = [o.matrix for o in ORIENTATIONS]
    assert NUM_ORIENTATIONS == 24 == len({m.tobytes() for m in matrices})
    assert all(round(np.linalg.det(m)) == 1 for m in matrices)  # no reflection among them
    assert ORIENTATIONS[0].is_identity
    # Every signed permutation matrix of determinant +1 is there: 6 permutations x 8 flips, half of them.
    signed = [
        np.diag(s)[list(p)]
        for p in itertools.permutations(range(3))
        for s in itertools.product((1, -1), repeat=3)
    ]
    assert sum(round(np.linalg.det(m)) == 1 for m in signed) == 24


def test_the_orientations_form_a_group_and_compose_as_applied():
    volume = np.random.default_rng(1).standard_normal((2, 3, 4, 5)).astype(np.float32)  # no symmetric shape
    for first, second in itertools.product(range(NUM_ORIENTATIONS), repeat=2):
        product = compose(first, second)  # closed: raises if the product were not one of the 24
        twice = orient_array(orient_array(volume, first), second)
        assert np.array_equal(twice, orient_array(volume, product)), (first, second)
    for index in range(NUM_ORIENTATIONS):
        assert compose(index, inverse(index)) == 0
        assert np.array_equal(orient_array(orient_array(volume, index), inverse(index)), volume)


def test_vector_channels_stay_the_gradient_of_the_rotated_scalar_only_when_rotated():
    volume = gradient_volume()
    for index in range(NUM_ORIENTATIONS):
        rotated = orient_array(volume, index, vector_channels=VECTORS)
        assert np.array_equal(rotated[1:], periodic_gradient(rotated[0])), index
        voxels_only = orient_array(volume, index)  # the tutorial's way: channels keep their meaning
        assert np.array_equal(voxels_only[1:], periodic_gradient(voxels_only[0])) == (index == 0), index


def test_torch_rotations_are_bitwise_the_numpy_ones():
    volume = gradient_volume(side=6)
    batch = torch.from_numpy(np.stack([volume, 2 * volume]))
    indices = list(range(NUM_ORIENTATIONS))
    for index in indices:
        expected = orient_array(volume, index, VECTORS)
        assert torch.equal(
            orient_tensor(torch.from_numpy(volume), index, VECTORS), torch.from_numpy(expected)
        )
    rotated = orient_batch(batch, [5, 17], VECTORS)
    assert torch.equal(rotated[1], torch.from_numpy(orient_array(2 * volume, 17, VECTORS)))
    assert torch.equal(batch[0], torch.from_numpy(volume))  # the input is left alone
    with pytest.raises(ValueError, match="3 channel indices"):
        orient_array(volume, 1, (1, 2))


# --- the reader: samples, reproducibility ----------------------------------------------------------------------


def write_pair(path: Path, nbody: np.ndarray, hydro: np.ndarray) -> Path:
    with h5py.File(path, "w") as handle:
        handle["Nbody"], handle["Hydro"] = nbody, hydro
    return path


def data_config(root: Path, **changes) -> CosmoDataConfig:
    settings = dict(root=str(root), train_path="train.h5", val_path="valid.h5", data_size=32, Nsamples=16)
    settings.update(Nsamples_val=8, crop_seed=7)
    settings.update(changes)
    return CosmoDataConfig(**settings)


@pytest.fixture(scope="module")
def related_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Targets computed voxel by voxel from the inputs, velocities the gradient of the density."""
    root = tmp_path_factory.mktemp("related")
    for name, side in (("train.h5", 40), ("valid.h5", 36)):
        nbody = gradient_volume(side, seed=side)
        hydro = np.stack([nbody[0], nbody[0] * nbody[0], nbody[1], nbody[2], nbody[3]])
        write_pair(root / name, nbody, hydro)
    return root


@pytest.mark.parametrize("read_mode", ["lowmem", "inmem"])
@pytest.mark.parametrize("rotate_vectors", [True, False])
def test_input_and_target_get_the_same_crop_and_rotation(related_files, read_mode, rotate_vectors):
    dataset = CosmoCropDataset(
        data_config(related_files, read_mode=read_mode, rotate_vectors=rotate_vectors), "train"
    )
    interior = np.s_[:, 1:-1, 1:-1, 1:-1]
    rotated_any = False
    for key in [EpochIndex(epoch, i) for epoch in (0, 3) for i in range(8)]:
        inputs, targets = (t.numpy() for t in dataset[key])
        assert inputs.shape == (4, 32, 32, 32) and targets.shape == (5, 32, 32, 32)
        assert np.array_equal(targets[0], inputs[0]) and np.array_equal(targets[1], inputs[0] * inputs[0])
        assert np.array_equal(targets[2:], inputs[1:])  # same voxels, same treatment of the vectors
        is_gradient = np.array_equal(inputs[1:][interior], periodic_gradient(inputs[0])[interior])
        identity = dataset.planner.plan(key)[1] == 0
        assert is_gradient == (rotate_vectors or identity), key
        rotated_any |= not identity
    assert rotated_any


def test_crops_are_a_function_of_seed_epoch_and_index(related_files):
    cfg = data_config(related_files)
    train, again = CosmoCropDataset(cfg, "train"), CosmoCropDataset(cfg, "train")
    key = EpochIndex(2, 5)
    assert all(torch.equal(a, b) for a, b in zip(train[key], again[key], strict=True))
    assert train.planner.plan(key) != train.planner.plan(EpochIndex(3, 5))  # fresh crops each epoch
    assert train.planner.plan(key) != train.planner.plan(EpochIndex(2, 6))
    other_seed = CosmoCropDataset(data_config(related_files, crop_seed=8), "train")
    assert train.planner.plan(key) != other_seed.planner.plan(key)
    assert train.planner.plan(5) == train.planner.plan(EpochIndex(0, 5))  # a plain index is epoch 0

    valid = CosmoCropDataset(cfg, "valid")  # validation: the same crops every epoch
    assert (
        valid.planner.plan(EpochIndex(0, 3)) == valid.planner.plan(EpochIndex(9, 3)) == valid.planner.plan(3)
    )

    plans = [train.planner.plan(EpochIndex(0, i)) for i in range(600)]
    corners = np.array([corner for corner, _ in plans])
    assert corners.min() == 0 and corners.max() == 40 - 32  # uniform over [0, L - data_size], both ends
    assert {orientation for _, orientation in plans} == set(range(NUM_ORIENTATIONS))
    with pytest.raises(IndexError):
        train[EpochIndex(0, 16)]


def test_worker_processes_read_the_same_batches(related_files):
    dataset = CosmoCropDataset(data_config(related_files), "train")
    sampler = TrainingSampler(len(dataset), 4, seed=3)
    sampler.set_epoch(1)
    batches = {}
    for workers in (0, 2):
        loader = build_batch_source(dataset, LoaderConfig(num_data_workers=workers), 4, sampler, CPU, seed=0)
        batches[workers] = [tuple(batch) for batch in loader]
    for (a_in, a_tar), (b_in, b_tar) in zip(batches[0], batches[2], strict=True):
        assert torch.equal(a_in, b_in) and torch.equal(a_tar, b_tar)


# --- the gpu pipeline yields exactly the pytorch loader's batches ----------------------------------------------


@pytest.mark.parametrize("read_mode", ["lowmem", "inmem"])
def test_gpu_pipeline_crops_and_rotates_on_the_device_like_the_pytorch_loader(tiny_cosmo, read_mode):
    cfg = data_config(tiny_cosmo, read_mode=read_mode, Nsamples=24, Nsamples_val=7)
    for split in ("train", "valid"):
        dataset = CosmoCropDataset(cfg, split)
        if split == "train":  # rank 1 of 2, global batch 8: 3 steps of 4 per epoch; epoch 2 from step 1
            sampler = TrainingSampler(len(dataset), 8, num_shards=2, shard_id=1, seed=5)
            sampler.set_epoch(2, start_step=1)
        else:
            sampler = EvaluationSampler(len(dataset))  # 7 samples: a short last batch
        expected = [tuple(batch) for batch in build_batch_source(dataset, LoaderConfig(), 4, sampler, CPU, 0)]
        gpu_cfg = LoaderConfig(data_loader_config="gpu", num_data_workers=2, prefetch_depth=2)
        pipeline = build_batch_source(dataset, gpu_cfg, 4, sampler, CPU, 0)
        assert isinstance(pipeline, GpuPipeline) and pipeline.normalizes_on_device
        got = list(pipeline)
        assert [len(b[0]) for b in got] == [len(b[0]) for b in expected] and len(got) >= 2
        for (want_in, want_tar), (got_in, got_tar) in zip(expected, got, strict=True):
            assert torch.equal(got_in, want_in) and torch.equal(got_tar, want_tar), (split, read_mode)


def test_inmem_gpu_pipeline_reads_nothing_on_the_host(tiny_cosmo):
    dataset = CosmoCropDataset(data_config(tiny_cosmo, read_mode="inmem"), "train")
    raw, transform = dataset.device_normalization()
    assert [t.numel() for t in raw[EpochIndex(0, 1)]] == [0, 0]  # placeholders; the volumes move once
    on_device = transform.to(torch.device("cpu"))
    keys = [EpochIndex(4, 0), EpochIndex(4, 1)]
    inputs, targets = on_device(torch.empty(2, 0), torch.empty(2, 0), keys=keys)
    for position, key in enumerate(keys):
        expected_inputs, expected_targets = dataset[key]
        assert torch.equal(inputs[position], expected_inputs) and torch.equal(
            targets[position], expected_targets
        )


# --- bad files and configs -------------------------------------------------------------------------------------


def cube(channels: int, side: int) -> np.ndarray:
    return np.zeros((channels, side, side, side), dtype=np.float32)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: write_pair(p, cube(4, 40), cube(5, 36)), "'Nbody' is 40\\^3 but 'Hydro' is 36\\^3"),
        (
            lambda p: write_pair(p, cube(4, 40), np.zeros((5, 40, 40, 36), np.float32)),
            "expected \\(channels, L, L, L\\)",
        ),
        (lambda p: write_pair(p, cube(3, 40), cube(5, 40)), "'Nbody' has 3 channels, the config needs 4"),
        (lambda p: write_pair(p, cube(4, 24), cube(5, 24)), "smaller than the 32\\^3 crops"),
        (lambda p: write_pair(p, cube(4, 40).astype(np.int32), cube(5, 40)), "expected floating point"),
    ],
    ids=["mismatched-sides", "not-a-cube", "few-channels", "smaller-than-a-crop", "integer"],
)
def test_mismatched_files_are_refused_naming_them(tmp_path, make, message):
    make(tmp_path / "train.h5")
    with pytest.raises(DataError, match=message) as caught:
        CosmoCropDataset(data_config(tmp_path), "train")
    assert str(tmp_path / "train.h5") in str(caught.value)


def test_missing_files_datasets_and_wrong_box_sizes_are_refused(tmp_path):
    with pytest.raises(DataError, match="train file does not exist.*synth-cosmo"):
        CosmoCropDataset(data_config(tmp_path), "train")
    with h5py.File(tmp_path / "train.h5", "w") as handle:
        handle["Nbody"] = cube(4, 40)
    with pytest.raises(DataError, match=r"train.h5: no dataset 'Hydro' \(the file has \['Nbody'\]\)"):
        CosmoCropDataset(data_config(tmp_path), "train")
    write_pair(tmp_path / "valid.h5", cube(4, 36), cube(5, 36))
    with pytest.raises(DataError, match="valid.h5: volumes are 36\\^3, but data.box_size says 40 for valid"):
        CosmoCropDataset(data_config(tmp_path, box_size=[40, 40]), "valid")


def test_a_truncated_file_is_refused_naming_it(tiny_cosmo, tmp_path):
    data = (tiny_cosmo / "train.h5").read_bytes()
    (tmp_path / "train.h5").write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(DataError, match="truncated") as caught:
        CosmoCropDataset(data_config(tmp_path), "train")
    assert str(tmp_path / "train.h5") in str(caught.value)


def test_config_checks_name_the_key():
    with pytest.raises(
        InvalidValue, match="target_vector_channels: expected 3 distinct channel indices.* below 2"
    ):
        CosmoDataConfig(N_out_channels=2)
    assert CosmoDataConfig(N_out_channels=1, target_vector_channels=[]).target_vector_channels == []
    with pytest.raises(InvalidValue, match="box_size"):
        CosmoDataConfig(box_size=[1024])


# --- the generator ---------------------------------------------------------------------------------------------


def test_synth_cosmo_writes_the_tutorial_layout_quickly_and_only_once(tmp_path):
    started = time.perf_counter()
    out = generate(tmp_path / "cosmo", "tiny")
    assert time.perf_counter() - started < 1.0
    for name, side in (("train.h5", 48), ("valid.h5", 40)):
        with h5py.File(out / name, "r") as handle:
            nbody, hydro = handle["Nbody"][:], handle["Hydro"][:]
        assert nbody.shape == (4, side, side, side) and hydro.shape == (5, side, side, side)
        assert nbody.dtype == hydro.dtype == np.float32
        assert np.abs(nbody).max() <= 1 and np.abs(hydro).max() <= 1  # the range of the model's tanh
        assert 0.15 < nbody.std() < 0.35 and 0.1 < np.abs(hydro).mean() < 0.5  # fields, not noise or zeros
    stamp = (out / MANIFEST).stat().st_mtime_ns
    assert main(["data", "synth-cosmo", "--out", str(out), "--preset", "tiny", "--if-missing"]) == 0
    assert (out / MANIFEST).stat().st_mtime_ns == stamp  # already there: nothing written
    seeded = generate(tmp_path / "seeded", "tiny", seed=1)
    with h5py.File(seeded / "train.h5", "r") as handle, h5py.File(out / "train.h5", "r") as original:
        assert not np.array_equal(handle["Nbody"][0], original["Nbody"][0])
    with pytest.raises(ConfigError, match="unknown preset 'huge'; choose one of tiny, demo, full"):
        generate(tmp_path / "x", "huge")
