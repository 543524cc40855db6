"""`dlscale data synth-mnist`: digit-like images in MNIST's idx files, to train the workshop's CNN on.

    OUT/train-images-idx3-ubyte.gz   OUT/train-labels-idx1-ubyte.gz    training split
    OUT/t10k-images-idx3-ubyte.gz    OUT/t10k-labels-idx1-ubyte.gz     test split (dlscale's validation set)
    OUT/manifest.json                                                  how it was generated (written last)

Files are gzip-compressed, as MNIST is distributed (the reader takes plain files too). Every image is one of
ten stroke glyphs shaped like the digits 0-9, drawn anti-aliased on 28 x 28 pixels after a random affine
transform (rotation, scale, aspect, slant, shift), a smooth random warp of the strokes, a random stroke width
and brightness, plus pixel noise: the class is never a fixed image, so a classifier has to learn the shapes.
Labels are drawn uniformly, so the splits are close to balanced (as MNIST), not exactly.

Deterministic: the same preset and seed give the same bytes; the two splits use different random streams.
"""

from __future__ import annotations

import gzip
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from dlscale.data.mnist.config import IMAGE_SIDE, NUM_CLASSES
from dlscale.data.mnist.dataset import IMAGES_MAGIC, LABELS_MAGIC, SPLIT_FILES
from dlscale.data.synth_output import MANIFEST, preset_spec, read_manifest, write_data_set
from dlscale.errors import DataError

log = logging.getLogger(__name__)

GENERATOR = "dlscale synth-mnist"
CHUNK = 128  # images rendered at once (bounds the (chunk, segments, pixels) distance arrays to ~10 MB)


@dataclass(frozen=True)
class SynthMNISTSpec:
    """What to generate."""

    train_samples: int
    valid_samples: int
    seed: int = 0

    def __post_init__(self) -> None:
        if self.train_samples < 1 or self.valid_samples < 1:
            raise DataError(
                "synth-mnist: need at least one sample per split, "
                f"got {self.train_samples} / {self.valid_samples}"
            )


# `tiny` is for tests (a fraction of a second to write), `demo` for the CPU demo config; `full` has MNIST's
# sizes.
PRESETS: dict[str, SynthMNISTSpec] = {
    "tiny": SynthMNISTSpec(train_samples=768, valid_samples=256),
    "demo": SynthMNISTSpec(train_samples=6144, valid_samples=1024),
    "full": SynthMNISTSpec(train_samples=60_000, valid_samples=10_000),
}


# ---- the glyphs: strokes in unit coordinates (x right, y down, the digit inside [0.15, 0.85]) --------------


def _arc(cx: float, cy: float, rx: float, ry: float, start: float, stop: float, pieces: int) -> list:
    """A polyline along an ellipse from ``start`` to ``stop`` degrees (y points down: 270 is the top)."""
    angles = np.radians(np.linspace(start, stop, pieces + 1))
    return list(zip(cx + rx * np.cos(angles), cy + ry * np.sin(angles), strict=True))


def _glyph_strokes() -> list[list[list[tuple[float, float]]]]:
    """Per digit, its strokes, each a polyline."""
    ring = 12  # pieces of a full ellipse
    return [
        [_arc(0.5, 0.5, 0.2, 0.33, 0, 360, ring)],  # 0
        [[(0.4, 0.26), (0.5, 0.16), (0.5, 0.84)]],  # 1
        [_arc(0.5, 0.35, 0.19, 0.18, 200, 400, 8) + [(0.28, 0.84), (0.74, 0.84)]],  # 2
        [_arc(0.48, 0.33, 0.17, 0.17, 200, 450, 8), _arc(0.48, 0.66, 0.19, 0.18, 270, 520, 8)],  # 3
        [[(0.64, 0.84), (0.64, 0.16), (0.26, 0.62), (0.78, 0.62)]],  # 4
        [[(0.72, 0.16), (0.34, 0.16), (0.32, 0.48)] + _arc(0.5, 0.62, 0.2, 0.2, 225, 505, 10)],  # 5
        [
            [(0.68, 0.17), (0.5, 0.26), (0.38, 0.42), (0.32, 0.62)],
            _arc(0.5, 0.65, 0.18, 0.18, 0, 360, ring),
        ],  # 6
        [[(0.26, 0.16), (0.76, 0.16), (0.44, 0.84)]],  # 7
        [_arc(0.5, 0.31, 0.15, 0.15, 0, 360, ring), _arc(0.5, 0.66, 0.18, 0.18, 0, 360, ring)],  # 8
        [_arc(0.5, 0.34, 0.18, 0.18, 0, 360, ring), [(0.68, 0.34), (0.62, 0.84)]],  # 9
    ]


def glyph_segments() -> np.ndarray:
    """(10, S, 2, 2): each digit's line segments (start, end) x (x, y); short glyphs repeat their last one."""
    per_digit = []
    for strokes in _glyph_strokes():
        segments = [(a, b) for stroke in strokes for a, b in zip(stroke[:-1], stroke[1:], strict=True)]
        per_digit.append(np.asarray(segments, dtype=np.float64))
    most = max(len(s) for s in per_digit)
    padded = [np.concatenate([s, np.repeat(s[-1:], most - len(s), axis=0)]) for s in per_digit]
    return np.stack(padded)


# ---- drawing ---------------------------------------------------------------------------------------------


def _random_transforms(rng: np.random.Generator, count: int) -> dict[str, np.ndarray]:
    """Per image: the 2x2 linear map, shift, warp, stroke width (px), brightness and noise level."""
    angle = np.radians(rng.uniform(-15, 15, count))
    scale = rng.uniform(0.75, 1.1, count)
    aspect = np.sqrt(rng.uniform(0.8, 1.2, count))
    slant = rng.uniform(-0.3, 0.3, count)
    cos, sin = np.cos(angle), np.sin(angle)
    rotation = np.stack([np.stack([cos, -sin], -1), np.stack([sin, cos], -1)], -2)
    shape = np.zeros((count, 2, 2))
    shape[:, 0, 0], shape[:, 0, 1], shape[:, 1, 1] = scale * aspect, slant * scale, scale / aspect
    return {
        "linear": rotation @ shape,
        "shift": rng.uniform(-0.09, 0.09, (count, 2)),
        # a smooth displacement of the strokes: amplitude, frequency and phase of one sine per axis
        "warp_amplitude": rng.uniform(0.0, 0.05, (count, 2)),
        "warp_frequency": rng.uniform(1.0, 3.0, (count, 2)),
        "warp_phase": rng.uniform(0.0, 2 * np.pi, (count, 2)),
        "width": rng.uniform(1.4, 3.2, count),
        "brightness": rng.uniform(0.7, 1.0, count),
        "noise": rng.uniform(0.0, 0.12, count),
    }


def render(labels: np.ndarray, params: dict[str, np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """uint8 images (N, 28, 28) of the glyphs ``labels`` under the per-image ``params`` (one chunk)."""
    points = glyph_segments()[labels] - 0.5  # (N, S, 2 ends, 2 coords), centred on the image
    # warp in the glyph's own frame: x moves with y and y with x, so strokes bend instead of shifting
    amplitude, frequency, phase = (
        params[k][:, None, None, :] for k in ("warp_amplitude", "warp_frequency", "warp_phase")
    )
    points = points + amplitude * np.sin(frequency * np.pi * points[..., ::-1] + phase)
    points = np.einsum("nij,nsej->nsei", params["linear"], points) + params["shift"][:, None, None, :]
    # pixel units, where pixel (row r, column c) has its centre at (c + 0.5, r + 0.5); float32 from here on,
    # as the distance arrays below take most of the time
    points = ((points + 0.5) * IMAGE_SIDE).astype(np.float32)

    centres = np.arange(IMAGE_SIDE, dtype=np.float32) + 0.5
    px = np.tile(centres, IMAGE_SIDE)[None, None, :]  # (1, 1, 784) in row-major pixel order
    py = np.repeat(centres, IMAGE_SIDE)[None, None, :]
    ax, ay = points[:, :, 0, 0:1], points[:, :, 0, 1:2]  # (N, S, 1)
    dx, dy = points[:, :, 1, 0:1] - ax, points[:, :, 1, 1:2] - ay
    length2 = np.maximum(dx * dx + dy * dy, np.float32(1e-9))
    rel_x, rel_y = px - ax, py - ay
    along = np.clip((rel_x * dx + rel_y * dy) / length2, np.float32(0), np.float32(1))
    dist2 = ((rel_x - along * dx) ** 2 + (rel_y - along * dy) ** 2).min(axis=1)  # (N, 784)
    # anti-aliased stroke: full inside half the width, fading over one pixel at the edge
    ink = (
        np.clip(params["width"][:, None] / 2 + 0.5 - np.sqrt(dist2), 0.0, 1.0) * params["brightness"][:, None]
    )
    ink += rng.standard_normal(ink.shape) * params["noise"][:, None]
    return np.rint(np.clip(ink, 0.0, 1.0) * 255).astype(np.uint8).reshape(-1, IMAGE_SIDE, IMAGE_SIDE)


def synth_split(count: int, seed: int, split_index: int) -> tuple[np.ndarray, np.ndarray]:
    """(images (count, 28, 28) uint8, labels (count,) uint8) of one split."""
    rng = np.random.default_rng([seed, split_index])
    labels = rng.integers(0, NUM_CLASSES, count)
    params = _random_transforms(rng, count)
    images = np.empty((count, IMAGE_SIDE, IMAGE_SIDE), dtype=np.uint8)
    for start in range(0, count, CHUNK):
        chunk = slice(start, start + CHUNK)
        images[chunk] = render(labels[chunk], {k: v[chunk] for k, v in params.items()}, rng)
    return images, labels.astype(np.uint8)


# ---- files -----------------------------------------------------------------------------------------------


def idx_bytes(array: np.ndarray, magic: int) -> bytes:
    """An idx file's bytes: the magic number, one big-endian uint32 per dimension, the uint8 data."""
    header = magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


def write_gzip(path: Path, content: bytes) -> None:
    """``content`` gzip-compressed into ``path``, with no timestamp (the same data gives the same bytes)."""
    path.write_bytes(gzip.compress(content, compresslevel=6, mtime=0))


def existing_spec(out: Path) -> SynthMNISTSpec | None:
    """The spec a complete data set in ``out`` was generated with, or None if there is none."""
    found = read_manifest(out, SynthMNISTSpec)
    if found is None:
        return None
    spec, manifest = found
    complete = manifest.get("generator") == GENERATOR and all(
        (out / name).is_file() for name in manifest["files"]
    )
    return spec if complete else None


def write_synthetic_mnist(
    out: Path, spec: SynthMNISTSpec, progress: Callable[[str], None] | None = None
) -> Path:
    """Generate the data set into ``out`` (replacing a previous synthetic one) and return ``out``.

    Written into ``<out>.partial`` and moved into place at the end, so an interrupted run never leaves
    something that looks complete.
    """
    return write_data_set(
        Path(out),
        "synth-mnist",
        recognized=lambda path: existing_spec(path) is not None,
        fill=lambda partial: _write_files(partial, spec, progress or log.info),
    )


def _write_files(partial: Path, spec: SynthMNISTSpec, report: Callable[[str], None]) -> dict:
    """The four idx files (gzip); returns the manifest."""
    started = time.perf_counter()
    files = []
    splits = (("train", spec.train_samples), ("valid", spec.valid_samples))
    for split_index, (split, count) in enumerate(splits):
        images, labels = synth_split(count, spec.seed, split_index)
        images_name, labels_name = (f"{name}.gz" for name in SPLIT_FILES[split])
        write_gzip(partial / images_name, idx_bytes(images, IMAGES_MAGIC))
        write_gzip(partial / labels_name, idx_bytes(labels, LABELS_MAGIC))
        files += [images_name, labels_name]
        seconds = time.perf_counter() - started
        report(f"synth-mnist: wrote {images_name} and {labels_name} ({count} images, {seconds:.1f} s)")
    return {"generator": GENERATOR, "spec": asdict(spec), "files": files}


def spec_from_preset(preset: str, seed: int | None = None) -> SynthMNISTSpec:
    """The preset's spec, with its seed replaced when ``seed`` is given."""
    return preset_spec("synth-mnist", PRESETS, preset, seed=seed)


def generate(
    out: Path,
    preset: str,
    seed: int | None = None,
    if_missing: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """``dlscale data synth-mnist``: write preset ``preset`` into ``out`` (see the module docstring).

    ``if_missing``: do nothing when ``out`` already holds exactly this data set (per its manifest).
    """
    spec = spec_from_preset(preset, seed)
    report = progress or log.info
    if if_missing and existing_spec(Path(out)) == spec:
        report(f"synth-mnist: {out} already holds this data set ({MANIFEST}); nothing to do")
        return Path(out)
    report(
        f"synth-mnist: writing {out}: preset {preset}, {spec.train_samples} training and "
        f"{spec.valid_samples} test images, seed {spec.seed}"
    )
    return write_synthetic_mnist(Path(out), spec, report)
