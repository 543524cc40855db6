"""ERA5Dataset and ERA5DataConfig on tiny HDF5 files whose values encode (file, t, c, h, w)."""

from __future__ import annotations

import logging
import os
import pickle
import shlex
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from dlscale.data.era5 import dataset as era5_module
from dlscale.data.era5.config import ERA5DataConfig
from dlscale.data.era5.dataset import ERA5_CHANNELS, ERA5Dataset
from dlscale.data.era5.layout import missing_data_hint, scan_split
from dlscale.errors import DataError, InvalidValue

YEARS = ("1990", "1991", "1992")
STEPS = (5, 7, 4)  # different T per file, as with leap and partial years
C, H, W = 4, 6, 10

# Mixed-radix code: every value is an integer < 2**24, so float32 holds it exactly.
_RADIX_T, _RADIX_C, _RADIX_H, _RADIX_W = 10, 32, 8, 16


def encode(f, t, c, h, w):
    return (((f * _RADIX_T + t) * _RADIX_C + c) * _RADIX_H + h) * _RADIX_W + w


def decode_file_time(value: float) -> tuple[int, int]:
    """(file, t) of a value whose c = h = w = 0."""
    return divmod(int(value) // (_RADIX_C * _RADIX_H * _RADIX_W), _RADIX_T)


def expected_field(f: int, t: int, channels: int = C, h: int = H, w: int = W) -> np.ndarray:
    c_idx, h_idx, w_idx = np.meshgrid(np.arange(channels), np.arange(h), np.arange(w), indexing="ij")
    return encode(f, t, c_idx, h_idx, w_idx).astype(np.float32)


def write_year(
    path: Path, f: int, steps: int, channels: int = C, h: int = H, w: int = W, **dataset_kw
) -> None:
    data = np.stack([expected_field(f, t, channels, h, w) for t in range(steps)])
    with h5py.File(path, "w") as out:
        out.create_dataset("fields", data=data, **dataset_kw)


def write_split(
    root: Path, name: str = "train", steps=STEPS, channels: int = C, h: int = H, w: int = W
) -> Path:
    directory = root / name
    directory.mkdir(parents=True)
    # Written in reverse name order, so a dataset that forgot to sort would see the wrong order.
    for f in reversed(range(len(steps))):
        write_year(directory / f"{YEARS[f]}.h5", f, steps[f], channels, h, w)
    return directory


def write_stats(root: Path, means, stds) -> None:
    (root / "stats").mkdir(exist_ok=True)
    np.save(root / "stats" / "global_means.npy", np.asarray(means, dtype=np.float32).reshape(1, -1, 1, 1))
    np.save(root / "stats" / "global_stds.npy", np.asarray(stds, dtype=np.float32).reshape(1, -1, 1, 1))


def make_cfg(root: Path, **overrides) -> ERA5DataConfig:
    values = {"root": str(root), "img_size": (H, W), "n_in_channels": C, "n_out_channels": C}
    values.update(overrides)
    return ERA5DataConfig(**values)


@pytest.fixture
def data_root(tmp_path: Path) -> Path:
    write_split(tmp_path, "train")
    write_stats(tmp_path, means=np.zeros(C), stds=np.ones(C))
    return tmp_path


# ---- indexing -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", [1, 2])
def test_every_input_time_drawn_once_in_file_then_time_order(data_root, dt):
    ds = ERA5Dataset(make_cfg(data_root, dt=dt), "train", normalize=False)
    expected_pairs = [(f, t) for f in range(len(STEPS)) for t in range(STEPS[f] - dt)]

    assert len(ds) == sum(steps - dt for steps in STEPS)
    assert ds.files == sorted(ds.files) == [data_root / "train" / f"{year}.h5" for year in YEARS]
    assert ds.samples_per_file == [steps - dt for steps in STEPS]
    drawn = []
    for i in range(len(ds)):
        inp, tar = ds[i]
        f, t = decode_file_time(inp[0, 0, 0].item())
        assert decode_file_time(tar[0, 0, 0].item()) == (f, t + dt)
        assert ds.location(i) == (ds.files[f], t)
        drawn.append((f, t))
    assert drawn == expected_pairs


def test_sample_values_shapes_and_dtype(data_root):
    ds = ERA5Dataset(make_cfg(data_root, dt=2), "train", normalize=False)
    file_path, t = ds.location(len(ds) - 1)
    f = ds.files.index(file_path)
    inp, tar = ds[len(ds) - 1]
    for tensor in (inp, tar):
        assert tensor.dtype == torch.float32 and tensor.is_contiguous() and tensor.shape == (C, H, W)
    np.testing.assert_array_equal(inp.numpy(), expected_field(f, t))
    np.testing.assert_array_equal(tar.numpy(), expected_field(f, t + 2))


def test_out_of_range_index_raises_index_error(data_root):
    ds = ERA5Dataset(make_cfg(data_root), "train")
    ds[len(ds) - 1]
    for index in (-1, -len(ds), len(ds), len(ds) + 50):
        with pytest.raises(IndexError):
            ds[index]
        with pytest.raises(IndexError):
            ds.location(index)


# ---- crop and channels ----------------------------------------------------------------------------------


def test_top_left_crop(data_root):
    ds = ERA5Dataset(make_cfg(data_root, img_size=(4, 7)), "train", normalize=False)
    inp, tar = ds[0]
    assert inp.shape == tar.shape == (C, 4, 7)
    np.testing.assert_array_equal(inp.numpy(), expected_field(0, 0)[:, :4, :7])
    np.testing.assert_array_equal(tar.numpy(), expected_field(0, 1)[:, :4, :7])


def test_extra_channels_are_sliced_and_target_has_n_out(tmp_path):
    write_split(tmp_path, "train", channels=21)
    write_stats(tmp_path, means=np.arange(21), stds=np.arange(1, 22))
    cfg = make_cfg(tmp_path, n_in_channels=20, n_out_channels=3)

    raw = ERA5Dataset(cfg, "train", normalize=False)
    inp, tar = raw[0]
    assert inp.shape == (20, H, W) and tar.shape == (3, H, W)
    np.testing.assert_array_equal(inp.numpy(), expected_field(0, 0, 21)[:20])
    np.testing.assert_array_equal(tar.numpy(), expected_field(0, 1, 21)[:3])
    assert raw.channel_names == ERA5_CHANNELS
    assert raw.means.shape == raw.stds.shape == (20,)

    inp_n, tar_n = ERA5Dataset(cfg, "train")[0]
    means, stds = np.arange(21, dtype=np.float32), np.arange(1, 22, dtype=np.float32)
    np.testing.assert_allclose(inp_n.numpy(), (inp.numpy() - means[:20, None, None]) / stds[:20, None, None])
    np.testing.assert_allclose(tar_n.numpy(), (tar.numpy() - means[:3, None, None]) / stds[:3, None, None])


def test_channel_names_from_attribute_or_generated(tmp_path):
    write_split(tmp_path, "train", channels=21)
    write_stats(tmp_path, means=np.zeros(21), stds=np.ones(21))
    assert ERA5Dataset(make_cfg(tmp_path, n_in_channels=21), "train").channel_names == tuple(
        f"ch{i}" for i in range(21)
    )
    names = [f"var{i}" for i in range(21)]
    for path in (tmp_path / "train").glob("*.h5"):
        with h5py.File(path, "a") as f:
            f["fields"].attrs["channels"] = names
    assert ERA5Dataset(make_cfg(tmp_path, n_in_channels=5), "train").channel_names == tuple(names[:5])


# ---- normalization, limits, latitudes -------------------------------------------------------------------


def test_normalization_uses_stats_and_can_be_switched_off(tmp_path):
    write_split(tmp_path, "train")
    means, stds = np.array([1.0, -2.0, 300.0, 5.0]), np.array([2.0, 0.5, 10.0, 4.0])
    write_stats(tmp_path, means, stds)
    cfg = make_cfg(tmp_path)
    normed = ERA5Dataset(cfg, "train")
    raw = ERA5Dataset(cfg, "train", normalize=False)
    np.testing.assert_array_equal(normed.means, means.astype(np.float32))
    np.testing.assert_array_equal(normed.stds, stds.astype(np.float32))
    for index in (0, 7):
        for got, plain in zip(normed[index], raw[index], strict=True):
            expected = (plain.numpy() - means[:, None, None]) / stds[:, None, None]
            np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6)
            assert got.dtype == torch.float32
    path, t = raw.location(7)
    np.testing.assert_array_equal(raw[7][0].numpy(), expected_field(raw.files.index(path), t))


# ---- batch reads ------------------------------------------------------------------------------------------


def normalized_in_numpy(field: np.ndarray, means: np.ndarray, stds: np.ndarray) -> np.ndarray:
    """The reference tutorial's per-sample normalization, in float32 numpy."""
    channels = len(field)
    means, stds = means.astype(np.float32)[:channels], stds.astype(np.float32)[:channels]
    return (field - means[:, None, None]) / stds[:, None, None]


@pytest.mark.parametrize("read_method", ["hdf5", "mmap"])
@pytest.mark.parametrize("n_out", [C, 2])  # same channels: one HDF5 read per sample; else one per state
@pytest.mark.parametrize("dt", [1, 2])
def test_read_batch_is_the_samples_stacked_and_normalized_as_numpy_does_bitwise(
    tmp_path, n_out, dt, read_method
):
    write_split(tmp_path, "train")
    means, stds = np.array([1.5, -2.25, 300.0, 5.0]), np.array([2.0, 0.3, 10.0, 7.0])
    write_stats(tmp_path, means, stds)
    cfg = make_cfg(tmp_path, img_size=(4, 7), n_out_channels=n_out, dt=dt, read_method=read_method)
    ds = ERA5Dataset(cfg, "train")
    assert ds.read_method == read_method
    # Out of order, a repeat, and samples of all three files (the first and last of each file included).
    last_of_first_file = ds.samples_per_file[0] - 1
    indices = [len(ds) - 1, 0, last_of_first_file, last_of_first_file + 1, 3, 3, len(ds) - 2]
    inputs, targets = ds.read_batch(indices)
    assert inputs.shape == (len(indices), C, 4, 7) and targets.shape == (len(indices), n_out, 4, 7)
    for tensor in (inputs, targets):
        assert tensor.dtype == torch.float32 and tensor.is_contiguous()
    for row, index in enumerate(indices):
        path, t = ds.location(index)
        f = ds.files.index(path)
        want_inputs = expected_field(f, t)[:, :4, :7]
        want_targets = expected_field(f, t + dt)[:n_out, :4, :7]
        np.testing.assert_array_equal(inputs[row].numpy(), normalized_in_numpy(want_inputs, means, stds))
        np.testing.assert_array_equal(targets[row].numpy(), normalized_in_numpy(want_targets, means, stds))
        sample = ds[index]
        assert torch.equal(sample[0], inputs[row]) and torch.equal(sample[1], targets[row])


@pytest.mark.parametrize("read_method", ["hdf5", "mmap"])
@pytest.mark.parametrize("normalize", [True, False])
def test_read_states_reads_one_state_each_any_time_index_bitwise(
    tmp_path, read_method, normalize, monkeypatch
):
    """A rollout's truth and a multi-step sample's leads: one state per place (the last dt of a file too), the
    values read_batch gives its inputs, with one HDF5 read per state instead of an input-and-target pair."""
    write_split(tmp_path, "train")
    means, stds = np.array([1.5, -2.25, 300.0, 5.0]), np.array([2.0, 0.3, 10.0, 7.0])
    write_stats(tmp_path, means, stds)
    ds = ERA5Dataset(
        make_cfg(tmp_path, img_size=(4, 7), dt=2, read_method=read_method), "train", normalize=normalize
    )
    last = STEPS[0] - 1  # beyond the last sample's input: only a target reaches it
    places = [(1, 0), (0, last), (2, STEPS[2] - 2), (0, 3), (0, 3)]
    CountingSlabReader.reads = 0
    monkeypatch.setattr(era5_module, "SlabReader", CountingSlabReader)
    states = ds.read_states(places)
    assert states.shape == (len(places), C, 4, 7) and states.dtype == torch.float32
    if read_method == "hdf5":
        assert CountingSlabReader.reads == len(places)
    for row, (f, t) in enumerate(places):
        want = expected_field(f, t)[:, :4, :7]
        if normalize:
            want = normalized_in_numpy(want, means, stds)
        np.testing.assert_array_equal(states[row].numpy(), want)
    with pytest.raises(DataError, match="time index"):
        ds.read_states([(0, STEPS[0])])


class CountingSlabReader(era5_module.SlabReader):
    reads = 0

    def read(self, *args):
        type(self).reads += 1
        super().read(*args)


@pytest.mark.parametrize(
    "layout, reads_per_sample",
    [("halves of one buffer", 1), ("separate tensors", 2), ("leading rows of a larger buffer's halves", 2)],
)
def test_read_batch_fills_the_tensors_it_is_given(data_root, monkeypatch, layout, reads_per_sample):
    monkeypatch.setattr(era5_module, "SlabReader", CountingSlabReader)
    monkeypatch.setattr(CountingSlabReader, "reads", 0)
    ds = ERA5Dataset(make_cfg(data_root, read_method="hdf5"), "train")
    indices = [5, 0, 9, 2]
    if layout == "halves of one buffer":
        both = torch.full((2, 4, C, H, W), float("nan"))
        out = (both[0], both[1])
    elif layout == "separate tensors":
        out = (torch.full((4, C, H, W), float("nan")), torch.full((4, C, H, W), float("nan")))
    else:  # a ring slot's rows for a short last batch: targets do not follow inputs, so one read per state
        both = torch.full((2, 6, C, H, W), float("nan"))
        out = (both[0, :4], both[1, :4])
    got = ds.read_batch(indices, out=out)
    assert got[0] is out[0] and got[1] is out[1]
    assert CountingSlabReader.reads == reads_per_sample * len(indices)
    fresh = ds.read_batch(indices)
    assert torch.equal(got[0], fresh[0]) and torch.equal(got[1], fresh[1])


@pytest.mark.parametrize("read_method", ["hdf5", "mmap"])
def test_read_batch_fills_ring_rows_with_either_method(data_root, read_method):
    ds = ERA5Dataset(make_cfg(data_root, read_method=read_method), "train")
    both = torch.full((2, 6, C, H, W), float("nan"))
    got = ds.read_batch([5, 0, 9], out=(both[0, :3], both[1, :3]))
    expected = ds.read_batch([5, 0, 9])
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert both[:, 3:].isnan().all()  # rows past the batch untouched


@pytest.mark.parametrize(
    "out, message",
    [
        (
            (torch.empty(3, C, H, W), torch.empty(2, C, H, W)),
            r"out targets .* shape \(3, 4, 6, 10\), got \(2, 4, 6, 10\)",
        ),
        (
            (torch.empty(3, C, H, W, dtype=torch.float64), torch.empty(3, C, H, W)),
            r"out inputs .*torch\.float64",
        ),
        (
            (torch.empty(3, C, W, H).transpose(2, 3), torch.empty(3, C, H, W)),
            "out inputs must be a contiguous float32 CPU tensor",
        ),
        ((torch.empty(3, C, H, W), torch.empty(3, C, H, W, device="meta")), r"out targets .* on meta"),
    ],
)
def test_read_batch_refuses_tensors_it_cannot_fill(data_root, out, message):
    ds = ERA5Dataset(make_cfg(data_root), "train")
    with pytest.raises(ValueError, match=message):
        ds.read_batch([0, 1, 2], out=out)


def test_limit_keeps_first_samples(data_root):
    full = ERA5Dataset(make_cfg(data_root), "train")
    limited = ERA5Dataset(make_cfg(data_root, limit_nsamples=6), "train")
    assert len(limited) == 6 < len(full)
    for i in range(6):
        assert limited.location(i) == full.location(i)
        torch.testing.assert_close(limited[i], full[i], rtol=0, atol=0)
    with pytest.raises(IndexError):
        limited[6]


def test_limit_larger_than_data_keeps_all_and_warns(data_root, caplog):
    with caplog.at_level(logging.WARNING, logger="dlscale.data.era5.dataset"):
        ds = ERA5Dataset(make_cfg(data_root, limit_nsamples=1000), "train")
    assert len(ds) == sum(steps - 1 for steps in STEPS)
    assert "limit_nsamples=1000" in caplog.text


def test_each_split_uses_its_own_directory_and_limit(data_root):
    write_split(data_root, "valid", steps=(3, 4))
    write_split(data_root, "test", steps=(6,))
    cfg = make_cfg(data_root, limit_nsamples=1, limit_nsamples_val=2)
    assert len(ERA5Dataset(cfg, "train")) == 1
    assert len(ERA5Dataset(cfg, "valid")) == 2
    test = ERA5Dataset(cfg, "test")
    assert len(test) == 5 and test.files == [data_root / "test" / "1990.h5"]
    with pytest.raises(ValueError, match="split"):
        ERA5Dataset(cfg, "validation")


def test_latitudes_of_361_row_grid_cropped_to_360(tmp_path):
    write_split(tmp_path, "train", steps=(2,), channels=1, h=361, w=4)
    write_stats(tmp_path, means=[0.0], stds=[1.0])
    cfg = make_cfg(tmp_path, img_size=(360, 4), n_in_channels=1, n_out_channels=1)
    lat = ERA5Dataset(cfg, "train").latitudes
    assert lat.dtype == np.float64 and lat.shape == (360,)
    assert lat[0] == 90.0
    np.testing.assert_allclose(np.diff(lat), -0.5)
    assert lat[-1] == pytest.approx(-89.5)


def test_a_split_whose_files_hold_coordinates_reads_them_for_its_crop(data_root):
    latitudes, longitudes = np.linspace(80, -80, H), 10.0 + 36.0 * np.arange(W)
    for path in sorted((data_root / "train").glob("*.h5")):
        with h5py.File(path, "a") as handle:
            handle.create_dataset("latitude", data=latitudes)
            handle.create_dataset("longitude", data=longitudes)
    dataset = ERA5Dataset(make_cfg(data_root, img_size=(H - 2, W - 3)), "train")
    np.testing.assert_array_equal(dataset.latitudes, latitudes[: H - 2])
    np.testing.assert_array_equal(dataset.longitudes, longitudes[: W - 3])
    np.testing.assert_array_equal(dataset.grid.latitudes, latitudes)  # the whole file grid


def test_a_split_whose_files_disagree_on_their_grid_is_refused(data_root):
    for index, path in enumerate(sorted((data_root / "train").glob("*.h5"))):
        with h5py.File(path, "a") as handle:
            handle.create_dataset("latitude", data=np.linspace(80, -80, H) - (index == 2))
    with pytest.raises(DataError, match=r"1992.h5: its latitudes .* differ from those of 1990.h5"):
        ERA5Dataset(make_cfg(data_root), "train")


def test_repr_names_split_size_and_crop(data_root):
    text = repr(ERA5Dataset(make_cfg(data_root, img_size=(4, 8)), "train"))
    assert "'train'" in text and "files=3" in text and f"samples={sum(STEPS) - 3}" in text and "4x8" in text


# ---- errors: split directory and files ------------------------------------------------------------------


def test_missing_split_directory_names_key_and_root(data_root):
    with pytest.raises(DataError, match="valid_data_path") as info:
        ERA5Dataset(make_cfg(data_root), "valid")
    assert str(data_root / "valid") in str(info.value) and "root=" in str(info.value)


SHIPPED_CONFIGS = Path(__file__).resolve().parents[3] / "configs" / "vit_era5.yaml"


def missing_split_message(cfg: ERA5DataConfig) -> str:
    with pytest.raises(DataError) as info:
        scan_split(cfg, "train_data_path")
    return str(info.value)


@pytest.mark.parametrize(("name", "preset"), [("tiny", "tiny"), ("demo", "demo")])
def test_missing_synthetic_data_hint_is_the_command_that_generates_it(tmp_path, monkeypatch, name, preset):
    from dlscale.cli import main
    from dlscale.config import load_run_config

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DLSCALE_ERA5_DATA", str(tmp_path / "real"))  # set, but these configs do not read it
    cfg = load_run_config(SHIPPED_CONFIGS, name).data
    message = missing_split_message(cfg)
    command = f"dlscale data synth-era5 --out data/era5_{preset} --preset {preset}"
    assert f"`{command}`" in message and "--set data.root=PATH" in message
    assert "DLSCALE_ERA5_DATA" not in message
    if preset == "tiny":  # pasted as it is, the command makes the data the config reads (a second or so)
        assert main(shlex.split(command)[1:]) == 0
        assert len(scan_split(cfg, "train_data_path").files) > 0


def test_missing_data_of_another_root_suggests_a_generic_preset_or_data_root(tmp_path, monkeypatch):
    monkeypatch.delenv("DLSCALE_ERA5_DATA", raising=False)
    message = missing_split_message(make_cfg(tmp_path / "my data"))
    assert f"`dlscale data synth-era5 --out '{tmp_path / 'my data'}' --preset demo`" in message
    assert "--set data.root=PATH" in message and "DLSCALE_ERA5_DATA" not in message


def test_missing_data_of_a_root_from_the_environment_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("DLSCALE_ERA5_DATA", str(tmp_path / "sc23_data"))
    from dlscale.config import load_run_config

    cfg = load_run_config(SHIPPED_CONFIGS, "base").data
    message = missing_split_message(cfg)
    assert f"DLSCALE_ERA5_DATA={tmp_path / 'sc23_data'}" in message
    assert "export DLSCALE_ERA5_DATA=PATH" in message and "--set data.root=PATH" in message
    assert "synth-era5" not in message
    # Unset, the shipped root is the variable's default, /data.
    monkeypatch.delenv("DLSCALE_ERA5_DATA")
    hint = missing_data_hint(load_run_config(SHIPPED_CONFIGS, "base").data, "train_data_path")
    assert "/data, the default when DLSCALE_ERA5_DATA is not set" in hint and "synth-era5" not in hint


def test_missing_split_outside_the_root_names_its_own_key(tmp_path):
    cfg = make_cfg(tmp_path, valid_data_path=str(tmp_path.parent / "elsewhere" / "valid"))
    with pytest.raises(DataError, match=r"--set data\.valid_data_path=PATH") as info:
        scan_split(cfg, "valid_data_path")
    assert "synth-era5" not in str(info.value) and "data.root" not in str(info.value)


def test_split_directory_without_h5_files(data_root):
    (data_root / "valid").mkdir()
    (data_root / "valid" / "notes.txt").write_text("no data here")
    with pytest.raises(DataError, match=r"no \*\.h5 file"):
        ERA5Dataset(make_cfg(data_root), "valid")


def _replace_1991(data_root: Path, writer) -> None:
    path = data_root / "train" / "1991.h5"
    path.unlink()
    writer(path)


def _write_h5(path: Path, key: str, data: np.ndarray) -> None:
    with h5py.File(path, "w") as f:
        f.create_dataset(key, data=data)


@pytest.mark.parametrize(
    ("writer", "message"),
    [
        (lambda p: p.write_bytes(b"this is not an HDF5 file" * 10), "unreadable or truncated"),
        (lambda p: _write_h5(p, "data", np.zeros((5, C, H, W), np.float32)), r"no dataset 'fields'.*'data'"),
        (lambda p: _write_h5(p, "fields", np.zeros((5, C, H), np.float32)), "4 dimensions"),
        (lambda p: _write_h5(p, "fields", np.zeros((5, C, H, W), np.int32)), "floating-point"),
        (lambda p: _write_h5(p, "fields", np.zeros((5, C - 1, H, W), np.float32)), "n_in_channels=4"),
        (
            lambda p: _write_h5(p, "fields", np.zeros((5, C, H - 1, W), np.float32)),
            r"5 x 10.*img_size=6 x 10",
        ),
        (lambda p: _write_h5(p, "fields", np.zeros((1, C, H, W), np.float32)), "more than dt=1"),
        (
            lambda p: _write_h5(p, "fields", np.zeros((5, C + 1, H, W), np.float32)),
            r"1990\.h5 in the same split",
        ),
        (lambda p: _write_h5(p, "fields", np.zeros((5, C, H, W + 1), np.float32)), "same channels and grid"),
    ],
    ids=[
        "not-hdf5",
        "no-fields",
        "3d",
        "int-dtype",
        "few-channels",
        "small-grid",
        "too-short",
        "other-c",
        "other-w",
    ],
)
def test_bad_file_is_named_in_the_error(data_root, writer, message):
    _replace_1991(data_root, writer)
    with pytest.raises(DataError, match=message) as info:
        ERA5Dataset(make_cfg(data_root), "train")
    assert "1991.h5" in str(info.value)


def test_truncated_file_is_detected_at_construction(data_root):
    path = data_root / "train" / "1991.h5"
    path.unlink()
    write_year(path, 1, 7, chunks=None)  # contiguous: the data runs up to the end of the file
    os.truncate(path, path.stat().st_size // 2)
    with pytest.raises(DataError, match=r"1991\.h5.*truncated"):
        ERA5Dataset(make_cfg(data_root), "train")


def test_unreadable_data_in_a_file_that_opens_is_detected_at_construction(data_root):
    # External raw storage: the HDF5 file itself opens fine, only reading the data fails.
    path, raw = data_root / "train" / "1991.h5", data_root / "1991.raw"
    path.unlink()
    write_year(path, 1, 7, external=[(str(raw), 0, h5py.h5f.UNLIMITED)])
    ERA5Dataset(make_cfg(data_root), "train")  # readable while the raw file is there
    raw.unlink()
    with pytest.raises(DataError, match=r"1991\.h5.*last element"):
        ERA5Dataset(make_cfg(data_root), "train")


@pytest.mark.parametrize("read_method", ["hdf5", "mmap"])
def test_read_error_while_training_names_file_and_time(data_root, read_method):
    ds = ERA5Dataset(make_cfg(data_root, read_method=read_method), "train")
    assert ds.read_method == read_method
    index = ds.samples_per_file[0] + 2  # 1991.h5, t = 2
    ds[index]  # the file is opened (and mapped) before it shrinks
    path = data_root / "train" / "1991.h5"
    os.truncate(path, path.stat().st_size // 2)
    with pytest.raises(DataError, match=r"1991\.h5.*time index 2"):
        ds[index]


def test_no_file_left_open_after_construction(data_root):
    def open_files() -> int:
        return h5py.h5f.get_obj_count(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_FILE)

    before = open_files()
    ds = ERA5Dataset(make_cfg(data_root), "train")
    assert open_files() == before
    ds[0]
    assert open_files() == before + 1
    ds.close()
    assert open_files() == before


# ---- errors: stats --------------------------------------------------------------------------------------


def test_missing_stats_names_path_and_key(data_root):
    (data_root / "stats" / "global_stds.npy").unlink()
    with pytest.raises(DataError, match="global_stds_path") as info:
        ERA5Dataset(make_cfg(data_root), "train")
    assert str(data_root / "stats" / "global_stds.npy") in str(info.value)


@pytest.mark.parametrize(
    ("array", "found"),
    [(np.zeros((1, C), np.float32), r"\(1, 4\)"), (np.ones((1, C - 1, 1, 1), np.float32), r"\(1, 3, 1, 1\)")],
)
def test_stats_with_wrong_shape(data_root, array, found):
    np.save(data_root / "stats" / "global_means.npy", array)
    with pytest.raises(DataError, match=found) as info:
        ERA5Dataset(make_cfg(data_root), "train")
    assert "expected (1, 4, 1, 1)" in str(info.value) and "global_means.npy" in str(info.value)


def test_stats_that_are_a_symbolic_link_loop_say_so(data_root):
    path = data_root / "stats" / "global_means.npy"
    path.unlink()
    path.symlink_to(path.name)  # a link to itself
    with pytest.raises(DataError) as info:
        ERA5Dataset(make_cfg(data_root), "train")
    message = str(info.value)
    assert message.startswith(f"{path}: is a symbolic link loop (ELOOP)")
    assert "not found" not in message and "expected the stats file global_means_path" in message


@pytest.mark.parametrize(
    ("content", "found"),
    [
        (b"mean values 1 2 3 4\n", "it starts with text 'mean values 1 2 3 4'"),
        (pickle.dumps([0.0, 1.0, 2.0, 3.0]), "it is a Python pickle"),
        (b"", "it is empty"),
    ],
    ids=["text", "pickle", "empty"],
)
def test_stats_that_are_no_npy_file_say_what_they_are_and_never_suggest_unpickling(data_root, content, found):
    path = data_root / "stats" / "global_stds.npy"
    path.write_bytes(content)
    with pytest.raises(DataError) as info:
        ERA5Dataset(make_cfg(data_root), "train")
    message = str(info.value)
    assert message.startswith(
        f"{path}: is not a NumPy .npy file ({found}); expected global_stds_path, a .npy "
    )
    assert "shape (1, 4, 1, 1)" in message
    assert "allow_pickle" not in message and "pickled" not in message


def test_stats_of_python_objects_are_refused_without_unpickling(data_root):
    path = data_root / "stats" / "global_means.npy"
    np.save(path, np.array([[[[0.0]], [[1.0]], [[2.0]], [[3.0]]]], dtype=object), allow_pickle=True)
    with pytest.raises(DataError) as info:
        ERA5Dataset(make_cfg(data_root), "train")
    message = str(info.value)
    assert message.startswith(f"{path}: holds Python objects") and "shape (1, 4, 1, 1)" in message
    assert "allow_pickle" not in message


@pytest.mark.parametrize(
    ("means", "stds", "message"),
    [
        ([0, 0, 0, 0], [1, 1, 0, 1], r"global_stds.*channel 2 \(t2m\)"),
        ([0, 0, 0, 0], [1, -1, 1, 1], r"global_stds.*channel 1 \(v10\)"),
        ([0, 0, 0, np.inf], [1, 1, 1, 1], r"global_means.*channel 3 \(sp\)"),
        ([0, 0, 0, 0], [np.nan, 1, 1, 1], r"global_stds.*channel 0 \(u10\)"),
    ],
)
def test_bad_stats_value_names_the_channel(data_root, means, stds, message):
    write_stats(data_root, means, stds)
    with pytest.raises(DataError, match=message):
        ERA5Dataset(make_cfg(data_root), "train")


# ---- pickling and worker processes ----------------------------------------------------------------------


def test_pickles_with_open_handles(data_root):
    ds = ERA5Dataset(make_cfg(data_root), "train")
    first = ds[0]  # opens a handle
    clone = pickle.loads(pickle.dumps(ds))
    torch.testing.assert_close(clone[0], first, rtol=0, atol=0)
    torch.testing.assert_close(clone[len(ds) - 1], ds[len(ds) - 1], rtol=0, atol=0)


def test_forked_process_reopens_its_files(data_root, monkeypatch):
    ds = ERA5Dataset(make_cfg(data_root), "train")
    opened = []
    real_file = h5py.File

    def counting_file(*args, **kwargs):
        opened.append(args[0])
        return real_file(*args, **kwargs)

    monkeypatch.setattr(era5_module.h5py, "File", counting_file)
    ds[0]
    ds[1]
    assert len(opened) == 1
    monkeypatch.setattr(era5_module.os, "getpid", lambda: -12345)  # as if in a forked worker
    ds[2]
    assert opened == [ds.files[0], ds.files[0]]


def test_dataloader_workers_yield_the_same_tensors(data_root, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    ds = ERA5Dataset(make_cfg(data_root), "train")
    expected = [ds[i] for i in range(len(ds))]  # leaves handles open in this process before the fork
    loader = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="fork")
    inputs, targets = zip(*loader, strict=True)
    torch.testing.assert_close(torch.cat(inputs), torch.stack([e[0] for e in expected]), rtol=0, atol=0)
    torch.testing.assert_close(torch.cat(targets), torch.stack([e[1] for e in expected]), rtol=0, atol=0)


# ---- config ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"img_size": (360,)}, "img_size"),
        ({"img_size": (0, 720)}, "img_size"),
        ({"img_size": (360, 72.5)}, "img_size"),
        ({"img_size": (True, 720)}, "img_size"),
        ({"dt": 0}, "dt"),
        ({"n_in_channels": 0, "n_out_channels": 0}, "n_in_channels"),
        ({"n_out_channels": 0}, "n_out_channels"),
        ({"n_out_channels": 21}, "n_out_channels"),
        ({"limit_nsamples": 0}, "limit_nsamples"),
        ({"limit_nsamples_val": -3}, "limit_nsamples_val"),
    ],
)
def test_config_rejects_meaningless_values(overrides, field):
    with pytest.raises(InvalidValue) as info:
        ERA5DataConfig(**overrides)
    assert info.value.key == field


def test_config_defaults_are_valid():
    cfg = ERA5DataConfig()
    assert cfg.img_size == (360, 720) and cfg.n_in_channels == cfg.n_out_channels == 20
    assert cfg.path("train_data_path") == Path("/data/train")


def test_config_path_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ERA5_STATS", "/shared/stats")
    cfg = ERA5DataConfig(
        root="~/era5",
        train_data_path="years/train",
        valid_data_path="/elsewhere/valid",
        global_means_path="$ERA5_STATS/means.npy",
        inf_data_path="~/test",
    )
    assert cfg.path("root") == tmp_path / "home" / "era5"
    assert cfg.path("train_data_path") == tmp_path / "home" / "era5" / "years" / "train"
    assert cfg.path("valid_data_path") == Path("/elsewhere/valid")
    assert cfg.path("global_means_path") == Path("/shared/stats/means.npy")
    assert cfg.path("inf_data_path") == tmp_path / "home" / "test"
    with pytest.raises(ValueError, match="img_size"):
        cfg.path("img_size")
