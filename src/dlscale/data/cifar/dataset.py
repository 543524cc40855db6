"""CIFAR-100 reader: the "binary version" of the data set, checked, held in memory, converted per sample.

On disk (https://www.cs.toronto.edu/~kriz/cifar.html, cifar-100-binary.tar.gz extracted, and what
``dlscale data synth-cifar`` writes) a data root holds::

    cifar-100-binary/train.bin    50,000 records: the training split
    cifar-100-binary/test.bin     10,000 records: the test split, dlscale's validation set
    cifar-100-binary/fine_label_names.txt, coarse_label_names.txt    the class names, one per line in label
                                  order (optional: without them the figures name classes by number)

(``data.root`` may also point at the ``cifar-100-binary`` directory itself.) A record is 3074 bytes: the coarse
label (0-19), the fine label (0-99), then 3072 pixel bytes: the 32x32 red plane, then green, then blue, each
row-major. The files have no header; a size that is not a whole number of records means a truncated copy.

The "python version" (cifar-100-python/, which torchvision downloads) holds pickles, and unpickling a file
can run arbitrary code, so it is refused with a message saying which archive to get instead.

A sample is ``(image (3, S, S) float32, label int64 scalar)``: pixels / 255, resized to ``resize`` x ``resize``
(bilinear, as the demo's ``Resize((224, 224))``; null keeps 32x32), then ``(x - mean) / std`` per channel with
the demo's CIFAR-100 statistics. No augmentation (the demo has none). The conversion is one function for single
samples and for batches, so dlscale's gpu pipeline can copy raw uint8 images (3 KB instead of 600 KB at 224x224)
and convert them on the device, with the same result.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from dlscale.data.cifar.config import IMAGE_SIDE, NUM_CLASSES, CIFARDataConfig
from dlscale.errors import DataError

log = logging.getLogger("dlscale.data")

PIXEL_BYTES = 3 * IMAGE_SIDE * IMAGE_SIDE
RECORD_BYTES = 2 + PIXEL_BYTES  # coarse label, fine label, pixels
CIFAR10_RECORD_BYTES = 1 + PIXEL_BYTES
BINARY_DIR = "cifar-100-binary"
SPLIT_FILES = {"train": "train.bin", "valid": "test.bin"}


def find_split_file(root: Path, split: str) -> Path:
    """The binary file of ``split`` under ``root`` (or ``root/cifar-100-binary``); DataError if absent."""
    name = SPLIT_FILES[split]
    for candidate in (root / BINARY_DIR / name, root / name):
        if candidate.is_file():
            return candidate
    hint = (
        "generate a synthetic set with `dlscale data synth-cifar --out DIR`, or download the binary version "
        "(cifar-100-binary.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html) and extract it in data.root"
    )
    if (root / "cifar-100-python").is_dir() or root.name == "cifar-100-python":
        hint = (
            "found cifar-100-python/, the pickled 'python version' (torchvision's download), which dlscale does "
            "not read because unpickling can run arbitrary code; " + hint
        )
    raise DataError(f"{root / BINARY_DIR / name}: CIFAR-100 file not found (nor {root / name}); {hint}")


def read_class_names(directory: Path, label: str) -> tuple[str, ...] | None:
    """The class names of ``label`` ("fine" or "coarse") from ``directory/<label>_label_names.txt``, in label
    order; None (with a warning naming the file) when the file is absent, unreadable or has the wrong count:
    names only label figures, so a bad names file must not stop a run."""
    path = directory / f"{label}_label_names.txt"
    if not path.is_file():
        return None
    try:
        names = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as error:
        log.warning("%s: cannot read the class names (%s); figures name classes by number", path, error)
        return None
    if len(names) != NUM_CLASSES[label]:
        log.warning(
            "%s: %d names, expected one per line for each of the %d %s classes; figures name classes by number",
            path,
            len(names),
            NUM_CLASSES[label],
            label,
        )
        return None
    return tuple(names)


def _refuse_other_formats(path: Path, head: bytes) -> None:
    """Clear errors for the files people most often point at instead of the binary version."""
    pickled = len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5
    if pickled or path.parent.name == "cifar-100-python":
        raise DataError(
            f"{path}: a Python pickle (the 'python version' of CIFAR, e.g. cifar-100-python/train); dlscale does "
            "not unpickle data, since that can run arbitrary code. Use the binary version instead: "
            "cifar-100-binary.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html (train.bin, test.bin)"
        )
    if head[:2] == b"\x1f\x8b":
        raise DataError(
            f"{path}: a gzip archive; extract it first (tar xzf) and point data.root at the result"
        )
    if head[257:262] == b"ustar":
        raise DataError(f"{path}: a tar archive; extract it first (tar xf) and point data.root at the result")


def read_records(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(images (N, 3, 32, 32) uint8, coarse labels (N,) int64, fine labels (N,) int64) of one binary file."""
    content = path.read_bytes()
    _refuse_other_formats(path, content[:512])
    size = len(content)
    if size == 0 or size % RECORD_BYTES:
        whole, extra = divmod(size, RECORD_BYTES)
        message = (
            f"{path}: {size} bytes is not a whole number of {RECORD_BYTES}-byte CIFAR-100 records (1 coarse "
            f"label + 1 fine label + {PIXEL_BYTES} pixels): {whole} records and {extra} bytes; "
            "expected a complete train.bin or test.bin (truncated copy?)"
        )
        if size and size % CIFAR10_RECORD_BYTES == 0:
            message += f"; its size fits {CIFAR10_RECORD_BYTES}-byte records: is it a CIFAR-10 file?"
        raise DataError(message)
    records = np.frombuffer(content, dtype=np.uint8).reshape(-1, RECORD_BYTES)
    coarse, fine = records[:, 0].astype(np.int64), records[:, 1].astype(np.int64)
    for labels, kind, byte in ((coarse, "coarse", 0), (fine, "fine", 1)):
        bad = np.flatnonzero(labels >= NUM_CLASSES[kind])
        if bad.size:
            raise DataError(
                f"{path}: record {bad[0]} (byte {bad[0] * RECORD_BYTES + byte}) has {kind} label "
                f"{labels[bad[0]]}; expected 0 to {NUM_CLASSES[kind] - 1} ({bad.size} such records)"
            )
    _check_label_hierarchy(path, coarse, fine)
    # A copy: arrays over bytes are read-only, which torch warns about when they become tensors.
    images = records[:, 2:].reshape(-1, 3, IMAGE_SIDE, IMAGE_SIDE).copy()
    return images, coarse, fine


def _check_label_hierarchy(path: Path, coarse: np.ndarray, fine: np.ndarray) -> None:
    """Each fine class belongs to exactly one superclass; records that break this come from a damaged file."""
    first_coarse = np.full(NUM_CLASSES["fine"], -1, dtype=np.int64)
    classes, first_records = np.unique(fine, return_index=True)
    first_coarse[classes] = coarse[first_records]  # the coarse label of each fine class's first record
    clash = np.flatnonzero(first_coarse[fine] != coarse)
    if clash.size:
        record = clash[0]
        raise DataError(
            f"{path}: record {record} has fine label {fine[record]} with coarse label {coarse[record]}, but "
            f"earlier records give fine label {fine[record]} coarse label {first_coarse[fine[record]]}; "
            "expected every fine class to belong to one superclass"
        )


class ImageConversion:
    """uint8 images (B, 3, 32, 32) -> float32 (B, 3, S, S): /255, bilinear resize, per-channel normalization.

    Also the gpu pipeline's normalizer (``to(device)``, ``(inputs, targets) -> (images, targets)``).
    """

    def __init__(
        self,
        mean: tuple[float, ...] | torch.Tensor,
        std: tuple[float, ...] | torch.Tensor,
        resize: int | None,
    ):
        self.mean = torch.as_tensor(mean, dtype=torch.float32).reshape(1, 3, 1, 1)
        self.std = torch.as_tensor(std, dtype=torch.float32).reshape(1, 3, 1, 1)
        self.resize = resize

    def images(self, pixels: torch.Tensor) -> torch.Tensor:
        """Convert a batch of uint8 images."""
        images = pixels.to(torch.float32).div_(255.0)
        if self.resize is not None and self.resize != IMAGE_SIDE:
            # Antialiasing only acts when shrinking (as PIL's resize, which the demo uses, does).
            shrink = self.resize < IMAGE_SIDE
            images = F.interpolate(
                images,
                size=(self.resize, self.resize),
                mode="bilinear",
                align_corners=False,
                antialias=shrink,
            )
        return images.sub_(self.mean).div_(self.std)

    def to(self, device: torch.device) -> ImageConversion:
        """This conversion with its statistics on ``device``."""
        return ImageConversion(self.mean.to(device), self.std.to(device), self.resize)

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images(inputs), targets


class CIFARDataset(Dataset):
    """(image (3, S, S) float32, label int64 scalar) samples of one split (see the module docstring)."""

    def __init__(self, cfg: CIFARDataConfig, split: str, convert: bool = True):
        if split not in SPLIT_FILES:
            raise ValueError(f"split must be one of {sorted(SPLIT_FILES)}, got {split!r}")
        self.cfg = cfg
        self.split = split
        self.convert = convert
        self.path = find_split_file(cfg.root_path(), split)
        images, coarse, fine = read_records(self.path)
        limit = cfg.limit_nsamples if split == "train" else cfg.limit_nsamples_val
        if limit is not None:
            images, coarse, fine = images[:limit], coarse[:limit], fine[:limit]
        self.images = images
        self.labels = fine if cfg.label == "fine" else coarse
        self.class_names = read_class_names(self.path.parent, cfg.label)
        self.conversion = ImageConversion(cfg.mean, cfg.std, cfg.resize)

    @property
    def num_classes(self) -> int:
        return self.cfg.num_classes

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        pixels = torch.from_numpy(self.images[index])
        label = torch.tensor(self.labels[index], dtype=torch.int64)
        if not self.convert:
            return pixels.clone(), label
        return self.conversion.images(pixels.unsqueeze(0))[0], label

    def device_normalization(self) -> tuple[CIFARDataset, ImageConversion | None]:
        """A view reading raw uint8 images, and the conversion of their batches (done on the device).

        The protocol of dlscale's gpu pipeline (``dlscale.data.values.normalization.SupportsDeviceNormalization``).
        """
        if not self.convert:
            return self, None
        raw = object.__new__(CIFARDataset)
        raw.__dict__.update(self.__dict__, convert=False)  # shares the arrays
        return raw, self.conversion

    def class_counts(self) -> np.ndarray:
        """Samples per class."""
        return np.bincount(self.labels, minlength=self.num_classes)

    def describe_sample(self, index: int, epoch: int = 0) -> str:
        """Where sample ``index`` lives, for error messages (see :mod:`dlscale.data.values.finite_check`)."""
        return f"record {index} of {self.path}"

    def __repr__(self) -> str:
        side = self.cfg.image_size[0]
        return (
            f"CIFARDataset(split={self.split!r}, samples={len(self)}, labels={self.cfg.label}, "
            f"size={side}x{side}, file={self.path})"
        )
