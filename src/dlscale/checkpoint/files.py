"""Checkpoint files: loading either format, and strict model-state loading (the run's directory of them is
:mod:`dlscale.checkpoint.directory`).

A checkpoint is one ``torch.save`` file (:mod:`dlscale.checkpoint.single_file`, whose names this module also
offers) or a sharded checkpoint's directory (:mod:`dlscale.checkpoint.sharded_files`); :func:`load_checkpoint`
reads either, the directory consolidated to the single file's contents.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from dlscale.checkpoint.sharded_files import is_sharded_checkpoint, load_consolidated
from dlscale.checkpoint.single_file import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_VERSION,
    NotADlscaleCheckpoint,
    check_format_version,
    foreign_file_kind,
    load_checkpoint_file,
    save_checkpoint,
    write_checkpoint_atomically,
)
from dlscale.errors import CheckpointError

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_VERSION",
    "NotADlscaleCheckpoint",
    "check_format_version",
    "foreign_file_kind",
    "load_checkpoint",
    "load_model_state",
    "save_checkpoint",
    "write_checkpoint_atomically",
]

# Prefixes that wrappers add to every state_dict key: torch.compile (`_orig_mod.`) and DDP (`module.`).
_WRAPPER_PREFIXES = ("_orig_mod.", "module.")
_LIST_LIMIT = 8


def load_checkpoint(path: str | Path, map_location: Any = "cpu", optimizer: bool = True) -> dict[str, Any]:
    """Load a checkpoint file written by `save_checkpoint`, with torch's safe (weights_only) loader; or a sharded
    checkpoint's directory, consolidated on this one process (without ``optimizer``, its optimizer tensors are not
    read: the weights are all that export and evaluate need).

    Raises CheckpointError, naming the path, when the file is missing, corrupt or truncated, holds objects
    other than tensors and plain containers, is not a dlscale checkpoint, or comes from a newer dlscale; a
    sharded checkpoint also when its save did not complete.
    """
    path = Path(path)
    if path.is_dir() and is_sharded_checkpoint(path):
        return load_consolidated(path, ("model", "optimizer") if optimizer else ("model",))
    return load_checkpoint_file(path, map_location)


# -------------------------------------------------------------------------------------------- model state


def load_model_state(model: torch.nn.Module, state: Mapping[str, Any], source: str) -> None:
    """Load `state` into `model` strictly, after checking that every key and shape fits.

    Key prefixes added by torch.compile (`_orig_mod.`) and DDP (`module.`) are ignored on either side, so a
    checkpoint of a wrapped model loads into a bare one and vice versa. A mismatch raises CheckpointError that
    names `source` and lists the missing and unexpected keys and the shape mismatches.
    """
    if not isinstance(state, Mapping):
        raise CheckpointError(
            f"{source}: the model state is a {type(state).__name__}, expected a mapping of names to tensors"
        )
    model_state = model.state_dict()
    model_keys = canonical_names(list(model_state))
    ckpt_keys = canonical_names(list(state))

    missing = [model_keys[c] for c in model_keys if c not in ckpt_keys]
    unexpected = [ckpt_keys[c] for c in ckpt_keys if c not in model_keys]
    mismatched = []
    for canonical, model_key in model_keys.items():
        if canonical not in ckpt_keys:
            continue
        theirs, ours = state[ckpt_keys[canonical]], model_state[model_key]
        if isinstance(theirs, torch.Tensor) and isinstance(ours, torch.Tensor) and theirs.shape != ours.shape:
            mismatched.append(f"{model_key}: checkpoint {tuple(theirs.shape)} vs model {tuple(ours.shape)}")
    if missing or unexpected or mismatched:
        lines = [f"{source}: the checkpoint's model state does not fit the model:"]
        lines += _listing("missing from the checkpoint", missing)
        lines += _listing("unexpected in the checkpoint", unexpected)
        lines += _listing("shape mismatches", mismatched)
        lines.append(
            "The checkpoint was written for a different model configuration; compare the `model:` sections "
            "of the two configs."
        )
        raise CheckpointError("\n".join(lines))

    renamed = {model_keys[c]: state[ckpt_key] for c, ckpt_key in ckpt_keys.items()}
    try:
        model.load_state_dict(renamed, strict=True)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise CheckpointError(f"{source}: cannot load the model state: {exc}") from exc


def canonical_names(keys: list[str]) -> dict[str, str]:
    """Map each key, without the wrapper prefixes that *all* keys share, to the original key."""
    stripped = list(keys)
    changed = True
    while stripped and changed:
        changed = False
        for prefix in _WRAPPER_PREFIXES:
            if all(k.startswith(prefix) for k in stripped):
                stripped = [k[len(prefix) :] for k in stripped]
                changed = True
    return dict(zip(stripped, keys, strict=True))


def _listing(title: str, items: list[str]) -> list[str]:
    if not items:
        return []
    lines = [f"  {title} ({len(items)}):"]
    lines += [f"    {item}" for item in items[:_LIST_LIMIT]]
    if len(items) > _LIST_LIMIT:
        lines.append(f"    ... and {len(items) - _LIST_LIMIT} more")
    return lines
