"""CIFAR-100 + ResNet pieces: the ResNets' sizes, FLOPs and init, the binary reader and its errors, the image
conversion, the synthetic generator, and the shipped configs."""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from dlscale.cli import main
from dlscale.config import load_run_config
from dlscale.data.cifar import synth as synth_cifar
from dlscale.data.cifar.config import CIFARDataConfig
from dlscale.data.cifar.dataset import BINARY_DIR, RECORD_BYTES, CIFARDataset, read_records
from dlscale.data.cifar.synth import MANIFEST, PRESETS, SynthCIFARSpec, existing_spec, write_synthetic_cifar
from dlscale.errors import ConfigError, DataError
from dlscale.models.parameters import count_parameters
from dlscale.models.resnet import ResNet, resnet_flops_per_sample
from dlscale.models.resnet_config import ResNetConfig
from dlscale.workloads import get_workload

CONFIG_FILE = Path(__file__).resolve().parents[3] / "configs" / "resnet_cifar.yaml"
SMALL = SynthCIFARSpec(train=300, test=100, seed=3)


def quiet(_: str) -> None:
    pass


@pytest.fixture(scope="module")
def small_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_cifar(tmp_path_factory.mktemp("synth") / "cifar", SMALL, quiet)


def records_file(path: Path, coarse: list[int], fine: list[int], pixels: np.ndarray | None = None) -> Path:
    """A binary file of len(fine) records with the given labels (pixels: (N, 3072) uint8, default zeros)."""
    count = len(fine)
    records = np.zeros((count, RECORD_BYTES), dtype=np.uint8)
    records[:, 0], records[:, 1] = coarse, fine
    if pixels is not None:
        records[:, 2:] = pixels
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(records.tobytes())
    return path


# ---- the model -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("depth", "classes", "expected"),
    [(152, 100, 58_348_708), (152, 1000, 60_192_808), (50, 1000, 25_557_032), (18, 1000, 11_689_512)],
)
def test_parameter_counts_are_torchvisions(depth, classes, expected):
    with torch.device("meta"):
        model = ResNet(ResNetConfig(depth=depth, num_classes=classes))
    assert count_parameters(model) == expected


@pytest.mark.parametrize(
    ("cfg", "side"),
    [
        (ResNetConfig(depth=18, width=16, small_input_stem=True), 32),
        (ResNetConfig(depth=50, width=8), 64),
        (ResNetConfig(depth=152), 224),
    ],
    ids=["18-small-stem-32", "50-width8-64", "152-224"],
)
def test_analytic_flops_equal_the_flop_counter(cfg, side):
    with torch.device("meta"):
        model = ResNet(cfg).eval()
        images = torch.empty(2, 3, side, side)
    with FlopCounterMode(display=False) as counter:
        model(images)
    assert resnet_flops_per_sample(cfg, (side, side)) == counter.get_total_flops() / 2


def test_resnet152_at_224_is_the_demos_11_5_gmac_forward():
    macs = resnet_flops_per_sample(ResNetConfig(depth=152, num_classes=1000), (224, 224)) / 2
    assert macs == pytest.approx(11.5e9, rel=0.01)


def test_stems_shapes_and_torchvision_init():
    torch.manual_seed(0)
    small = ResNet(ResNetConfig(depth=18, width=8, small_input_stem=True, num_classes=7))
    imagenet = ResNet(ResNetConfig(depth=18, width=8, num_classes=7))
    assert small.conv1.kernel_size == (3, 3) and isinstance(small.maxpool, torch.nn.Identity)
    assert imagenet.conv1.kernel_size == (7, 7) and imagenet.conv1.stride == (2, 2)
    images = torch.randn(4, 3, 32, 32)
    assert small(images).shape == imagenet(images).shape == (4, 7)
    # kaiming normal, fan_out: std = sqrt(2 / (out_channels * k * k))
    weight = imagenet.layer4[0].conv1.weight
    expected_std = (2 / (weight.shape[0] * 9)) ** 0.5
    assert float(weight.detach().std()) == pytest.approx(expected_std, rel=0.1)
    bn = imagenet.layer2[1].bn2
    assert torch.equal(bn.weight, torch.ones(bn.num_features)) and torch.equal(
        bn.bias, torch.zeros(bn.num_features)
    )
    assert list(imagenet.state_dict())[:2] == ["conv1.weight", "bn1.weight"]  # torchvision's names
    assert "layer2.0.downsample.0.weight" in imagenet.state_dict()


def test_model_config_is_validated_and_must_match_the_labels():
    with pytest.raises(ConfigError, match="depth: must be one of 18, 34, 50, 101, 152, got 20"):
        load_run_config(CONFIG_FILE, "tiny", ["model.depth=20"])
    cfg = load_run_config(CONFIG_FILE, "tiny", ["data.label=coarse"])
    with pytest.raises(
        ConfigError, match=r"model.num_classes is 100, but data.label 'coarse' has 20 classes"
    ):
        get_workload("resnet_cifar").build_model(cfg.model, cfg.data)


# ---- the reader ------------------------------------------------------------------------------------------


def test_records_round_trip_with_the_byte_layout(tmp_path):
    pixels = np.random.default_rng(0).integers(0, 256, size=(2, 3072), dtype=np.uint8)
    path = records_file(tmp_path / BINARY_DIR / "train.bin", [4, 19], [21, 99], pixels)
    images, coarse, fine = read_records(path)
    assert images.shape == (2, 3, 32, 32) and images.dtype == np.uint8
    assert coarse.tolist() == [4, 19] and fine.tolist() == [21, 99]
    # red plane first, then green, then blue; each row-major
    channel, row, column = 2, 5, 7
    assert images[1, channel, row, column] == pixels[1, channel * 1024 + row * 32 + column]


def test_generated_set_reads_back_balanced_with_coarse_superclasses(small_set):
    images, coarse, fine = read_records(small_set / BINARY_DIR / "train.bin")
    assert images.shape == (300, 3, 32, 32)
    assert np.bincount(fine, minlength=100).tolist() == [3] * 100
    assert np.array_equal(coarse, fine // 5)
    names = (small_set / BINARY_DIR / "fine_label_names.txt").read_text().split()
    assert len(names) == 100 and names[0] == "red_horizontal_stripes"
    assert len((small_set / BINARY_DIR / "coarse_label_names.txt").read_text().split()) == 20
    test_images, _, test_fine = read_records(small_set / BINARY_DIR / "test.bin")
    assert test_images.shape[0] == 100 and sorted(test_fine.tolist()) == list(range(100))


def test_a_truncated_file_names_the_file_and_the_byte_counts(tmp_path):
    path = records_file(tmp_path / BINARY_DIR / "train.bin", [0, 0], [0, 1])
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DataError) as error:
        read_records(path)
    message = str(error.value)
    assert message.startswith(f"{path}: 6048 bytes is not a whole number of 3074-byte CIFAR-100 records")
    assert "1 records and 2974 bytes" in message and "truncated" in message
    path.write_bytes(b"")
    with pytest.raises(DataError, match="0 bytes is not a whole number"):
        read_records(path)


def test_a_cifar10_file_is_recognized(tmp_path):
    path = tmp_path / "data_batch_1.bin"
    path.write_bytes(bytes(3 * 3073))
    with pytest.raises(DataError, match="is it a CIFAR-10 file"):
        read_records(path)


@pytest.mark.parametrize(
    ("coarse", "fine", "message"),
    [
        ([1, 3], [5, 100], r"record 1 \(byte 3075\) has fine label 100; expected 0 to 99"),
        ([20, 3], [5, 17], r"record 0 \(byte 0\) has coarse label 20; expected 0 to 19"),
        ([1, 2], [5, 5], "record 1 has fine label 5 with coarse label 2, but earlier records give"),
    ],
    ids=["fine-100", "coarse-20", "two-superclasses"],
)
def test_bad_labels_are_rejected_naming_the_record(tmp_path, coarse, fine, message):
    path = records_file(tmp_path / "test.bin", coarse, fine)
    with pytest.raises(DataError, match=message) as error:
        read_records(path)
    assert str(path) in str(error.value)


def test_the_pickled_python_version_is_refused_without_unpickling(tmp_path):
    archive = tmp_path / "cifar-100-python"
    archive.mkdir()
    # written with pickle only to have the real file's bytes; dlscale must not load it
    (archive / "train").write_bytes(pickle.dumps({b"data": b"x" * 10, b"fine_labels": [1]}, protocol=2))
    with pytest.raises(
        DataError, match="Python pickle .*does not unpickle.*cifar-100-binary.tar.gz"
    ) as error:
        read_records(archive / "train")
    assert str(archive / "train") in str(error.value)
    # a data root holding only the python version says so
    with pytest.raises(DataError, match="found cifar-100-python/, the pickled 'python version'"):
        CIFARDataset(CIFARDataConfig(root=str(tmp_path)), "train")


def test_archives_and_missing_files_get_clear_errors(tmp_path):
    archive = tmp_path / "train.bin"
    archive.write_bytes(gzip.compress(bytes(RECORD_BYTES)))
    with pytest.raises(DataError, match="a gzip archive; extract it first"):
        read_records(archive)
    with pytest.raises(DataError, match=r"cifar-100-binary/test.bin: CIFAR-100 file not found.*synth-cifar"):
        CIFARDataset(CIFARDataConfig(root=str(tmp_path / "nowhere")), "valid")


# ---- the dataset -----------------------------------------------------------------------------------------


def test_samples_are_normalized_resized_and_labelled(small_set):
    plain = CIFARDataset(CIFARDataConfig(root=str(small_set)), "train")
    image, label = plain[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32 and label.dtype == torch.int64
    raw = torch.from_numpy(plain.images[0]).float() / 255
    mean = torch.tensor([0.5071, 0.4865, 0.4409]).reshape(3, 1, 1)
    std = torch.tensor([0.2673, 0.2564, 0.2762]).reshape(3, 1, 1)
    torch.testing.assert_close(image, (raw - mean) / std)

    resized = CIFARDataset(CIFARDataConfig(root=str(small_set), resize=224), "train")
    assert resized[0][0].shape == (3, 224, 224)
    assert float(resized[0][0].mean()) == pytest.approx(float(image.mean()), abs=0.02)

    coarse = CIFARDataset(CIFARDataConfig(root=str(small_set / BINARY_DIR), label="coarse"), "train")
    assert coarse.num_classes == 20 and int(coarse[0][1]) == int(label) // 5
    limited = CIFARDataset(CIFARDataConfig(root=str(small_set), limit_nsamples_val=10), "valid")
    assert len(limited) == 10 and len(plain) == 300


@pytest.mark.parametrize("resize", [None, 224, 16])
def test_device_conversion_of_raw_batches_equals_the_samples_bitwise(small_set, resize):
    dataset = CIFARDataset(CIFARDataConfig(root=str(small_set), resize=resize), "valid")
    raw, conversion = dataset.device_normalization()
    indices = [3, 0, 7, 99]
    raw_images = torch.stack([raw[i][0] for i in indices])
    assert raw_images.dtype == torch.uint8
    labels = torch.stack([raw[i][1] for i in indices])
    images, same_labels = conversion.to(torch.device("cpu"))(raw_images, labels)
    assert torch.equal(images, torch.stack([dataset[i][0] for i in indices]))
    assert torch.equal(same_labels, torch.stack([dataset[i][1] for i in indices]))


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.std=[0.2, 0, 0.2]", "std: every value must be > 0"),
        ("data.resize=0", "resize: must be a side in pixels >= 1 or null"),
        ("data.label=medium", "'medium' is not one of fine, coarse"),
    ],
)
def test_data_config_is_validated(override, message):
    with pytest.raises(ConfigError, match=message):
        load_run_config(CONFIG_FILE, "tiny", [override])


# ---- the generator ---------------------------------------------------------------------------------------


def test_generation_is_seeded_and_safe_to_repeat(tmp_path, small_set):
    again = write_synthetic_cifar(tmp_path / "again", SMALL, quiet)
    for name in ("train.bin", "test.bin"):
        assert (again / BINARY_DIR / name).read_bytes() == (small_set / BINARY_DIR / name).read_bytes()
    other = write_synthetic_cifar(tmp_path / "other", SynthCIFARSpec(train=300, test=100, seed=4), quiet)
    assert (other / BINARY_DIR / "train.bin").read_bytes() != (again / BINARY_DIR / "train.bin").read_bytes()
    assert existing_spec(again) == SMALL
    assert json.loads((again / MANIFEST).read_text())["spec"]["seed"] == 3
    (again / BINARY_DIR / "test.bin").write_bytes(b"")  # damaged: no longer counts as present
    assert existing_spec(again) is None

    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep")
    with pytest.raises(DataError, match="not a dlscale synthetic data set"):
        write_synthetic_cifar(precious, SMALL, quiet)
    assert (precious / "notes.txt").read_text() == "keep"


def test_generate_skips_an_identical_set_and_rejects_unknown_presets(tmp_path):
    out = tmp_path / "tiny"
    messages: list[str] = []
    synth_cifar.generate(out, "tiny", None, if_missing=True, progress=messages.append)
    written = (out / BINARY_DIR / "train.bin").stat().st_mtime_ns
    assert existing_spec(out) == PRESETS["tiny"]
    synth_cifar.generate(out, "tiny", None, if_missing=True, progress=messages.append)
    assert "already holds this data set" in messages[-1]
    assert (out / BINARY_DIR / "train.bin").stat().st_mtime_ns == written
    synth_cifar.generate(out, "tiny", 5, if_missing=True, progress=messages.append)  # another seed: rewritten
    assert existing_spec(out).seed == 5
    with pytest.raises(ConfigError, match="unknown preset 'huge'; choose one of tiny, demo, full"):
        synth_cifar.generate(out, "huge", None, if_missing=False, progress=quiet)


def test_dlscale_data_synth_cifar_command(tmp_path):
    out = tmp_path / "cli"
    assert main(["data", "synth-cifar", "--out", str(out), "--preset", "tiny", "--seed", "2"]) == 0
    assert (out / BINARY_DIR / "train.bin").stat().st_size == 2000 * RECORD_BYTES
    assert (out / BINARY_DIR / "test.bin").stat().st_size == 500 * RECORD_BYTES
    assert PRESETS["full"].train == 50_000 and PRESETS["full"].test == 10_000


# ---- the shipped configs ---------------------------------------------------------------------------------


def test_shipped_configs_mirror_the_demos_three_scripts():
    base = load_run_config(CONFIG_FILE, "base")
    assert (base.model.depth, base.model.num_classes, base.data.resize) == (152, 100, 224)
    assert (base.optim.optimizer, base.optim.lr, base.optim.momentum) == ("SGD", 0.01, 0.9)
    assert (base.train.global_batch_size, base.train.num_epochs) == (128, 4)
    assert base.loader.num_data_workers == 0
    assert get_workload("resnet_cifar").forward_flops_per_sample(base.model, base.data) == pytest.approx(
        2 * 11.5e9, rel=0.01
    )
    assert load_run_config(CONFIG_FILE, "dataparallel").parallel.data_parallel == "dataparallel"
    ddp = load_run_config(CONFIG_FILE, "ddp")
    assert ddp.train.local_batch_size == 128 and ddp.loader.num_data_workers == 7
    assert load_run_config(CONFIG_FILE, "bs256").train.global_batch_size == 256
    assert load_run_config(CONFIG_FILE, "resnet50").model.depth == 50
    demo = load_run_config(CONFIG_FILE, "demo")
    assert (demo.model.depth, demo.model.small_input_stem, demo.data.resize) == (18, True, None)


@pytest.mark.parametrize(("label", "count"), [("fine", 100), ("coarse", 20)])
def test_the_class_names_come_from_the_archive_and_reach_the_confusion_matrix(small_set, label, count):
    dataset = CIFARDataset(CIFARDataConfig(root=str(small_set), label=label), "valid")
    expected = (small_set / BINARY_DIR / f"{label}_label_names.txt").read_text().split()
    assert dataset.class_names == tuple(expected) and len(expected) == count
    evaluator = get_workload("resnet_cifar").evaluator(dataset)
    logits = torch.zeros(2, count)
    evaluator.update(torch.zeros(2, 3, 32, 32), torch.tensor([0, 1]), logits)
    assert evaluator.summary().class_counts.names() == expected


def test_a_missing_or_wrong_names_file_leaves_numbers_and_says_which_file(tmp_path, small_set, caplog):
    copy = tmp_path / BINARY_DIR
    copy.mkdir()
    (copy / "test.bin").write_bytes((small_set / BINARY_DIR / "test.bin").read_bytes())
    config = CIFARDataConfig(root=str(tmp_path))
    assert CIFARDataset(config, "valid").class_names is None  # no names file: no warning needed
    assert not caplog.records
    names = copy / "fine_label_names.txt"
    names.write_text("apple\nbanana\n")
    with caplog.at_level("WARNING", logger="dlscale.data"):
        assert CIFARDataset(config, "valid").class_names is None
    assert f"{names}: 2 names, expected one per line for each of the 100 fine classes" in caplog.text
    names.write_text("\n".join(f"class {i}" for i in range(100)) + "\n\n")  # trailing blank lines are fine
    assert CIFARDataset(config, "valid").class_names[99] == "class 99"
