"""MNIST reader: the standard idx files, checked, decoded once into memory, normalized per sample.

A data root holds the four files MNIST is distributed as, each plain or gzip-compressed (``.gz``)::

    train-images-idx3-ubyte   train-labels-idx1-ubyte     the training split (60,000 images)
    t10k-images-idx3-ubyte    t10k-labels-idx1-ubyte      the test split (10,000), dlscale's validation set

They are looked up in the root itself, then in ``<root>/MNIST/raw`` (where torchvision's download, which the
workshop's ``download_data.py`` makes, puts them); a plain file wins over its ``.gz`` beside it.

idx format: a big-endian header (two zero bytes, the element type 0x08 = unsigned byte, the number of
dimensions), one big-endian uint32 per dimension, then the data. Images are magic 2051 (3 dimensions:
count x 28 x 28), labels magic 2049 (1 dimension: count).

The decoded uint8 arrays stay in memory (the training images are 47 MB) and DataLoader workers share them
through fork; a sample is converted when it is read: ``(pixel / 255 - mean) / std``, as the workshop's
``ToTensor()`` + ``Normalize((0.1307,), (0.3081,))``.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from dlscale.data.mnist.config import IMAGE_SIDE, NUM_CLASSES, MNISTDataConfig
from dlscale.errors import DataError

IMAGES_MAGIC = 2051
LABELS_MAGIC = 2049

# split -> (images file, labels file), without the optional ".gz"
SPLIT_FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "valid": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_SUBDIRS = (".", "MNIST/raw")  # where, under the root, the files are looked for


def find_idx_file(root: Path, name: str) -> Path:
    """The file ``name`` or ``name.gz`` under ``root`` (or ``root/MNIST/raw``); DataError if there is none."""
    for subdir in _SUBDIRS:
        for candidate in (root / subdir / name, root / subdir / f"{name}.gz"):
            if candidate.is_file():
                return candidate
    raise DataError(
        f"{root / name}: MNIST file not found (nor {name}.gz, also looked in {root / 'MNIST' / 'raw'}); "
        "point data.root at a directory holding the four idx files (DLSCALE_MNIST_DATA for the shipped "
        "configs), or generate them with `dlscale data synth-mnist --out DIR`"
    )


def _read_bytes(path: Path) -> bytes:
    """The file's content, decompressed when it is gzip (recognized by its magic bytes, not its name)."""
    raw = path.read_bytes()
    if raw[:2] != b"\x1f\x8b":
        return raw
    try:
        return gzip.decompress(raw)
    except (EOFError, OSError, zlib.error) as exc:
        raise DataError(f"{path}: not a readable gzip file (truncated or corrupt?): {exc}") from None


def read_idx(path: Path, magic: int, ndim: int) -> np.ndarray:
    """The uint8 array of an idx file, after checking its magic number, dimensions and length."""
    content = _read_bytes(path)
    header_size = 4 + 4 * ndim
    if len(content) < header_size:
        raise DataError(
            f"{path}: truncated idx file: {len(content)} bytes, shorter than its {header_size}-byte header"
        )
    found = int.from_bytes(content[:4], "big")
    if found != magic:
        what = "images" if magic == IMAGES_MAGIC else "labels"
        raise DataError(
            f"{path}: wrong magic number {found} (0x{found:08x}); expected {magic} (0x{magic:08x}, idx "
            f"unsigned bytes in {ndim} dimension(s), MNIST {what})"
        )
    dims = tuple(int.from_bytes(content[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected = header_size + int(np.prod(dims, dtype=np.int64))
    if len(content) < expected:
        raise DataError(
            f"{path}: truncated idx file: {len(content)} bytes, but its header says "
            f"{' x '.join(map(str, dims))} values ({expected} bytes with the header)"
        )
    if len(content) > expected:
        raise DataError(
            f"{path}: {len(content) - expected} bytes after the {' x '.join(map(str, dims))} values its "
            "header announces; expected the file to end there"
        )
    # A copy: frombuffer over bytes is read-only, and torch warns about (and must not write to) such arrays.
    return np.frombuffer(content, dtype=np.uint8, offset=header_size).reshape(dims).copy()


def read_split(root: Path, split: str) -> tuple[np.ndarray, np.ndarray, tuple[Path, Path]]:
    """(images (N, 28, 28) uint8, labels (N,) int64, the two files) of one split, all checks done."""
    images_name, labels_name = SPLIT_FILES[split]
    images_path, labels_path = find_idx_file(root, images_name), find_idx_file(root, labels_name)
    images = read_idx(images_path, IMAGES_MAGIC, 3)
    if images.shape[1:] != (IMAGE_SIDE, IMAGE_SIDE):
        raise DataError(
            f"{images_path}: images are {images.shape[1]} x {images.shape[2]} pixels; expected "
            f"{IMAGE_SIDE} x {IMAGE_SIDE} (the network's 9216 features need MNIST's size)"
        )
    labels = read_idx(labels_path, LABELS_MAGIC, 1)
    if labels.shape[0] != images.shape[0]:
        raise DataError(
            f"{labels_path}: {labels.shape[0]} labels, but {images_path.name} holds {images.shape[0]} "
            "images; expected one label per image"
        )
    if labels.size and labels.max() >= NUM_CLASSES:
        bad = int(np.argmax(labels >= NUM_CLASSES))
        raise DataError(
            f"{labels_path}: label {labels[bad]} at index {bad}; expected digits 0 to {NUM_CLASSES - 1}"
        )
    return images, labels.astype(np.int64), (images_path, labels_path)


def normalize_pixels(pixels: torch.Tensor, mean: float, std: float) -> torch.Tensor:
    """uint8 pixels -> float32 ``(pixels / 255 - mean) / std``; one definition for host and device batches."""
    return pixels.to(torch.float32).div_(255.0).sub_(mean).div_(std)


class PixelNormalizer:
    """Normalizes a batch of raw uint8 images on the device (see ``MNISTDataset.device_normalization``)."""

    def __init__(self, mean: float, std: float):
        self.mean, self.std = mean, std

    def to(self, device: torch.device) -> PixelNormalizer:
        return self  # its statistics are Python numbers: nothing to move

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return normalize_pixels(inputs, self.mean, self.std), targets


class MNISTDataset(Dataset):
    """(image (1, 28, 28) float32, label int64 scalar) samples of one split; no augmentation."""

    def __init__(self, cfg: MNISTDataConfig, split: str, normalize: bool = True):
        if split not in SPLIT_FILES:
            raise ValueError(f"split must be one of {sorted(SPLIT_FILES)}, got {split!r}")
        self.cfg = cfg
        self.split = split
        self.normalize = normalize
        images, labels, self.files = read_split(cfg.root_path(), split)
        limit = cfg.limit_nsamples if split == "train" else cfg.limit_nsamples_val
        if limit is not None:
            images, labels = images[:limit], labels[:limit]
        if len(images) == 0:
            raise DataError(f"{self.files[0]}: no images; expected at least one")
        self.images = images
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        pixels = torch.from_numpy(self.images[index]).unsqueeze(0)  # a view of the decoded array
        label = torch.tensor(self.labels[index], dtype=torch.int64)
        if not self.normalize:
            return pixels.clone(), label
        return normalize_pixels(pixels, self.cfg.mean, self.cfg.std), label

    def device_normalization(self) -> tuple[MNISTDataset, PixelNormalizer | None]:
        """A view reading raw uint8 images, and the normalizer of its batches (4x less to copy to a GPU).

        The protocol of dlscale's gpu pipeline (``dlscale.data.values.normalization.SupportsDeviceNormalization``):
        the normalizer applied to stacked raw samples gives the stacked samples of this data set, bitwise.
        """
        if not self.normalize:
            return self, None
        raw = object.__new__(MNISTDataset)
        raw.__dict__.update(self.__dict__, normalize=False)  # shares the decoded arrays
        return raw, PixelNormalizer(self.cfg.mean, self.cfg.std)

    def describe_sample(self, index: int, epoch: int = 0) -> str:
        """Where sample ``index`` lives, for error messages (see :mod:`dlscale.data.values.finite_check`)."""
        return f"image {index} of {self.files[0]}"

    def __repr__(self) -> str:
        return f"MNISTDataset(split={self.split!r}, samples={len(self)}, files={self.files[0].parent})"
