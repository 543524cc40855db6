"""Saving and restoring a whole training run: weights, optimizer, schedule, precision, RNG and position.

:func:`training_payload` is what a checkpoint holds; :func:`restore_training` loads one into a freshly built run
(and refuses one that cannot continue it); :class:`CheckpointRecovery` is what ``train.on_nonfinite: rollback``
goes back to.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from dlscale.checkpoint.directory import CheckpointDir
from dlscale.checkpoint.distributed_state import (
    load_model_shards,
    model_tensors,
    optimizer_parts,
    optimizer_state_from_shards,
)
from dlscale.checkpoint.files import load_model_state
from dlscale.checkpoint.noise_inputs import widened_for_noise
from dlscale.checkpoint.resume import (
    check_config_changes,
    check_workload,
    is_own_checkpoint,
    load_for_resume,
    load_optimizer_state,
)
from dlscale.checkpoint.sharded_files import is_sharded_checkpoint
from dlscale.checkpoint.sharded_state import (
    full_model_state,
    full_optimizer_state,
    local_model_state,
    local_optimizer_state,
)
from dlscale.checkpoint.sharded_writer import ShardedCheckpointWriter
from dlscale.checkpoint.weights_start import RECORD_KEY, weights_start_record
from dlscale.errors import CheckpointError
from dlscale.runtime.rng import capture_rng_state, restore_rng_state
from dlscale.training.observer import TrainerView
from dlscale.training.train_progress import TrainProgress
from dlscale.training.training_setup import TrainingSetup
from dlscale.version import __version__

log = logging.getLogger(__name__)


def training_payload(trainer: TrainerView) -> dict[str, Any]:
    """Everything needed to continue ``trainer``'s run exactly where it is now (a single-file checkpoint)."""
    setup = trainer.setup
    trainer.flush_loss()
    return {
        # Gathered to the serial model's shapes, so that any layout can continue from it.
        "model": full_model_state(setup.model),
        "optimizer": full_optimizer_state(setup.model, setup.optimizer),
        **_run_state(trainer),
    }


def sharded_training_state(trainer: TrainerView) -> tuple[dict[str, Any], dict[str, Any]]:
    """(this rank's tensors in the serial model's coordinates, the header with everything else) of a sharded
    checkpoint: no collective, no copy; any layout continues from it (see :mod:`.distributed_state`)."""
    setup = trainer.setup
    trainer.flush_loss()
    tensors = model_tensors(setup.model)
    optimizer_tensors, optimizer_rest = optimizer_parts(setup.model, setup.optimizer)
    tensors.update(optimizer_tensors)
    header = {
        "optimizer": optimizer_rest,
        **_run_state(trainer),
        "sharded": {"writer": "torch.distributed.checkpoint", "tensors": len(tensors)},
    }
    return tensors, header


def _run_state(trainer: TrainerView) -> dict[str, Any]:
    """A checkpoint's entries besides the model and optimizer tensors."""
    setup = trainer.setup
    return {
        "scheduler": setup.schedule.state_dict(),
        "grad_scaler": setup.precision.state_dict(),
        "rng": capture_rng_state(),
        "progress": trainer.progress.to_dict(),
        "config": setup.record.resolved,
        "meta": {
            "dlscale_version": __version__,
            "torch_version": str(torch.__version__),
            "config_name": setup.record.name,
            "workload": setup.record.workload,
            "world_size": setup.process.world_size,
            "layout": setup.mesh.shape.describe(),
            "global_batch_size": setup.global_batch_size,
            "saved_at": time.strftime("%Y-%m-%d %H:%M:%S"),
            "logger_runs": dict(setup.record.logger_runs),  # the wandb/MLflow runs a resume continues
            # A weights-only start's source: the same command launched again continues this run from here.
            RECORD_KEY: dict(setup.record.weights_start) or None,
        },
    }


def restore_training(
    setup: TrainingSetup,
    path: Path,
    checkpoints: CheckpointDir,
    weights_only: bool = False,
    argument: str | None = None,
) -> TrainProgress:
    """Load a checkpoint into a freshly built run: weights, optimizer, position, RNG; return the position.

    Raises CheckpointError when the checkpoint cannot continue this run (another model shape, another global
    batch size, or a changed key that would reinterpret the saved weights); warns about other config changes,
    which then take effect from here on. With ``weights_only`` (``checkpoint.resume_weights_only``) only the
    weights are taken, changed model keys are allowed, and a fresh position is returned; the run's checkpoints
    then record where the weights came from (``argument``: --resume as given), so that the same command
    continues the run later (:mod:`dlscale.checkpoint.weights_start`).
    """
    sharded = is_sharded_checkpoint(path)
    # Names the run's loadable checkpoints if it fails; of a sharded checkpoint only the header (no tensors).
    payload = load_for_resume(path, checkpoints)
    source = str(path)
    needed = ("model",) if weights_only else ("model", "optimizer", "progress", "rng", "meta")
    for entry in needed[1:] if sharded else needed:
        if entry not in payload:
            raise CheckpointError(f"{source}: has no {entry!r} entry; it cannot resume a training run")
    meta = payload.get("meta", {})
    check_workload(meta, setup.record, path, checkpoints)
    check_config_changes(payload.get("config", {}), setup.record, source, weights_only)
    # The checkpoint holds the serial model's state; each rank loads its own shards of it (from a sharded one,
    # DCP reads only those).
    if sharded:
        load_model_shards(setup.model, path, source, weights_only=weights_only)
    else:
        state = widened_for_noise(setup.model, payload["model"], source) if weights_only else payload["model"]
        load_model_state(setup.model, local_model_state(setup.model, state), source)
    if weights_only:
        log.info("%s: took the model weights only; optimizer, LR schedule and position start afresh", source)
        setup.record.weights_start.clear()
        if setup.process.is_main:  # the one that writes the checkpoints' header; it reads the file once more
            setup.record.weights_start.update(weights_start_record(argument or source, path, payload))
        return TrainProgress()
    saved_batch = meta.get("global_batch_size")
    if saved_batch != setup.global_batch_size:
        raise CheckpointError(
            f"{source}: was written with global batch size {saved_batch}, this run uses {setup.global_batch_size}; "
            "the data position and the LR schedule only carry over with the same global batch size"
        )
    if sharded:
        optimizer_state = optimizer_state_from_shards(
            setup.model, setup.optimizer, path, payload["optimizer"]
        )
    else:
        optimizer_state = local_optimizer_state(setup.model, setup.optimizer, payload["optimizer"])
    load_optimizer_state(setup.optimizer, optimizer_state, source)
    setup.precision.load_state_dict(payload.get("grad_scaler"))
    saved_schedule = dict(payload.get("scheduler") or {})
    setup.use_lr_scale(float(saved_schedule.pop("scale", 1.0)))  # a rolled-back run keeps its lowered LR
    current_schedule = {k: v for k, v in setup.schedule.state_dict().items() if k != "scale"}
    if saved_schedule and saved_schedule != current_schedule:
        log.warning("%s: the LR schedule changed from %s to %s", source, saved_schedule, current_schedule)
    if is_own_checkpoint(path, checkpoints):  # another run's checkpoint starts new wandb/MLflow runs
        continue_logger_runs(setup.record.logger_runs, meta.get("logger_runs"))
        # A weights-only start continued: its checkpoints go on saying where its weights came from.
        if isinstance(meta.get(RECORD_KEY), dict):
            setup.record.weights_start.update(meta[RECORD_KEY])
    progress = TrainProgress.from_dict(payload["progress"], source)
    restore_rng_state(payload["rng"])
    return progress


def continue_logger_runs(runs: dict[str, str], saved: Any) -> None:
    """Take into ``runs`` (the record's ``logger_runs``) the wandb/MLflow run ids that a checkpoint of this
    run saved (``meta.logger_runs``; None in a checkpoint written before dlscale kept them), so that the
    loggers reopen those runs. Only ids of runs not open yet: a rollback's restore leaves the open runs as
    they are."""
    if not isinstance(saved, dict):
        return
    for name, run_id in saved.items():
        if isinstance(name, str) and name and isinstance(run_id, str) and run_id:
            runs.setdefault(name, run_id)


class CheckpointRecovery:
    """The divergence guard's way back: the run's last good checkpoint (see ``train.on_nonfinite``)."""

    def __init__(
        self,
        setup: TrainingSetup,
        checkpoints: CheckpointDir,
        resumed_from: Path | None,
        sharded: ShardedCheckpointWriter | None = None,
    ):
        self.setup = setup
        self.checkpoints = checkpoints
        self.resumed_from = resumed_from
        self.sharded = sharded

    def last_good(self) -> Path | None:
        """This run's last save; before its first one, the checkpoint it resumed from (maybe another run's)."""
        if self.sharded is not None:
            self.sharded.finish()  # a save still being written is the last good one once it is complete
        latest = self.checkpoints.latest_path
        return latest if latest.exists() else self.resumed_from

    def restore(self, path: Path) -> TrainProgress:
        """The whole state of ``path`` (weights, optimizer, schedule, RNG); its position is returned."""
        return restore_training(self.setup, path, self.checkpoints)
