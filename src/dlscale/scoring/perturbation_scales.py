"""Per-channel scales of ``--perturb gaussian``: the file ``dlscale fit-perturbation`` writes beside a run
(``perturbation_scales.json``) and ``--perturb gaussian:auto`` or ``gaussian:FILE.json`` reads (no torch).

One scale for every channel cannot calibrate channels whose errors grow at different rates (issue 50: 0.75 standard
deviations gave 5-day spread/skill ratios from 0.48 for u10 to 1.18 for t850), so each channel gets its own, in
standard deviations of that channel over the training data, as ``gaussian:SCALE`` is. The file::

    {"kind": "dlscale perturbation scales", "version": 1,
     "scales": {"z500": 1.9, "t850": 0.6, ...},   # every channel the model reads, each in [1e-6, 10]
     "length_km": 500.0,                          # the correlation length they were fitted with (null: the default)
     "fit": {...}}                                # how they were fitted: split, lead, members, each iteration's ratios

A file for other channels than the model's is refused (naming the missing and the extra ones), and so is a scale
outside ``gaussian:SCALE``'s bounds, a non-number, or a file that is not this kind of JSON.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dlscale.errors import ConfigError
from dlscale.scoring.perturbation_spec import HALF_CIRCUMFERENCE_KM, MAX_SCALE, MIN_SCALE, Perturbation

SCALES_FILE = "perturbation_scales.json"  # beside the run's config.yaml: what gaussian:auto reads
KIND = "dlscale perturbation scales"
VERSION = 1


@dataclass(frozen=True)
class ChannelScales:
    """Scales per channel name (standard deviations), the correlation length they go with (None: the grid's
    default), and the record of their fit."""

    scales: dict[str, float]
    length_km: float | None = None
    fit: dict[str, Any] = field(default_factory=dict)

    def for_channels(self, channel_names: list[str] | tuple[str, ...], source: str) -> tuple[float, ...]:
        """The scales in the order of ``channel_names``; a ConfigError when the file's channels are not exactly
        those."""
        missing = [name for name in channel_names if name not in self.scales]
        extra = [name for name in self.scales if name not in channel_names]
        if missing or extra:
            said = "; ".join(
                part
                for part in (
                    f"no scale for {', '.join(missing)}" if missing else "",
                    f"scales for channels the model does not read: {', '.join(extra)}" if extra else "",
                )
                if part
            )
            raise ConfigError(
                f"{source}: its scales are for other channels than the model's ({said}); the model reads "
                f"{', '.join(channel_names)}: fit them for this run with dlscale fit-perturbation"
            )
        return tuple(self.scales[name] for name in channel_names)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": KIND,
            "version": VERSION,
            "scales": dict(self.scales),
            "length_km": self.length_km,
            "fit": self.fit,
        }


def read_scales(path: Path) -> ChannelScales:
    """The scales file at ``path``, checked; a ConfigError naming the file and what is wrong with it."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: no such scales file (dlscale fit-perturbation RUN_DIR writes {SCALES_FILE} beside the run)"
        ) from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a scales file ({SCALES_FILE})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the scales file: {exc}") from None
    try:
        document = json.loads(text, parse_constant=_no_constant)
    except (json.JSONDecodeError, ValueError) as exc:
        raise ConfigError(f"{path}: not a JSON scales file ({exc})") from None
    except RecursionError:
        raise ConfigError(f"{path}: not a scales file (JSON nested too deep to read)") from None
    if not isinstance(document, dict) or document.get("kind") != KIND:
        raise ConfigError(f'{path}: not a scales file: expected a JSON object with "kind": "{KIND}"')
    if document.get("version") != VERSION:
        raise ConfigError(
            f"{path}: scales file version {document.get('version')!r}; this dlscale reads version {VERSION}"
        )
    scales = document.get("scales")
    if not isinstance(scales, dict) or not scales:
        raise ConfigError(f'{path}: "scales" must be an object of channel name -> scale, got {scales!r}')
    checked = {}
    for name, value in scales.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{path}: the scale of {name!r} must be a finite number, got {value!r}")
        if not MIN_SCALE <= value <= MAX_SCALE:
            raise ConfigError(
                f"{path}: the scale of {name!r} is {value:g}; a scale lies in [{MIN_SCALE:g}, {MAX_SCALE:g}] "
                "standard deviations of its channel (as gaussian:SCALE's)"
            )
        checked[str(name)] = float(value)
    length = document.get("length_km")
    if length is not None and (
        isinstance(length, bool)
        or not isinstance(length, (int, float))
        or not 0 <= length <= HALF_CIRCUMFERENCE_KM
    ):
        raise ConfigError(
            f'{path}: "length_km" must be null (the grid\'s default) or a number from 0 to '
            f"{HALF_CIRCUMFERENCE_KM:.0f} km, got {length!r}"
        )
    fit = document.get("fit") if isinstance(document.get("fit"), dict) else {}
    return ChannelScales(checked, None if length is None else float(length), fit)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def scales_source(spec: str, run_dir: Path | None) -> Path:
    """The file ``gaussian:auto`` (the run's own) or ``gaussian:FILE`` names; a ConfigError for auto without a
    run directory (a bare checkpoint file)."""
    if spec == "auto":
        if run_dir is None:
            raise ConfigError(
                "--perturb gaussian:auto reads the run's own perturbation_scales.json, but a bare checkpoint has "
                "no run directory: give the file, --perturb gaussian:PATH.json"
            )
        return run_dir / SCALES_FILE
    return Path(spec).expanduser()


def with_channel_scales(
    perturbation: Perturbation, run_dir: Path | None, channel_names: list[str] | tuple[str, ...]
) -> Perturbation:
    """``perturbation`` with the per-channel scales of the file that ``gaussian:auto`` or ``gaussian:FILE`` named,
    in the order of ``channel_names``, and the length they were fitted with; any other perturbation as it is."""
    if perturbation.scales_from is None:
        return perturbation
    path = scales_source(perturbation.scales_from, run_dir)
    found = read_scales(path)
    scales = found.for_channels(channel_names, str(path))
    return replace(
        perturbation,
        scales_from=str(path),
        channel_scales=scales,
        length_km=found.length_km,
        scale=max(scales),
    )
