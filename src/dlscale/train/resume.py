"""The ``checkpoint:`` config section: when checkpoints are written and how a run continues from one."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dlscale import __version__
from dlscale.errors import CheckpointError, InvalidValue
from dlscale.parallel.sharded_state import (
    full_model_state,
    full_optimizer_state,
    local_model_state,
    local_optimizer_state,
)
from dlscale.runtime.rng import capture_rng_state, restore_rng_state
from dlscale.train.checkpoint import CheckpointDir, load_checkpoint, load_model_state
from dlscale.train.progress import TrainProgress

if TYPE_CHECKING:
    from dlscale.train.setup import TrainingSetup
    from dlscale.train.trainer import Trainer

log = logging.getLogger(__name__)


@dataclass
class CheckpointConfig:
    """Checkpoint frequency and resume policy."""

    enabled: bool = True  # write checkpoints (also on SIGTERM/SIGUSR1, and at the end of the run)
    save_every_epochs: int = 1  # write the latest checkpoint every N epochs
    save_every_steps: int | None = (
        None  # also every N optimizer steps (for long epochs); null = only per epoch
    )
    keep_best: bool = True  # keep a copy of the checkpoint with the lowest validation loss
    keep_last: int = 0  # also keep the N most recent step-numbered checkpoints (0 = only latest and best)
    resume: str = "auto"  # auto: continue from the run directory's latest checkpoint if there is one;
    # never: start fresh (refuses to overwrite an existing checkpoint); or the path of a checkpoint file

    def __post_init__(self) -> None:
        if self.save_every_epochs < 1:
            raise InvalidValue("save_every_epochs", f"must be >= 1, got {self.save_every_epochs}")
        if self.save_every_steps is not None and self.save_every_steps < 1:
            raise InvalidValue("save_every_steps", f"must be >= 1 or null, got {self.save_every_steps}")
        if self.keep_last < 0:
            raise InvalidValue("keep_last", f"must be >= 0, got {self.keep_last}")
        if not self.resume:
            raise InvalidValue("resume", "must be 'auto', 'never' or a checkpoint path")


# ------------------------------------------------------------------------------------------- continuing a run

# Keys whose change between a checkpoint and the resumed run is expected and harmless.
_EXPECTED_CHANGES = {
    "checkpoint.resume",
    "log.progress",
    "log.progress_interval_s",
    "loader.num_data_workers",
    "loader.data_loader_config",
    "loader.prefetch_depth",
    "loader.prefetch_factor",
    "loader.device_prefetch",
    "loader.pin_memory",
    "loader.persistent_workers",
    # The layout: a checkpoint holds the serial model's state, so any layout continues it.
    "parallel.tensor_parallel",
    "parallel.context_parallel",
    "parallel.parallel_order",
    "parallel.data_parallel",
}
# Whole sections that only observe a run: changing them between attempts is normal.
_EXPECTED_CHANGED_SECTIONS = ("profile.", "bench.")


def resume_source(cfg: CheckpointConfig, checkpoints: CheckpointDir) -> Path | None:
    """The checkpoint a run continues from, or None for a fresh start (see ``CheckpointConfig.resume``)."""
    if cfg.resume == "never":
        if checkpoints.has_checkpoint():
            raise CheckpointError(
                f"{checkpoints.directory} already holds a checkpoint and checkpoint.resume is 'never': "
                "continue it with --resume auto, or start a separate run with another --run_num"
            )
        return None
    if cfg.resume == "auto":
        return checkpoints.latest_path if checkpoints.latest_path.is_file() else None
    path = Path(cfg.resume).expanduser()
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint.resume: {path} does not exist (give a checkpoint file, 'auto' or 'never')"
        )
    return path


def training_payload(trainer: Trainer) -> dict[str, Any]:
    """Everything needed to continue ``trainer``'s run exactly where it is now."""
    setup = trainer.setup
    trainer.flush_loss()
    return {
        # Gathered to the serial model's shapes, so that any layout can continue from it.
        "model": full_model_state(setup.model),
        "optimizer": full_optimizer_state(setup.model, setup.optimizer),
        "scheduler": setup.schedule.state_dict(),
        "grad_scaler": setup.precision.state_dict(),
        "rng": capture_rng_state(),
        "progress": trainer.progress.to_dict(),
        "config": setup.config.to_dict(),
        "meta": {
            "dlscale_version": __version__,
            "torch_version": str(torch.__version__),
            "config_name": setup.config.name,
            "workload": setup.config.workload,
            "world_size": setup.process.world_size,
            "layout": setup.mesh.shape.describe(),
            "global_batch_size": setup.global_batch_size,
            "saved_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        },
    }


def restore_training(setup: TrainingSetup, path: Path) -> TrainProgress:
    """Load a checkpoint into a freshly built run: weights, optimizer, position, RNG; return the position.

    Raises CheckpointError when the checkpoint cannot continue this run (another model shape, another global
    batch size); warns about other config changes, which then take effect from here on.
    """
    payload = load_checkpoint(path, map_location="cpu")  # load_state_dict moves tensors to the device
    source = str(path)
    for entry in ("model", "optimizer", "progress", "rng", "meta"):
        if entry not in payload:
            raise CheckpointError(f"{source}: has no {entry!r} entry; it cannot resume a training run")
    saved_workload = payload["meta"].get("workload")
    if saved_workload is not None and saved_workload != setup.config.workload:
        raise CheckpointError(
            f"{source}: was written by a {saved_workload!r} run, and this run trains {setup.config.workload!r} "
            "(two configs of the same name share a run directory); use another --run_num or --expdir"
        )
    saved_batch = payload["meta"].get("global_batch_size")
    if saved_batch != setup.global_batch_size:
        raise CheckpointError(
            f"{source}: was written with global batch size {saved_batch}, this run uses {setup.global_batch_size}; "
            "the data position and the LR schedule only carry over with the same global batch size"
        )
    # The checkpoint holds the serial model's state; each rank loads its own shards of it.
    load_model_state(setup.model, local_model_state(setup.model, payload["model"]), source)
    optimizer_state = local_optimizer_state(setup.model, setup.optimizer, payload["optimizer"])
    load_optimizer_state(setup.optimizer, optimizer_state, source)
    setup.precision.load_state_dict(payload.get("grad_scaler"))
    _warn_about_changes(payload.get("config", {}), setup.config.to_dict(), source)
    saved_schedule = payload.get("scheduler")
    if saved_schedule and saved_schedule != setup.schedule.state_dict():
        log.warning(
            "%s: the LR schedule changed from %s to %s", source, saved_schedule, setup.schedule.state_dict()
        )
    progress = TrainProgress.from_dict(payload["progress"], source)
    restore_rng_state(payload["rng"])
    return progress


# How the optimizer runs, not what it computes: these follow this run's config, not the checkpoint's.
_EXECUTION_FLAGS = ("fused", "foreach", "capturable")


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any], source: str) -> None:
    """Load moments and step counts, but keep this run's execution flags.

    ``Optimizer.load_state_dict`` takes every hyper-parameter of the saved param groups, including ``fused``
    and ``capturable``: without this, a run resumed with ``--enable_fused`` or CUDA graphs would silently run
    the way the checkpoint's run did.
    """
    flags = [{k: group[k] for k in _EXECUTION_FLAGS if k in group} for group in optimizer.param_groups]
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError) as exc:
        raise CheckpointError(
            f"{source}: its optimizer state does not fit this run's optimizer: {exc}"
        ) from None
    for group, own_flags in zip(optimizer.param_groups, flags, strict=True):
        group.update(own_flags)
        on_device = bool(group.get("fused") or group.get("capturable"))
        for param in group["params"]:
            step = optimizer.state.get(param, {}).get("step")
            if torch.is_tensor(step):
                # Fused and capturable steps keep the count on the parameter's device; the others on the host.
                device = param.device if on_device else torch.device("cpu")
                optimizer.state[param]["step"] = step.to(device=device, dtype=torch.float32)


def _warn_about_changes(saved: dict[str, Any], current: dict[str, Any], source: str) -> None:
    changes = [
        f"{key}: {old!r} -> {new!r}"
        for key, old, new in _flat_differences(saved, current)
        if key not in _EXPECTED_CHANGES and not key.startswith(_EXPECTED_CHANGED_SECTIONS)
    ]
    if changes:
        log.warning("%s: resuming with a changed config (%s)", source, "; ".join(changes))


def _flat_differences(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[tuple]:
    differences = []
    for key in sorted(set(saved) | set(current)):
        old, new = saved.get(key), current.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            differences.extend(_flat_differences(old, new, f"{prefix}{key}."))
        elif old != new:
            differences.append((f"{prefix}{key}", old, new))
    return differences
