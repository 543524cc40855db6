"""Between a run's config and the tune's settings: read them, and turn changed settings back into config keys.

The tune works on effective values (``train.local_batch_size`` is the local batch even when the config only sets
``global_batch_size``); a config, tuned or trial, gets them back in the config's own spelling. A changed batch
size also changes what the config's steps mean, so the tuned config keeps the run's length and warm-up in
*samples*: ``num_iters`` and ``warmup`` are scaled by old / new global batch (a config that counts epochs needs
nothing), and the config's own LR scaling rule (``optim.lr_scaling`` from ``base_batch_size``) sets the new LR.
"""

from __future__ import annotations

from typing import Any

from dlscale.config import RunConfig
from dlscale.run.assembly import batch_sizes
from dlscale.training.schedule import scaled_lr
from dlscale.tuning.knobs import BATCH_KEY, SETTING_KEYS


def read_settings(cfg: RunConfig, data_parallel_ranks: int) -> dict[str, Any]:
    """The tunable settings of ``cfg`` (effective values) on ``data_parallel_ranks`` replicas."""
    settings: dict[str, Any] = {}
    for key in SETTING_KEYS:
        if key == BATCH_KEY:
            settings[key] = batch_sizes(cfg, data_parallel_ranks)[1]
            continue
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        settings[key] = value
    return settings


def config_keys(cfg: RunConfig, settings: dict[str, Any], data_parallel_ranks: int) -> dict[str, Any]:
    """``settings`` that differ from ``cfg``'s, as the config keys that set them (the batch in the config's spelling)."""
    current = read_settings(cfg, data_parallel_ranks)
    keys: dict[str, Any] = {}
    for key, value in settings.items():
        if current.get(key) == value:
            continue
        if key == BATCH_KEY:
            if cfg.train.local_batch_size is not None:
                keys["train.local_batch_size"] = value
            else:
                keys["train.global_batch_size"] = value * data_parallel_ranks
        else:
            keys[key] = value
    return keys


def run_length_keys(
    cfg: RunConfig, new_global_batch: int, data_parallel_ranks: int
) -> tuple[dict[str, Any], list[str]]:
    """The keys that keep the run's length and warm-up in samples at ``new_global_batch``, and what they say."""
    old_global = batch_sizes(cfg, data_parallel_ranks)[0]
    if new_global_batch == old_global:
        return {}, []
    keys: dict[str, Any] = {}
    notes = []
    ratio = old_global / new_global_batch
    if cfg.train.num_epochs is None and cfg.train.num_iters is not None:
        keys["train.num_iters"] = max(1, round(cfg.train.num_iters * ratio))
        notes.append(
            f"train.num_iters {cfg.train.num_iters} -> {keys['train.num_iters']}: the same number of samples at "
            f"global batch {new_global_batch} instead of {old_global}"
        )
    if cfg.optim.warmup:
        keys["optim.warmup"] = max(1, round(cfg.optim.warmup * ratio))
        notes.append(
            f"optim.warmup {cfg.optim.warmup} -> {keys['optim.warmup']} steps: the same warm-up in samples"
        )
    return keys, notes


def lr_note(cfg: RunConfig, old_global: int, new_global: int) -> str:
    """What the config's LR scaling rule does to the peak LR when the global batch changes."""
    o = cfg.optim
    before = scaled_lr(o.lr, o.lr_scaling, old_global, o.base_batch_size)
    after = scaled_lr(o.lr, o.lr_scaling, new_global, o.base_batch_size)
    if o.lr_scaling == "none":
        return (
            f"the config's optim.lr_scaling is none, so the LR stays {after:.3g} at global batch {new_global} "
            "(set lr_scaling sqrt or linear and base_batch_size to scale it)"
        )
    return (
        f"LR {before:.3g} -> {after:.3g} by the config's {o.lr_scaling} rule (optim.lr_scaling; lr {o.lr:.3g} is "
        f"for base_batch_size {o.base_batch_size})"
    )
