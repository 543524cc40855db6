"""The ``train:`` config section: run length, batch size, seed, and how each step is executed (no torch:
:mod:`dlscale.config` reads it without loading the trainer)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from dlscale.errors import InvalidValue


@dataclass
class TrainConfig:
    """Run length, batch size, seed, and how each training step is executed."""

    global_batch_size: int = 16  # samples per optimizer step, summed over data-parallel ranks
    local_batch_size: int | None = None  # per-rank batch; when set, global_batch_size = local x ranks
    num_iters: int | None = 30000  # optimizer steps; the run trains num_iters // steps_per_epoch whole epochs
    num_epochs: int | None = None  # when set, wins over num_iters
    seed: int = 0  # model init, data order and dropout; the same seed and config give the same losses
    amp_mode: Literal["none", "fp16", "bf16"] = "none"  # mixed precision (autocast; fp16 adds a GradScaler)
    tf32: bool = (
        True  # TF32 tensor cores for fp32 matmuls and convolutions on GPUs (as in NVIDIA's containers)
    )
    enable_jit: bool = False  # compile the model with torch.compile
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = (
        "default"  # torch.compile's mode when enable_jit is on
    )
    cuda_graphs: bool = False  # capture forward + loss + backward (and the optimizer step) in a CUDA graph
    graph_warmup_steps: int = 20  # eager steps on a side stream before capture (the tutorial uses 20)
    deterministic: bool = False  # deterministic kernels on GPUs (slower); CPU runs are deterministic anyway
    # What a NaN or infinite loss/gradient does (docs/troubleshooting.md): stop the run without saving
    # over the last good checkpoint; skip the update (a host sync every step); or roll back to that checkpoint
    # and lower the LR.
    on_nonfinite: Literal["stop", "skip", "rollback"] = "stop"
    nonfinite_check_every: int = 10  # steps between reads of the device's non-finite flag (one sync each)
    max_skipped_steps: int = 10  # skip: the run stops as diverged after more skipped updates than this
    max_rollbacks: int = 3  # rollback: the run stops as diverged when it diverges again after this many
    rollback_lr_factor: float = 0.5  # rollback: multiplies the LR (the whole schedule) at each rollback
    # A finite explosion (dlscale.training.divergence.loss_spike): a step loss above loss_spike_factor x the median of the
    # last loss_spike_window steps' losses is a sign of trouble in every policy, as NaN is; 0 switches it off.
    loss_spike_factor: float = 100.0
    loss_spike_window: int = 50
    # skip: after a skipped update, checkpoints wait until this many steps in a row have trained normally, so
    # a run that then diverges (or ends) still has the checkpoint from before its trouble as its latest
    healthy_steps_before_save: int = 1

    def __post_init__(self) -> None:
        for name in ("global_batch_size", "local_batch_size", "num_iters", "num_epochs"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InvalidValue(name, f"must be >= 1, got {value}")
        if self.num_iters is None and self.num_epochs is None:
            raise InvalidValue("num_iters", "set num_iters or num_epochs (both are null)")
        if self.graph_warmup_steps < 1:
            raise InvalidValue("graph_warmup_steps", f"must be >= 1, got {self.graph_warmup_steps}")
        if self.nonfinite_check_every < 1:
            raise InvalidValue("nonfinite_check_every", f"must be >= 1, got {self.nonfinite_check_every}")
        if not (math.isfinite(self.loss_spike_factor) and self.loss_spike_factor >= 0):
            raise InvalidValue(
                "loss_spike_factor", f"must be >= 0 (0 switches the check off), got {self.loss_spike_factor}"
            )
        if 0 < self.loss_spike_factor <= 1:
            raise InvalidValue(
                "loss_spike_factor",
                f"must be above 1 (a loss that many times its recent median is an explosion), or 0 for off; "
                f"got {self.loss_spike_factor}",
            )
        if self.loss_spike_window < 1:
            raise InvalidValue("loss_spike_window", f"must be >= 1, got {self.loss_spike_window}")
        for name in ("max_skipped_steps", "max_rollbacks", "healthy_steps_before_save"):
            if getattr(self, name) < 0:
                raise InvalidValue(name, f"must be >= 0, got {getattr(self, name)}")
        if not (math.isfinite(self.rollback_lr_factor) and 0.0 < self.rollback_lr_factor <= 1.0):
            raise InvalidValue("rollback_lr_factor", f"must be in (0, 1], got {self.rollback_lr_factor}")
        if self.cuda_graphs and self.on_nonfinite != "stop":
            raise InvalidValue(
                "on_nonfinite",
                f"{self.on_nonfinite!r} cannot be combined with cuda_graphs: a captured step can neither decide "
                "on the host to skip its update nor take reloaded optimizer state; use 'stop' with graphs",
            )
        if self.cuda_graphs and self.enable_jit:
            raise InvalidValue(
                "cuda_graphs",
                "cannot be combined with enable_jit: a compiled model brings its own CUDA graphs, so use "
                "enable_jit with compile_mode: reduce-overhead instead (or switch one of them off)",
            )
