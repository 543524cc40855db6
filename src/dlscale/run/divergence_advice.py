"""The paragraph a user reads when a run diverged: where and which rule fired, what was kept, what to try.

LRs come in two scales, and the message keeps them apart. The guard records the *scheduled* LR of the step
that diverged: ``optim.lr`` times the batch-size rule (``optim.lr_scaling`` from ``base_batch_size``), times
the warm-up or decay at that step, times the rollbacks' factor. A user sets ``optim.lr``, so the advice is in
that scale: the scheduled LR is printed with how it came from ``optim.lr``, and the ``--set optim.lr=...`` it
suggests is a quarter of the ``optim.lr`` that diverged (after rollbacks, of the lowered one), always below
the config's value.
"""

from __future__ import annotations

from dlscale.checkpoint.directory import CheckpointDir
from dlscale.config import RunConfig
from dlscale.training.divergence.policy import Divergence
from dlscale.training.optim_config import OptimConfig

SUGGESTED_LR_FRACTION = 0.25  # of the optim.lr that diverged: a clear step down, not a new search


def lr_origin(divergence: Divergence, optim: OptimConfig, global_batch_size: int) -> str:
    """How the scheduled LR of ``divergence`` came from ``optim.lr``, e.g. 'optim.lr 1e+05, x 0.125 by
    optim.lr_scaling sqrt from base_batch_size 1024 to global batch 16, x 0.5 by the warm-up at this step'."""
    factors = []
    peak = divergence.peak_lr if divergence.peak_lr is not None else optim.lr
    if peak != optim.lr:
        factors.append(
            f"x {peak / optim.lr:.3g} by optim.lr_scaling {optim.lr_scaling} from base_batch_size "
            f"{optim.base_batch_size} to global batch {global_batch_size}"
        )
    shape = divergence.lr / (peak * divergence.lr_scale)
    if abs(shape - 1.0) > 1e-6:
        phase = "the warm-up" if divergence.step < optim.warmup else f"the {optim.lr_schedule} schedule"
        factors.append(f"x {shape:.3g} by {phase} at this step")
    if divergence.lr_scale != 1.0:
        factors.append(f"x {divergence.lr_scale:.3g} by the rollbacks (train.rollback_lr_factor)")
    if not factors:
        return f"optim.lr {optim.lr:.4g} itself"
    return ", ".join([f"optim.lr {optim.lr:.4g}", *factors])


def suggested_lr(divergence: Divergence, optim: OptimConfig) -> float:
    """The ``optim.lr`` to try: a quarter of the one that diverged (lowered by rollbacks), below the
    config's."""
    return optim.lr * min(divergence.lr_scale, 1.0) * SUGGESTED_LR_FRACTION


def advice(divergence: Divergence, on_nonfinite: str, optim: OptimConfig) -> str:
    """What to try after ``divergence``, in one sentence, from what the run already tried (rollbacks lowered
    ``optim.lr`` by ``divergence.lr_scale``, and that LR diverged too)."""
    tried = optim.lr * divergence.lr_scale
    lowered = (
        f"optim.lr {optim.lr:.3g} lowered by the rollbacks to {tried:.3g}, which diverged too"
        if divergence.lr_scale != 1.0
        else f"optim.lr {optim.lr:.3g}"
    )
    suggestion = f"--set optim.lr={suggested_lr(divergence, optim):.3g}, a quarter of {lowered}"
    tips = [f"a lower learning rate (e.g. {suggestion})"]
    if optim.max_grad_norm is None:
        tips.append("gradient clipping (--set optim.max_grad_norm=1.0)")
    if optim.warmup == 0:
        tips.append("a warm-up (--set optim.warmup=100)")
    if on_nonfinite != "rollback":
        tips.append("train.on_nonfinite: rollback (reload the last good checkpoint and lower the LR)")
    listed = f"{', '.join(tips[:-1])} or {tips[-1]}" if len(tips) > 1 else tips[0]
    data = "--set data.check_finite=true names the file and sample that hold NaN or infinite values"
    if divergence.suspect_data:
        return f"Check the data first: {data}; if it is clean, try {listed}"
    return f"Try {listed}; if the data may hold NaN or infinite values, {data}"


def divergence_message(
    divergence: Divergence, cfg: RunConfig, checkpoints: CheckpointDir, global_batch_size: int
) -> str:
    """The one paragraph a user reads when a run diverged: where, what was kept, what to try."""
    latest = checkpoints.latest_path
    if not cfg.checkpoint.enabled:
        kept = "Checkpoints are disabled (checkpoint.enabled: false), so nothing was saved."
    elif latest.exists():
        kept = f"Nothing was saved after it; the last good checkpoint is {latest} (resume from it, or from "
        kept += f"{checkpoints.best_path.name} beside it, once the cause is fixed)."
    else:
        kept = "No checkpoint had been saved yet."
    where = divergence.describe(lr_origin(divergence, cfg.optim, global_batch_size))
    return f"training diverged {where}. {kept} {advice(divergence, cfg.train.on_nonfinite, cfg.optim)}."
