"""``--perturb``: what makes an ensemble's members differ, as the user writes it (``gaussian:SCALE[:LENGTH_KM]``,
``gaussian:auto`` or ``gaussian:FILE.json`` for per-channel scales, ``dropout``, or ``noise`` for a model with noise
inputs), checked before torch is imported; :mod:`dlscale.scoring.perturbations` makes the members.

The bounds and why:

* ``SCALE`` is in standard deviations of each channel over the training data (the model reads normalized states),
  so it is the perturbation's size against the whole variability of the field. The errors of an analysis are a
  few hundredths to a few tenths of that; 1 is a perturbation as large as the difference between two random
  days, and states more than a few standard deviations from the mean lie outside anything the model was trained
  on. So ``SCALE`` runs from ``MIN_SCALE`` (1e-6: float32 states of order 1 hold about 7 significant digits,
  so smaller noise is mostly rounded away and the members are copies of the control) to ``MAX_SCALE`` (10, far
  beyond any calibrated ensemble but still a finite input; ``gaussian:1e30`` gives members of NaN).
* ``LENGTH_KM`` is a correlation length over the sphere, so 0 (white noise) up to half the Earth's circumference
  (about 20,000 km, the largest distance between two points: a longer length correlates the whole globe alike
  and is refused).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from dlscale.errors import ConfigError

GAUSSIAN, DROPOUT, NOISE = "gaussian", "dropout", "noise"
AUTO = "auto"  # gaussian:auto: the run's own fitted per-channel scales
NO_NOISE_INPUTS = "the model reads no noise (model.noise_channels 0: it was not trained with train.loss crps)"
MIN_SCALE, MAX_SCALE = 1e-6, 10.0  # standard deviations of each channel (see the module's docstring)
# The Earth's radius WeatherBench2 uses (dlscale.scoring.spectra.EARTH_RADIUS_M; that module imports torch).
EARTH_RADIUS_KM = (6357 + 6378) / 2
HALF_CIRCUMFERENCE_KM = math.pi * EARTH_RADIUS_KM  # the largest great-circle distance


@dataclass(frozen=True)
class Perturbation:
    """What ``--perturb`` asked for: ``kind`` (gaussian or dropout), and for gaussian the scale in standard
    deviations and the correlation length in km (None: the default for the grid)."""

    kind: str
    scale: float = 0.0
    length_km: float | None = None
    # gaussian:auto or gaussian:FILE.json: scales per channel from a file (dlscale.scoring.perturbation_scales),
    # read once the run is known; channel_scales holds them then, in the data's channel order
    scales_from: str | None = None
    channel_scales: tuple[float, ...] | None = None

    def describe(self) -> str:
        if self.kind == DROPOUT:
            return "the model's dropout kept on in every member but the control"
        if self.kind == NOISE:
            return "the model's own noise inputs, drawn anew for every member and step (zero in the control)"
        length = "the grid's default length" if self.length_km is None else f"{self.length_km:g} km"
        if self.scales_from is not None:
            return f"Gaussian initial-state noise of per-channel scales ({self.scales_from}), correlated over {length}"
        return f"Gaussian initial-state noise of {self.scale:g} standard deviations, correlated over {length}"


def parse_perturbation(text: str) -> Perturbation:
    """``gaussian:SCALE[:LENGTH_KM]``, ``gaussian:auto``, ``gaussian:FILE.json``, ``dropout`` or ``noise`` -> a
    :class:`Perturbation`; anything else is a ConfigError naming the option and what it expects."""
    expected = (
        "expected gaussian:SCALE[:LENGTH_KM] (e.g. gaussian:0.05 or gaussian:0.05:500), gaussian:auto or "
        "gaussian:FILE.json (per-channel scales, dlscale fit-perturbation), dropout, or noise (a model trained "
        "with train.loss crps)"
    )
    parts = text.strip().split(":")
    kind = parts[0].strip().lower()
    if kind in (DROPOUT, NOISE) and len(parts) == 1:
        return Perturbation(kind)
    rest = text.strip()[len(parts[0]) + 1 :].strip()
    if kind == GAUSSIAN and (rest.lower() == AUTO or rest.lower().endswith(".json")):
        # a path may hold colons itself, so everything after gaussian: is the file; its length is the file's
        return Perturbation(GAUSSIAN, scales_from=AUTO if rest.lower() == AUTO else rest)
    if kind == GAUSSIAN and len(parts) >= 2 and parts[1].strip().lower() == AUTO:
        raise ConfigError(
            f"--perturb {text!r}: gaussian:auto takes no LENGTH_KM: the scales were fitted with a length, which "
            "their file holds"
        )
    if kind != GAUSSIAN or len(parts) not in (2, 3):
        raise ConfigError(f"--perturb {text!r}: {expected}")
    scale = _number(parts[1], text, "SCALE")
    if not scale > 0:
        raise ConfigError(
            f"--perturb {text!r}: SCALE must be a number above 0 (standard deviations), got {scale}"
        )
    if scale > MAX_SCALE:
        raise ConfigError(
            f"--perturb {text!r}: SCALE {scale:g} is beyond {MAX_SCALE:g} standard deviations of each channel, "
            "far outside the states the model was trained on (an analysis errs by a few hundredths to a few "
            "tenths); choose SCALE on the validation split, e.g. gaussian:0.05"
        )
    if scale < MIN_SCALE:
        raise ConfigError(
            f"--perturb {text!r}: SCALE {scale:g} is below {MIN_SCALE:g} standard deviations: float32 states "
            "(about 7 significant digits) keep almost nothing of it, and the members would be copies of the "
            "control; e.g. gaussian:0.05"
        )
    length = None
    if len(parts) == 3:
        length = _number(parts[2], text, "LENGTH_KM")
        if not length >= 0:
            raise ConfigError(f"--perturb {text!r}: LENGTH_KM must be 0 (white noise) or more, got {length}")
        if length > HALF_CIRCUMFERENCE_KM:
            raise ConfigError(
                f"--perturb {text!r}: LENGTH_KM {length:g} is beyond half the Earth's circumference "
                f"({HALF_CIRCUMFERENCE_KM:.0f} km, the largest distance on the globe): a correlation length runs "
                "from 0 (white noise) to that; the default is 500"
            )
    return Perturbation(GAUSSIAN, scale, length)


def _number(part: str, text: str, name: str) -> float:
    try:
        value = float(part)
    except ValueError:
        raise ConfigError(f"--perturb {text!r}: {name} {part!r} is not a number") from None
    if not math.isfinite(value):
        raise ConfigError(f"--perturb {text!r}: {name} must be a finite number, got {part!r}")
    return value


def check_ensemble_options(
    members: int, perturb: str | None, noise_model: bool | None = False
) -> Perturbation | None:
    """``--members`` and ``--perturb`` together: the perturbation of an ensemble of ``members`` (None for one
    member), or a ConfigError naming the option that is wrong and what it expects. ``noise_model``: whether the
    model reads noise (trained with ``train.loss crps``), whose ensemble draws it by default; None before the
    model is known (the command line's check: no ``--perturb`` then passes, and the forecast decides)."""
    if isinstance(members, bool) or not isinstance(members, numbers.Integral):
        raise ConfigError(
            f"--members {members!r}: expected a whole number of members >= 1 (1: the deterministic forecast)"
        )
    if members < 1:
        raise ConfigError(
            f"--members {members}: expected a number of members >= 1 (1: the deterministic forecast)"
        )
    if members == 1:
        if perturb is not None:
            raise ConfigError(
                f"--perturb {perturb}: perturbs the members of an ensemble; add --members N (N >= 2: the control "
                "and N - 1 perturbed members)"
            )
        return None
    if perturb is None:
        if noise_model:
            return Perturbation(NOISE)
        if noise_model is None:
            return None
        raise ConfigError(
            f"--members {members}: an ensemble needs --perturb gaussian:SCALE[:LENGTH_KM] or dropout (the scale "
            "that calibrates an ensemble depends on the model: choose it on the validation split); a model "
            "trained with train.loss crps draws its own noise"
        )
    perturbation = parse_perturbation(perturb)
    if perturbation.kind == NOISE and noise_model is False:
        raise ConfigError(
            f"--perturb {perturb}: {NO_NOISE_INPUTS}, so its members would all be the control; use --perturb "
            "gaussian:SCALE or dropout"
        )
    return perturbation
