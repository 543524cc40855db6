"""The ``optim:`` config section: optimizer, learning rate, its schedule and batch-size scaling (no torch)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_type_hints

from dlscale.errors import InvalidValue


@dataclass
class OptimConfig:
    """Optimizer and learning-rate recipe."""

    optimizer: Literal["Adam", "AdamW", "SGD", "Adadelta"] = "Adam"
    lr: float = 5e-4  # peak LR at base_batch_size (see lr_scaling)
    betas: tuple[float, float] = (0.9, 0.95)  # Adam/AdamW moment decay rates
    eps: float = 1e-8  # Adam/AdamW denominator guard
    weight_decay: float = 0.0
    momentum: float = 0.9  # SGD only
    rho: float = 0.9  # Adadelta only: decay rate of its running averages
    enable_fused: bool = False  # fused (single-kernel) optimizer step; Adam, AdamW and SGD
    lr_schedule: Literal["cosine", "constant", "step"] = "cosine"  # after the warm-up
    lr_step_epochs: int = 1  # step schedule: epochs between two multiplications of the LR by lr_gamma
    lr_gamma: float = 0.1  # step schedule: the factor (torch's StepLR)
    warmup: int = 0  # linear warm-up steps
    end_lr: float = 0.0  # LR reached at the last step by the cosine decay
    lr_scaling: Literal["none", "sqrt", "linear"] = "none"  # rule that scales lr from base_batch_size
    base_batch_size: int | None = None  # the global batch size that lr is meant for
    max_grad_norm: float | None = None  # clip the gradient norm to this value; null = no clipping

    def __post_init__(self) -> None:
        # First, so that a NaN is named as such: every comparison with NaN is False, so `lr: .nan` would
        # pass the range checks below and fail later inside torch, and an infinite lr would pass them too.
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise InvalidValue(name, f"must be a finite number, got {value}")
        if not all(math.isfinite(b) for b in self.betas):
            raise InvalidValue("betas", f"each must be a finite number, got {list(self.betas)}")
        if self.lr <= 0:
            raise InvalidValue("lr", f"must be > 0, got {self.lr}")
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise InvalidValue("betas", f"each must be in [0, 1), got {list(self.betas)}")
        for name in ("eps", "weight_decay", "momentum", "end_lr"):
            if getattr(self, name) < 0:
                raise InvalidValue(name, f"must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.rho < 1.0:
            raise InvalidValue("rho", f"must be in [0, 1), got {self.rho}")
        if self.lr_step_epochs < 1:
            raise InvalidValue("lr_step_epochs", f"must be >= 1, got {self.lr_step_epochs}")
        if not 0.0 < self.lr_gamma <= 1.0:
            raise InvalidValue("lr_gamma", f"must be in (0, 1], got {self.lr_gamma}")
        if self.enable_fused and self.optimizer == "Adadelta":
            raise InvalidValue("enable_fused", "Adadelta has no fused implementation; switch it off")
        if self.warmup < 0:
            raise InvalidValue("warmup", f"must be >= 0 steps, got {self.warmup}")
        if self.end_lr > self.lr:
            raise InvalidValue("end_lr", f"{self.end_lr} is above the peak lr {self.lr}")
        if self.lr_scaling != "none" and self.base_batch_size is None:
            raise InvalidValue(
                "base_batch_size", f"lr_scaling '{self.lr_scaling}' needs the batch size lr is for"
            )
        if self.base_batch_size is not None and self.base_batch_size < 1:
            raise InvalidValue("base_batch_size", f"must be >= 1, got {self.base_batch_size}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise InvalidValue("max_grad_norm", f"must be > 0 or null, got {self.max_grad_norm}")


# Read from the annotations, so that a float field added later is checked too (betas, a pair, has its own check).
_FLOAT_FIELDS = tuple(
    name for name, hint in get_type_hints(OptimConfig).items() if hint in (float, float | None)
)
