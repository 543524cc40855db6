"""A weights-only start of a model with noise inputs from the same model without them (a deterministic model
fine-tuned into a CRPS-trained ensemble, as ECMWF's AIFS-CRPS starts from its deterministic AIFS).

The two differ only in the input weight that reads the noise channels after the state's (the ViT's
``patch_embed.proj.weight``: (D, C, p, p) in the checkpoint, (D, C + noise_channels, p, p) in the model). That
weight is widened with zeros for the noise channels, so the started model forecasts exactly what the checkpoint's
did, whatever its noise, and the CRPS loss then teaches it what to make of its noise (the zero weights get a
gradient: the noise times what reaches them). Every other mismatch is still the strict loader's to report.

Both checkpoint formats widen through :func:`noise_widening` (whether, and which weight) and
:meth:`NoiseWidening.widen`: a single file's state here (:func:`widened_for_noise`), a sharded checkpoint's weight
as DCP reads it (:func:`dlscale.checkpoint.distributed_state.load_model_shards`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dlscale.checkpoint.files import canonical_names

log = logging.getLogger("dlscale.train")


@dataclass(frozen=True)
class NoiseWidening:
    """The model's noise-input weight (``name``, as the serial model's state_dict names it), which the checkpoint
    holds without the model's ``channels`` noise input channels (dim 1)."""

    name: str
    channels: int

    def widen(self, saved: torch.Tensor, source: str) -> torch.Tensor:
        """The checkpoint's weight ``saved`` (all of it) with zero weights for the noise channels after its own."""
        zeros = saved.new_zeros((saved.shape[0], self.channels, *saved.shape[2:]))
        log.info(
            "%s: a model without noise inputs; %s widened from %d to %d input channels, the %d noise channels' "
            "weights starting at zero (the started model forecasts what the checkpoint's did)",
            source,
            self.name,
            saved.shape[1],
            saved.shape[1] + self.channels,
            self.channels,
        )
        return torch.cat([saved, zeros], dim=1)


def noise_widening(model: torch.nn.Module, saved_shapes: Mapping[str, Sequence[int]]) -> NoiseWidening | None:
    """What to widen when the model has noise inputs (``noise_channels`` >= 1 and a ``noise_input_weight``) and
    the checkpoint's weight of that name (``saved_shapes``: {serial name: shape in the checkpoint}) has the
    model's shape less exactly ``noise_channels`` input channels; None for any other checkpoint or model."""
    channels = int(getattr(model, "noise_channels", 0) or 0)
    name = getattr(model, "noise_input_weight", None)
    if channels < 1 or name is None or name not in saved_shapes:
        return None
    ours = dict(model.named_parameters()).get(name)
    if ours is None or ours.dim() < 2:  # a DTensor's shape is its global one, as the checkpoint's
        return None
    expected = (ours.shape[0], ours.shape[1] - channels, *ours.shape[2:])
    return NoiseWidening(name, channels) if tuple(saved_shapes[name]) == expected else None


def widened_for_noise(model: torch.nn.Module, state: Mapping[str, Any], source: str) -> Mapping[str, Any]:
    """``state`` with the model's noise-input weight widened by zeros when :func:`noise_widening` says so;
    otherwise ``state`` itself."""
    keys = canonical_names(list(state))
    shapes = {name: state[key].shape for name, key in keys.items() if isinstance(state[key], torch.Tensor)}
    widening = noise_widening(model, shapes)
    if widening is None:
        return state
    key = keys[widening.name]
    return {**state, key: widening.widen(state[key], source)}
