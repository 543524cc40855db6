"""The MNIST workload's pieces: the CNN, the idx reader and its checks, the synthetic digits, the metrics."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from dlscale.config import load_run_config
from dlscale.data.mnist.config import MNISTDataConfig
from dlscale.data.mnist.dataset import MNISTDataset
from dlscale.data.mnist.synth import PRESETS, generate, glyph_segments, synth_split
from dlscale.errors import ConfigError, DataError, InvalidValue
from dlscale.models.cnn import MnistCNN
from dlscale.models.cnn_config import CNNConfig
from dlscale.models.parameters import count_parameters
from dlscale.workloads.mnist_metrics import MnistEvaluator

CONFIG_FILE = Path(__file__).resolve().parents[3] / "configs" / "cnn_mnist.yaml"
FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


@pytest.fixture(scope="module")
def tiny_mnist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `tiny` synthetic preset (768 training and 256 validation images), gzip files."""
    return generate(tmp_path_factory.mktemp("data") / "mnist_tiny", "tiny")


def plain_copy(source: Path, target: Path) -> Path:
    """The data set with every file decompressed (no .gz left)."""
    target.mkdir(parents=True)
    for name in FILES:
        (target / name).write_bytes(gzip.decompress((source / f"{name}.gz").read_bytes()))
    return target


def dataset(root: Path, split: str = "train", **changes) -> MNISTDataset:
    return MNISTDataset(MNISTDataConfig(root=str(root), **changes), split)


# ---- the model ---------------------------------------------------------------------------------------------


def test_the_cnn_has_the_workshops_parameters_and_returns_log_probabilities():
    model = MnistCNN()
    assert count_parameters(model) == 1_199_882
    assert [name for name, _ in model.named_parameters()] == [
        f"{layer}.{kind}" for layer in ("conv1", "conv2", "fc1", "fc2") for kind in ("weight", "bias")
    ]
    out = model.eval()(torch.randn(3, 1, 28, 28))
    assert out.shape == (3, 10)
    torch.testing.assert_close(out.exp().sum(dim=1), torch.ones(3))
    assert (model.dropout1.p, model.dropout2.p) == (0.25, 0.5)
    with pytest.raises(InvalidValue, match="dropout2: must be a dropout probability"):
        CNNConfig(dropout2=1.0)


# ---- reading -----------------------------------------------------------------------------------------------


def test_the_reader_returns_the_generated_images_normalized(tiny_mnist):
    train = dataset(tiny_mnist)
    images, labels = synth_split(PRESETS["tiny"].train_samples, PRESETS["tiny"].seed, 0)
    assert len(train) == 768 and len(dataset(tiny_mnist, "valid")) == 256
    assert np.array_equal(train.images, images) and np.array_equal(train.labels, labels)
    image, label = train[5]
    assert image.shape == (1, 28, 28) and image.dtype == torch.float32
    assert label.dtype == torch.int64 and int(label) == labels[5]
    expected = (images[5].astype(np.float32) / 255 - np.float32(0.1307)) / np.float32(0.3081)
    np.testing.assert_allclose(image[0].numpy(), expected, rtol=1e-6, atol=1e-6)
    limited = dataset(tiny_mnist, "valid", limit_nsamples_val=10)
    assert len(limited) == 10 and len(dataset(tiny_mnist, limit_nsamples=100)) == 100


def test_plain_and_gzip_files_read_alike_and_torchvisions_layout_is_found(tiny_mnist, tmp_path):
    plain = plain_copy(tiny_mnist, tmp_path / "plain")
    torchvision = tmp_path / "tv"
    shutil.copytree(plain, torchvision / "MNIST" / "raw")
    reference = dataset(tiny_mnist, "valid")
    for root in (plain, torchvision):
        other = dataset(root, "valid")
        assert np.array_equal(other.images, reference.images)
        assert np.array_equal(other.labels, reference.labels)
    assert dataset(torchvision, "valid").files[0] == torchvision / "MNIST" / "raw" / "t10k-images-idx3-ubyte"


def test_device_normalization_of_raw_batches_equals_the_samples(tiny_mnist):
    train = dataset(tiny_mnist)
    raw, normalizer = train.device_normalization()
    indices = [0, 7, 300]
    raw_batch = torch.stack([raw[i][0] for i in indices])
    assert raw_batch.dtype == torch.uint8
    inputs, _ = normalizer(raw_batch, torch.zeros(3))
    assert torch.equal(inputs, torch.stack([train[i][0] for i in indices]))


def write_idx(path: Path, magic: int, dims: tuple[int, ...], data: bytes) -> None:
    path.write_bytes(magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in dims) + data)


@pytest.mark.parametrize(
    ("damage", "file", "message"),
    [
        pytest.param("truncate", "train-images-idx3-ubyte", "truncated idx file", id="truncated-images"),
        pytest.param(
            "truncate-header", "train-labels-idx1-ubyte", "shorter than its 8-byte header", id="no-header"
        ),
        pytest.param("trailing", "train-labels-idx1-ubyte", "3 bytes after the", id="trailing-bytes"),
        pytest.param("magic", "train-images-idx3-ubyte", "wrong magic number 2049", id="labels-as-images"),
        pytest.param(
            "count",
            "train-labels-idx1-ubyte",
            "767 labels, but train-images-idx3-ubyte holds 768",
            id="count",
        ),
        pytest.param(
            "label", "train-labels-idx1-ubyte", "label 12 at index 3; expected digits 0 to 9", id="label"
        ),
        pytest.param(
            "size", "train-images-idx3-ubyte", "images are 14 x 14 pixels; expected 28 x 28", id="size"
        ),
        pytest.param("gzip", "train-images-idx3-ubyte.gz", "not a readable gzip file", id="truncated-gzip"),
        pytest.param("missing", "train-labels-idx1-ubyte", "MNIST file not found", id="missing"),
    ],
)
def test_bad_files_raise_a_data_error_naming_the_file(tiny_mnist, tmp_path, damage, file, message):
    root = plain_copy(tiny_mnist, tmp_path / "data")
    path = root / file
    labels = (root / "train-labels-idx1-ubyte").read_bytes()
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:-100])
    elif damage == "truncate-header":
        path.write_bytes(path.read_bytes()[:6])
    elif damage == "trailing":
        path.write_bytes(path.read_bytes() + b"\0\0\0")
    elif damage == "magic":
        write_idx(path, 2049, (768, 28, 28), bytes(768 * 784))
    elif damage == "count":
        write_idx(path, 2049, (767,), labels[8:-1])
    elif damage == "label":
        write_idx(path, 2049, (768,), labels[8:11] + bytes([12]) + labels[12:])
    elif damage == "size":
        write_idx(path, 2051, (768, 14, 14), bytes(768 * 196))
    elif damage == "gzip":
        (root / "train-images-idx3-ubyte").unlink()
        shutil.copy(tiny_mnist / file, path)
        path.write_bytes(path.read_bytes()[:-50])
    elif damage == "missing":
        path.unlink()
    with pytest.raises(DataError, match=message) as error:
        dataset(root)
    assert str(path) in str(error.value)


# ---- the synthetic digits ----------------------------------------------------------------------------------


def test_generated_digits_vary_within_a_class_and_differ_between_classes():
    images, labels = synth_split(1000, seed=3, split_index=0)
    assert set(np.unique(labels)) == set(range(10))
    flat = images.reshape(len(images), -1).astype(np.float64) / 255
    means = np.stack([flat[labels == digit].mean(axis=0) for digit in range(10)])
    spread = np.mean([flat[labels == digit].std(axis=0).mean() for digit in range(10)])
    assert spread > 0.12  # no class is one fixed image (one fixed glyph with its noise and brightness: ~0.08)
    assert np.abs(means[:, None] - means[None]).sum(axis=2)[~np.eye(10, dtype=bool)].min() > 20
    assert glyph_segments().shape[0] == 10
    again, _ = synth_split(1000, seed=3, split_index=0)
    other, _ = synth_split(1000, seed=4, split_index=0)
    assert np.array_equal(images, again) and not np.array_equal(images, other)


def test_generate_skips_an_existing_set_and_refuses_foreign_or_unknown(tmp_path):
    messages: list[str] = []
    out = generate(tmp_path / "set", "tiny", seed=5, progress=messages.append)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["spec"]["seed"] == 5 and sorted(manifest["files"]) == sorted(f"{n}.gz" for n in FILES)
    stamp = (out / "train-images-idx3-ubyte.gz").stat().st_mtime_ns
    generate(out, "tiny", seed=5, if_missing=True, progress=messages.append)
    assert "nothing to do" in messages[-1]
    assert (out / "train-images-idx3-ubyte.gz").stat().st_mtime_ns == stamp
    generate(out, "tiny", seed=6, if_missing=True, progress=messages.append)  # another seed: rewritten
    assert json.loads((out / "manifest.json").read_text())["spec"]["seed"] == 6
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    with pytest.raises(DataError, match="is not a dlscale synthetic data set"):
        generate(foreign, "tiny")
    with pytest.raises(ConfigError, match="unknown preset 'huge'; choose one of tiny, demo, full"):
        generate(tmp_path / "x", "huge")


# ---- metrics and config ------------------------------------------------------------------------------------


def test_the_evaluator_prints_the_workshops_test_line():
    evaluator = MnistEvaluator()
    log_probs = torch.log(
        torch.tensor([[0.7, 0.3] + [0.0] * 8, [0.2, 0.8] + [0.0] * 8, [0.6, 0.4] + [0.0] * 8])
    )
    evaluator.update(torch.zeros(3, 1, 28, 28), torch.tensor([0, 1, 1]), log_probs)
    summary = evaluator.summary()
    loss = -(np.log(0.7) + np.log(0.8) + np.log(0.4)) / 3
    assert summary.loss == pytest.approx(loss)
    assert summary.scalars["accuracy"] == pytest.approx(2 / 3)
    assert summary.baseline_scalars["accuracy"] == pytest.approx(2 / 3)  # always answering 1
    assert f"  Test set: Average loss: {loss:.4f}, Accuracy: 2/3 (67%)" in summary.lines


def test_the_shipped_config_is_the_workshops_recipe(monkeypatch):
    monkeypatch.delenv("DLSCALE_MNIST_DATA", raising=False)
    cfg = load_run_config(CONFIG_FILE, "base")
    assert cfg.workload == "cnn_mnist" and cfg.data.root == "data/mnist"
    optim = cfg.optim
    assert (optim.optimizer, optim.lr, optim.rho, optim.eps) == ("Adadelta", 1.0, 0.9, 1e-6)
    assert (optim.lr_schedule, optim.lr_step_epochs, optim.lr_gamma) == ("step", 1, 0.7)
    assert (cfg.train.global_batch_size, cfg.train.num_epochs, cfg.train.seed) == (64, 14, 1)
    assert cfg.loader.num_data_workers == 1
    monkeypatch.setenv("DLSCALE_MNIST_DATA", "/scratch/mnist")
    assert load_run_config(CONFIG_FILE, "tiny").data.root == "data/mnist_tiny"
    assert load_run_config(CONFIG_FILE, "base", ["dropout1=0.1"]).model.dropout1 == 0.1
    assert load_run_config(CONFIG_FILE, "base").data.root == "/scratch/mnist"
    with pytest.raises(ConfigError, match="std: must be > 0"):
        load_run_config(CONFIG_FILE, "base", ["data.std=0"])


def workshop_forward(model: MnistCNN, images):
    """The workshop's order: ReLU before the max-pool."""
    import torch.nn.functional as F

    x = F.relu(model.conv1(images))
    x = F.max_pool2d(F.relu(model.conv2(x)), 2)
    x = F.relu(model.fc1(torch.flatten(model.dropout1(x), 1)))
    return F.log_softmax(model.fc2(model.dropout2(x)), dim=1)


def test_the_cnn_computes_the_workshops_function_and_gradients_in_its_own_order():
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = MnistCNN(CNNConfig(dropout1=0, dropout2=0))
    images, labels = torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))
    grads = []
    for forward in (model, lambda x: workshop_forward(model, x)):
        model.zero_grad()
        out = forward(images)
        F.nll_loss(out, labels).backward()
        grads.append((out.detach(), [p.grad.clone() for p in model.parameters()]))
    (ours, our_grads), (theirs, their_grads) = grads
    assert torch.equal(ours, theirs)  # relu and max commute exactly
    for mine, workshop in zip(our_grads, their_grads, strict=True):
        torch.testing.assert_close(mine, workshop, rtol=1e-6, atol=1e-7)
