"""A weights-only start of a model with noise inputs from the same model without them (a deterministic model
fine-tuned into a CRPS-trained ensemble, as ECMWF's AIFS-CRPS starts from its deterministic AIFS).

The two differ only in the input weight that reads the noise channels after the state's (the ViT's
``patch_embed.proj.weight``: (D, C, p, p) in the checkpoint, (D, C + noise_channels, p, p) in the model). That
weight is widened with zeros for the noise channels, so the started model forecasts exactly what the checkpoint's
did, whatever its noise, and the CRPS loss then teaches it what to make of its noise (the zero weights get a
gradient: the noise times what reaches them). Every other mismatch is still the strict loader's to report.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from dlscale.checkpoint.files import canonical_names

log = logging.getLogger("dlscale.train")


def widened_for_noise(model: torch.nn.Module, state: Mapping[str, Any], source: str) -> Mapping[str, Any]:
    """``state`` with the model's noise-input weight (its ``noise_input_weight`` name) widened by zeros when the
    checkpoint's lacks exactly the model's ``noise_channels`` input channels; otherwise ``state`` itself."""
    channels = int(getattr(model, "noise_channels", 0) or 0)
    name = getattr(model, "noise_input_weight", None)
    if channels < 1 or name is None:
        return state
    keys = canonical_names(list(state))
    if name not in keys:
        return state
    theirs = state[keys[name]]
    ours = dict(model.named_parameters()).get(name)
    if not isinstance(theirs, torch.Tensor) or ours is None or theirs.dim() < 2:
        return state
    expected = (ours.shape[0], ours.shape[1] - channels, *ours.shape[2:])
    if tuple(theirs.shape) != expected:
        return state
    zeros = theirs.new_zeros((theirs.shape[0], channels, *theirs.shape[2:]))
    log.info(
        "%s: a model without noise inputs; %s widened from %d to %d input channels, the %d noise channels' "
        "weights starting at zero (the started model forecasts what the checkpoint's did)",
        source,
        name,
        theirs.shape[1],
        ours.shape[1],
        channels,
    )
    return {**state, keys[name]: torch.cat([theirs, zeros], dim=1)}
