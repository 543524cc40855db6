"""The ``checkpoint:`` config section: when checkpoints are written and how a run continues from one."""

from __future__ import annotations

import dataclasses
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
    # never: start fresh (refuses to overwrite an existing checkpoint); or the path of a checkpoint file, or
    # of a run directory or checkpoints directory (its ckpt_latest.pt)
    resume_weights_only: bool = False  # take only the model weights from `resume` (a path) and start a new
    # run from them: fresh optimizer, schedule and position; model keys may differ (fine-tuning)

    def __post_init__(self) -> None:
        if self.save_every_epochs < 1:
            raise InvalidValue("save_every_epochs", f"must be >= 1, got {self.save_every_epochs}")
        if self.save_every_steps is not None and self.save_every_steps < 1:
            raise InvalidValue("save_every_steps", f"must be >= 1 or null, got {self.save_every_steps}")
        if self.keep_last < 0:
            raise InvalidValue("keep_last", f"must be >= 0, got {self.keep_last}")
        if not self.resume:
            raise InvalidValue("resume", "must be 'auto', 'never' or a checkpoint path")
        if self.resume_weights_only and self.resume in ("auto", "never"):
            raise InvalidValue(
                "resume_weights_only",
                "needs the checkpoint to take the weights from: --resume PATH (a checkpoint file or run directory)",
            )


# ------------------------------------------------------------------------------------------- continuing a run

# Keys whose change between a checkpoint and the resumed run is expected and harmless.
_EXPECTED_CHANGES = {
    "checkpoint.resume",
    "checkpoint.resume_weights_only",
    # The run's length: raising it continues a finished run (the new plan is reported when the run starts).
    "train.num_epochs",
    "train.num_iters",
    # How a divergence is handled (changing it after one is the point) and the optional data check.
    "train.on_nonfinite",
    "train.nonfinite_check_every",
    "train.max_skipped_steps",
    "train.max_rollbacks",
    "train.rollback_lr_factor",
    "data.check_finite",
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
        if checkpoints.latest_path.is_file():
            return checkpoints.latest_path
        others = checkpoints.other_checkpoints()
        if others:
            # Starting afresh here would replace these with a new run's checkpoints at its first save.
            raise CheckpointError(
                f"{checkpoints.directory}: has no {checkpoints.LATEST_NAME} but holds "
                f"{', '.join(p.name for p in others)}: continue from one with --resume {others[0]}, or start "
                "a new run with another --run_num"
            )
        return None
    path = checkpoint_file(Path(cfg.resume).expanduser())
    if cfg.resume_weights_only and checkpoints.has_checkpoint() and path != checkpoints.latest_path:
        raise CheckpointError(
            f"{checkpoints.directory} already holds this run's own checkpoint; a weights-only start from {path} "
            "would train from step 0 and replace it. Continue this run with --resume auto, or start the "
            "weights-only run in another --run_num"
        )
    return path


def checkpoint_file(path: Path) -> Path:
    """``path`` itself when it is a file, else the latest checkpoint of the run or checkpoints directory it names."""
    if path.is_file():
        return path
    if path.is_dir():
        for candidate in (path / CheckpointDir.LATEST_NAME, path / "checkpoints" / CheckpointDir.LATEST_NAME):
            if candidate.is_file():
                return candidate
        raise CheckpointError(
            f"checkpoint.resume: {path} is a directory without {CheckpointDir.LATEST_NAME} (nor "
            f"checkpoints/{CheckpointDir.LATEST_NAME}); give a checkpoint file, a run directory or its "
            "checkpoints directory"
        )
    raise CheckpointError(
        f"checkpoint.resume: {path} does not exist (give a checkpoint file, a run or checkpoints directory, "
        "'auto' or 'never')"
    )


def load_for_resume(path: Path, checkpoints: CheckpointDir) -> dict[str, Any]:
    """Load ``path``; when it cannot be loaded, the error names the run's checkpoints that do load."""
    try:
        return load_checkpoint(path, map_location="cpu")  # load_state_dict moves tensors to the device
    except CheckpointError as exc:
        raise CheckpointError(f"{exc}. {recovery_hint(checkpoints, path)}") from None


def recovery_hint(checkpoints: CheckpointDir, broken: Path) -> str:
    """Which of the run's other checkpoints load, and how to continue from one (or what to do if none does)."""
    loadable: list[tuple[Path, str]] = []
    for candidate in checkpoints.other_checkpoints(include_latest=True):
        if candidate.resolve() == broken.resolve():
            continue
        try:
            progress = load_checkpoint(candidate, map_location="cpu").get("progress", {})
        except CheckpointError:
            continue
        position = f"epoch {progress.get('epoch', '?')}, global step {progress.get('global_step', '?')}"
        loadable.append((candidate, position))
    if loadable:
        listed = "; ".join(f"{path} ({position})" for path, position in loadable)
        return (
            f"Checkpoints of this run that load: {listed}. Continue from one with --resume {loadable[0][0]} "
            f"(move the damaged file aside to keep it)"
        )
    return (
        f"No other checkpoint in {checkpoints.directory} loads: move the damaged file aside and train again, or "
        "start a new run with another --run_num"
    )


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


def restore_training(setup: TrainingSetup, path: Path, weights_only: bool = False) -> TrainProgress:
    """Load a checkpoint into a freshly built run: weights, optimizer, position, RNG; return the position.

    Raises CheckpointError when the checkpoint cannot continue this run (another model shape, another global
    batch size, or a changed key that would reinterpret the saved weights); warns about other config changes,
    which then take effect from here on. With ``weights_only`` (``checkpoint.resume_weights_only``) only the
    weights are taken, changed model keys are allowed, and a fresh position is returned.
    """
    payload = load_for_resume(path, setup.checkpoints)
    source = str(path)
    for entry in ("model",) if weights_only else ("model", "optimizer", "progress", "rng", "meta"):
        if entry not in payload:
            raise CheckpointError(f"{source}: has no {entry!r} entry; it cannot resume a training run")
    meta = payload.get("meta", {})
    saved_workload = meta.get("workload")
    if saved_workload is not None and saved_workload != setup.config.workload:
        raise CheckpointError(
            f"{source}: was written by a {saved_workload!r} run, and this run trains {setup.config.workload!r} "
            "(two configs of the same name share a run directory); use another --run_num or --expdir"
        )
    _check_changes(payload.get("config", {}), setup, source, weights_only)
    # The checkpoint holds the serial model's state; each rank loads its own shards of it.
    load_model_state(setup.model, local_model_state(setup.model, payload["model"]), source)
    if weights_only:
        log.info("%s: took the model weights only; optimizer, LR schedule and position start afresh", source)
        return TrainProgress()
    saved_batch = meta.get("global_batch_size")
    if saved_batch != setup.global_batch_size:
        raise CheckpointError(
            f"{source}: was written with global batch size {saved_batch}, this run uses {setup.global_batch_size}; "
            "the data position and the LR schedule only carry over with the same global batch size"
        )
    optimizer_state = local_optimizer_state(setup.model, setup.optimizer, payload["optimizer"])
    load_optimizer_state(setup.optimizer, optimizer_state, source)
    setup.precision.load_state_dict(payload.get("grad_scaler"))
    saved_schedule = dict(payload.get("scheduler") or {})
    use_lr_scale(setup, float(saved_schedule.pop("scale", 1.0)))  # a rolled-back run keeps its lowered LR
    current_schedule = {k: v for k, v in setup.schedule.state_dict().items() if k != "scale"}
    if saved_schedule and saved_schedule != current_schedule:
        log.warning("%s: the LR schedule changed from %s to %s", source, saved_schedule, current_schedule)
    progress = TrainProgress.from_dict(payload["progress"], source)
    restore_rng_state(payload["rng"])
    return progress


def use_lr_scale(setup: TrainingSetup, scale: float) -> None:
    """Multiply the run's whole LR schedule by ``scale`` (the step reads the same schedule object)."""
    if scale != setup.schedule.scale:
        setup.schedule = dataclasses.replace(setup.schedule, scale=scale)
        setup.step.schedule = setup.schedule


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


def _check_changes(saved: dict[str, Any], setup: TrainingSetup, source: str, weights_only: bool) -> None:
    """Refuse changed keys that reinterpret the saved weights (unless only the weights are taken); warn about
    the other changes."""
    cfg = setup.config
    weight_keys = weight_defining_keys(cfg.model, cfg.data)
    changes, refused = [], []
    for key, old, new in _flat_differences(saved, cfg.to_dict()):
        if key in _EXPECTED_CHANGES or key.startswith(_EXPECTED_CHANGED_SECTIONS):
            continue
        if old is _ABSENT or new is _ABSENT:  # a key one dlscale version has and the other has not
            continue
        (refused if key in weight_keys else changes).append(f"{key}: {old!r} -> {new!r}")
    if refused and not weights_only:
        raise CheckpointError(
            f"{source}: this run changes keys that give the saved weights another meaning ({'; '.join(refused)}): "
            "the weights would load, but into a different model. Undo the change to continue the run, or start "
            "a new run from these weights with --resume PATH --resume_weights_only (and another --run_num)"
        )
    changes += refused
    if changes:
        log.warning("%s: resuming with a changed config (%s)", source, "; ".join(changes))


def weight_defining_keys(model_cfg: Any, data_cfg: Any) -> set[str]:
    """Dotted keys whose change reinterprets saved weights: every ``model.*`` key but the ones the model's config
    declares safe (``RESUME_SAFE_KEYS``, e.g. dropout), and the data keys its config declares
    (``WEIGHT_DEFINING_KEYS``, e.g. which channels feed the model)."""
    safe = set(getattr(model_cfg, "RESUME_SAFE_KEYS", ()))
    keys = {f"model.{f.name}" for f in dataclasses.fields(model_cfg) if f.name not in safe}
    keys |= {f"data.{name}" for name in getattr(data_cfg, "WEIGHT_DEFINING_KEYS", ())}
    return keys


_ABSENT = object()  # a key the other config does not have (written by another dlscale version)


def _flat_differences(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[tuple]:
    differences = []
    for key in sorted(set(saved) | set(current)):
        old, new = saved.get(key, _ABSENT), current.get(key, _ABSENT)
        if isinstance(old, dict) and isinstance(new, dict):
            differences.extend(_flat_differences(old, new, f"{prefix}{key}."))
        elif old != new:
            differences.append((f"{prefix}{key}", old, new))
    return differences
