"""CRPS training assembled (``train.loss: crps``): the training loss of :mod:`dlscale.training.ensemble_loss`
for a workload, and what it changes around it.

* The loss replaces the workload's own (one-step) or dlscale's multi-step loss; each model call reads the state
  and that member's noise. Validation, ``evaluate`` and the deterministic forecast call the model without noise,
  which a model in inference mode then reads as zero (``VisionTransformer.tokens``).
* The FLOP count: M members per sample, so M times one member's FLOPs (times K for rollouts).
* It needs the grid's latitudes (the loss is latitude-weighted, as the CRPS it is scored by): the workload's
  ``image_latitudes(data_cfg)``, and no ``training_loss`` of the workload's own (the two would each decide what
  a batch's loss is).
"""

from __future__ import annotations

import numpy as np

from dlscale.config.run_config import RunConfig
from dlscale.errors import ConfigError
from dlscale.perf.flops import Utilization
from dlscale.training.ensemble_loss import EnsembleCrpsLoss, MemberNoise
from dlscale.training.rollout_curriculum import RolloutCurriculum
from dlscale.workloads.protocol import Workload
from dlscale.workloads.user_code import raised_by_workload


def check_crps_workload(workload: Workload, cfg: RunConfig) -> None:
    """A ConfigError, before any data is read, when the workload cannot be trained on the CRPS."""
    if workload.training_loss is not None:
        raise ConfigError(
            f"{cfg.where}: train.loss crps asks dlscale for the ensemble's loss, and workload {workload.name!r} "
            "has its own training_loss; use one of them"
        )
    image_latitudes = getattr(workload, "image_latitudes", None)
    if not callable(image_latitudes):
        raise ConfigError(
            f"{cfg.where}: train.loss crps weights the CRPS by latitude, and workload {workload.name!r} gives no "
            "latitudes of its grid (an image_latitudes(data_cfg) method); use train.loss=workload"
        )


def crps_training_loss(
    workload: Workload, cfg: RunConfig, curriculum: RolloutCurriculum, first_position: int
) -> EnsembleCrpsLoss:
    """The CRPS loss of ``cfg.train.ensemble_members`` members for this rank, whose samples start at
    ``first_position`` of the global batch (the workload passed :func:`check_crps_workload`)."""
    image_latitudes = workload.image_latitudes  # type: ignore[attr-defined]
    with raised_by_workload(workload, "image_latitudes"):
        latitudes = np.asarray(image_latitudes(cfg.data), dtype=np.float64)
    grid = tuple(cfg.data.img_size)
    if latitudes.shape != (grid[0],):
        raise ConfigError(
            f"{cfg.where}: train.loss crps: workload {workload.name!r} gave {latitudes.shape} latitudes for an "
            f"image of {grid[0]} rows"
        )
    noise = MemberNoise(cfg.train.seed, cfg.model.noise_channels, grid)
    return EnsembleCrpsLoss(
        cfg.train.ensemble_members,
        noise,
        latitudes,
        curriculum,
        first_position,
        cfg.train.rollout_checkpointing,
    )


def ensemble_utilization(one_member: Utilization, members: int) -> Utilization:
    """The rating of a step that runs ``members`` members per sample: M times one member's FLOPs."""
    return Utilization(
        one_member.flops_per_sample * members,
        one_member.device_name,
        one_member.precision,
        warn_if_unknown=False,
    )
