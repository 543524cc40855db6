"""`dlscale data synth-cifar`: a learnable 100-class image task in CIFAR-100's binary format.

    OUT/cifar-100-binary/train.bin, test.bin            3074-byte records (coarse, fine, 32x32 R, G, B planes)
    OUT/cifar-100-binary/fine_label_names.txt, coarse_label_names.txt    one name per line, as in the real archive
    OUT/manifest.json                                                    how it was generated (written last)

Fine class = colour x pattern: 10 colours (hues around the colour wheel, on a dark or light background) times
10 patterns, 5 textures (stripes at 0, 45, 90 and 135 degrees, a checkerboard) and 5 shapes (disk, ring, square,
cross, triangle). ``fine = 10 * colour + pattern`` and, as in CIFAR-100, every fine class has one superclass:
``coarse = fine // 5`` (a colour's textures, or its shapes). Each image draws its own position shift, size,
stripe period, angle jitter, colour jitter, contrast and pixel noise, so a classifier must find the pattern
anywhere in a noisy image, not a fixed template. Classes are balanced in every split.
"""

from __future__ import annotations

import colorsys
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from dlscale.data.cifar.config import IMAGE_SIDE
from dlscale.data.cifar.dataset import BINARY_DIR, RECORD_BYTES, SPLIT_FILES
from dlscale.data.synth_output import MANIFEST, preset_spec, read_manifest, write_data_set
from dlscale.errors import DataError

log = logging.getLogger(__name__)

CHUNK = 4096  # images drawn at once (bounds memory for any size)
COLOURS = ("red", "orange", "yellow", "green", "spring", "cyan", "azure", "blue", "purple", "pink")
PATTERNS = (
    "horizontal_stripes",
    "diagonal_stripes",
    "vertical_stripes",
    "antidiagonal_stripes",
    "checkerboard",
    "disk",
    "ring",
    "square",
    "cross",
    "triangle",
)
NUM_FINE = len(COLOURS) * len(PATTERNS)


@dataclass(frozen=True)
class SynthCIFARSpec:
    """What to generate."""

    train: int = 5_000  # records in train.bin
    test: int = 1_000  # records in test.bin
    seed: int = 0
    noise: float = 0.08  # standard deviation of the i.i.d. pixel noise, on the [0, 1] scale

    def __post_init__(self) -> None:
        if self.train < 1 or self.test < 1:
            raise DataError(
                f"synth-cifar: train and test need at least one record, got {self.train}, {self.test}"
            )
        if self.noise < 0:
            raise DataError(f"synth-cifar: noise must be >= 0, got {self.noise}")


# `tiny` is for tests (generates in a few milliseconds), `demo` for the CPU demo config, `full` has CIFAR-100's
# sizes (50,000 / 10,000 records, 184 MB).
PRESETS: dict[str, SynthCIFARSpec] = {
    "tiny": SynthCIFARSpec(train=2_000, test=500),
    "demo": SynthCIFARSpec(),
    "full": SynthCIFARSpec(train=50_000, test=10_000),
}


def fine_label_names() -> list[str]:
    """The 100 fine class names, in label order."""
    return [f"{colour}_{pattern}" for colour in COLOURS for pattern in PATTERNS]


def coarse_label_names() -> list[str]:
    """The 20 superclass names, in label order."""
    return [f"{colour}_{kind}" for colour in COLOURS for kind in ("textures", "shapes")]


def _palette() -> tuple[np.ndarray, np.ndarray]:
    """(foreground, background) RGB colours on [0, 1] of each colour class, shapes (10, 3)."""
    foreground, background = [], []
    for index in range(len(COLOURS)):
        hue = index / len(COLOURS)
        foreground.append(colorsys.hsv_to_rgb(hue, 0.85, 0.95))
        # Alternating dark and light backgrounds, tinted with the opposite hue: the mean colour of an image
        # then says little about its pattern.
        value = 0.2 if index % 2 == 0 else 0.55
        background.append(colorsys.hsv_to_rgb((hue + 0.5) % 1.0, 0.3, value))
    return np.asarray(foreground), np.asarray(background)


def _signed_distance(
    kind: int, u: np.ndarray, v: np.ndarray, period: np.ndarray, size: np.ndarray
) -> np.ndarray:
    """Positive inside the foreground of pattern ``kind``, about one unit per pixel near its edges."""
    if kind < 4:  # stripes across v (the rotation made them horizontal, diagonal, vertical, antidiagonal)
        return 2.0 * np.sin(2 * np.pi * v / period)
    if kind == 4:
        return 2.0 * np.sin(2 * np.pi * u / period) * np.sin(2 * np.pi * v / period)
    radius = np.sqrt(u**2 + v**2)
    if kind == 5:
        return size - radius
    if kind == 6:
        return 1.6 - np.abs(radius - size)
    if kind == 7:
        return 0.85 * size - np.maximum(np.abs(u), np.abs(v))
    if kind == 8:
        arm = 1.1 * size
        return np.maximum(
            np.minimum(2.2 - np.abs(u), arm - np.abs(v)), np.minimum(2.2 - np.abs(v), arm - np.abs(u))
        )
    return np.minimum(size / 2 - v, 0.6 * (v + size) - np.abs(u))  # triangle, apex up


def _pattern_masks(pattern: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Soft foreground masks (B, 32, 32) on [0, 1] of each image's pattern, with random pose and size."""
    count = pattern.shape[0]
    coords = np.arange(IMAGE_SIDE, dtype=np.float32) - (IMAGE_SIDE - 1) / 2
    shift = rng.uniform(-6.0, 6.0, size=(count, 2)).astype(np.float32)
    # Stripe orientation: pattern 0..3 -> 0, 45, 90, 135 degrees; the others get a small tilt only.
    base_angle = np.where(pattern < 4, pattern * np.pi / 4, 0.0)
    angle = (base_angle + rng.uniform(-0.15, 0.15, size=count)).astype(np.float32)
    period = rng.uniform(6.0, 9.0, size=count).astype(np.float32)
    size = rng.uniform(6.0, 10.0, size=count).astype(np.float32)
    masks = np.empty((count, IMAGE_SIDE, IMAGE_SIDE), dtype=np.float32)
    for kind in range(len(PATTERNS)):
        chosen = np.flatnonzero(pattern == kind)
        if not chosen.size:
            continue
        y = coords[None, :, None] - shift[chosen, 0, None, None]
        x = coords[None, None, :] - shift[chosen, 1, None, None]
        cos, sin = np.cos(angle[chosen])[:, None, None], np.sin(angle[chosen])[:, None, None]
        u, v = x * cos + y * sin, y * cos - x * sin
        signed = _signed_distance(kind, u, v, period[chosen, None, None], size[chosen, None, None])
        masks[chosen] = 0.5 * (1.0 + np.tanh(1.5 * signed))  # an edge about a pixel wide: no aliasing
    return masks


def draw_images(fine: np.ndarray, rng: np.random.Generator, noise: float) -> np.ndarray:
    """uint8 images (B, 3, 32, 32) of the fine classes ``fine`` (B,)."""
    colour, pattern = fine // len(PATTERNS), fine % len(PATTERNS)
    foreground, background = _palette()
    count = fine.shape[0]
    fg = np.clip(foreground[colour] + rng.normal(0, 0.06, size=(count, 3)), 0, 1).astype(np.float32)
    bg = np.clip(background[colour] + rng.normal(0, 0.06, size=(count, 3)), 0, 1).astype(np.float32)
    contrast = rng.uniform(0.6, 1.0, size=count).astype(np.float32)[:, None, None, None]
    masks = _pattern_masks(pattern, rng)[:, None] * contrast
    images = bg[:, :, None, None] + (fg - bg)[:, :, None, None] * masks
    images += noise * rng.standard_normal(size=images.shape, dtype=np.float32)
    return np.clip(np.rint(images * 255), 0, 255).astype(np.uint8)


def split_bytes(spec: SynthCIFARSpec, split_index: int, count: int) -> bytes:
    """``count`` balanced, shuffled records of one split (0 train, 1 test), in the binary format."""
    rng = np.random.default_rng([spec.seed, split_index])
    fine = rng.permutation(np.arange(count) % NUM_FINE)
    records = np.empty((count, RECORD_BYTES), dtype=np.uint8)
    records[:, 0] = fine // 5
    records[:, 1] = fine
    for start in range(0, count, CHUNK):
        stop = min(start + CHUNK, count)
        records[start:stop, 2:] = draw_images(fine[start:stop], rng, spec.noise).reshape(stop - start, -1)
    return records.tobytes()


def spec_from_preset(preset: str, seed: int | None = None) -> SynthCIFARSpec:
    """The spec of a preset, with another seed when ``seed`` is given."""
    return preset_spec("synth-cifar", PRESETS, preset, seed=seed)


def existing_spec(out: Path) -> SynthCIFARSpec | None:
    """The spec of a complete data set in ``out``, or None if there is none (or its files are incomplete)."""
    found = read_manifest(out, SynthCIFARSpec)
    if found is None:
        return None
    spec = found[0]
    for split, count in (("train", spec.train), ("valid", spec.test)):
        path = Path(out) / BINARY_DIR / SPLIT_FILES[split]
        if not path.is_file() or path.stat().st_size != count * RECORD_BYTES:
            return None
    return spec


def write_synthetic_cifar(
    out: str | Path, spec: SynthCIFARSpec, progress: Callable[[str], None] | None = None
) -> Path:
    """Generate the data set into ``out`` (replacing a previous synthetic one) and return ``out``.

    Files are written into ``<out>.partial`` and moved into place at the end, so an interrupted run never
    leaves something that looks complete.
    """
    return write_data_set(
        Path(out),
        "synth-cifar",
        recognized=lambda path: (path / MANIFEST).is_file(),
        fill=lambda partial: _write_files(partial, spec, progress or log.info),
    )


def _write_files(partial: Path, spec: SynthCIFARSpec, report: Callable[[str], None]) -> dict:
    """train.bin, test.bin and the label names in cifar-100-binary/; returns the manifest."""
    (partial / BINARY_DIR).mkdir()
    for split_index, (split, count) in enumerate((("train", spec.train), ("valid", spec.test))):
        path = partial / BINARY_DIR / SPLIT_FILES[split]
        path.write_bytes(split_bytes(spec, split_index, count))
        report(f"synth-cifar: wrote {BINARY_DIR}/{path.name} ({count} records)")
    (partial / BINARY_DIR / "fine_label_names.txt").write_text("\n".join(fine_label_names()) + "\n")
    (partial / BINARY_DIR / "coarse_label_names.txt").write_text("\n".join(coarse_label_names()) + "\n")
    return {"generator": "dlscale synth-cifar", "format": "CIFAR-100 binary", "spec": asdict(spec)}


def generate(
    out: Path, preset: str, seed: int | None, if_missing: bool, progress: Callable[[str], None]
) -> Path:
    """`dlscale data synth-cifar`: write preset ``preset`` into ``out`` unless ``if_missing`` and it is there."""
    spec = spec_from_preset(preset, seed)
    if if_missing and existing_spec(out) == spec:
        progress(f"synth-cifar: {out} already holds this data set ({MANIFEST}); nothing to do")
        return out
    progress(
        f"synth-cifar: writing {out}: {spec.train} training and {spec.test} test images (preset {preset})"
    )
    return write_synthetic_cifar(out, spec, progress)
