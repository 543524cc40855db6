"""The ``train:`` config section: run length, batch size, seed, and how each step is executed (no torch:
:mod:`dlscale.config` reads it without loading the trainer)."""

from __future__ import annotations

import math
import re
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
    # Multi-step training (dlscale.training.rollout_loss): each sample is rollout_steps + 1 consecutive states and
    # the loss the mean over that many autoregressive steps; rollout_schedule grows it during the run
    # ("epoch 0=1, 2=2, 4=4": dlscale.training.rollout_curriculum) instead (with a schedule, rollout_steps stays
    # 1); rollout_checkpointing recomputes each step's activations in backward, so memory stays about one step's
    # whatever K.
    rollout_steps: int = 1
    rollout_schedule: str | None = None
    rollout_checkpointing: bool = False
    # CRPS training (dlscale.training.ensemble_loss): "workload" trains on the workload's own loss; "crps" runs
    # each sample ensemble_members times, each member on its own noise (a model with noise inputs:
    # model.noise_channels), and trains on the members' fair CRPS
    loss: Literal["workload", "crps"] = "workload"
    ensemble_members: int = 1

    @property
    def max_rollout_steps(self) -> int:
        """The most autoregressive steps a sample of this run rolls out (what its samples hold)."""
        if self.rollout_schedule is not None:
            return parse_rollout_schedule(self.rollout_schedule).max_steps
        return self.rollout_steps

    def __post_init__(self) -> None:
        self._check_rollout()
        self._check_ensemble()
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

    def _check_rollout(self) -> None:
        if self.rollout_steps < 1:
            raise InvalidValue(
                "rollout_steps", f"must be >= 1 (1: one-step training), got {self.rollout_steps}"
            )
        if self.rollout_schedule is not None:
            parse_rollout_schedule(self.rollout_schedule)
            # Both given, the schedule would decide K and rollout_steps say something else. A section sees its
            # values with the defaults filled in (and a checkpoint's recorded config holds every key), so an
            # explicit rollout_steps of 1 cannot be told from the default: 1 is read as "not given".
            if self.rollout_steps != 1:
                raise InvalidValue(
                    "rollout_steps",
                    f"{self.rollout_steps} and train.rollout_schedule {self.rollout_schedule!r} are both given: "
                    "give one of them (a schedule decides K at every step; set train.rollout_steps=1 or drop "
                    "train.rollout_schedule)",
                )
        if self.cuda_graphs and self.max_rollout_steps > 1:
            raise InvalidValue(
                "cuda_graphs",
                f"cannot capture multi-step training (rollout K up to {self.max_rollout_steps}): a graph replays "
                "one step's kernels, the number of model calls frozen in; switch cuda_graphs off "
                "(--no-cuda_graphs) or use enable_jit",
            )

    def _check_ensemble(self) -> None:
        members = self.ensemble_members
        if self.loss not in LOSSES:
            raise InvalidValue("loss", f"{self.loss!r} is not one of {', '.join(LOSSES)}")
        if self.loss == "crps" and not 2 <= members <= MAX_ENSEMBLE_MEMBERS:
            raise InvalidValue(
                "ensemble_members",
                f"{members} with train.loss crps: the fair CRPS compares members with each other, so it needs "
                f"2 to {MAX_ENSEMBLE_MEMBERS} members per sample (with one it is the absolute error and the "
                "members never learn a spread); e.g. 4",
            )
        if self.loss != "crps" and members != 1:
            raise InvalidValue(
                "ensemble_members",
                f"{members} with train.loss {self.loss!r}: only train.loss crps trains an ensemble; set "
                "train.loss=crps (with model.noise_channels) or train.ensemble_members=1",
            )
        if self.loss == "crps" and self.cuda_graphs:
            raise InvalidValue(
                "cuda_graphs",
                "cannot capture CRPS training (each step draws the members' noise and runs the loss outside "
                "the model); switch cuda_graphs off (--no-cuda_graphs) or use enable_jit",
            )


LOSSES = ("workload", "crps")
# Members run side by side in one batch: memory and time grow M-fold; beyond this a batch of one sample is
# larger than any fair CRPS needs (its sampling error falls as 1/M, already small at 16).
MAX_ENSEMBLE_MEMBERS = 64
ROLLOUT_UNITS = ("epoch", "step")
_PAIR = re.compile(r"^(\d+)\s*=\s*(\d+)$")


@dataclass(frozen=True)
class RolloutSchedule:
    """``rollout_schedule``'s pairs, in its unit: from ``starts[i]`` on, K is ``steps[i]``."""

    unit: str  # "epoch" or "step"
    starts: tuple[int, ...]
    steps: tuple[int, ...]

    @property
    def max_steps(self) -> int:
        return self.steps[-1]

    def starts_in_steps(self, steps_per_epoch: int) -> tuple[int, ...]:
        """The starts in global steps."""
        scale = steps_per_epoch if self.unit == "epoch" else 1
        return tuple(start * scale for start in self.starts)


def parse_rollout_schedule(text: str) -> RolloutSchedule:
    """``"epoch 0=1, 2=2, 4=4"`` -> its :class:`RolloutSchedule`; InvalidValue naming what is wrong."""
    example = "e.g. 'epoch 0=1, 2=2, 4=4' or 'step 0=1, 500=2'"
    unit, _, rest = text.strip().partition(" ")
    if unit not in ROLLOUT_UNITS:
        raise InvalidValue(
            "rollout_schedule",
            f"{text!r} must start with its unit, one of {', '.join(ROLLOUT_UNITS)}, then AT=K pairs ({example})",
        )
    pieces = [piece.strip() for piece in rest.replace(",", " ").split()]
    if not pieces:
        raise InvalidValue("rollout_schedule", f"{text!r} has no AT=K pair ({example})")
    starts, steps = [], []
    for piece in pieces:
        match = _PAIR.match(piece)
        if match is None:
            raise InvalidValue(
                "rollout_schedule", f"{piece!r} in {text!r} is no AT=K pair of integers ({example})"
            )
        starts.append(int(match.group(1)))
        steps.append(int(match.group(2)))
    if starts[0] != 0:
        raise InvalidValue(
            "rollout_schedule", f"{text!r} must start at {unit} 0 (its first pair is {pieces[0]!r})"
        )
    for before, after, piece in zip(starts, starts[1:], pieces[1:], strict=False):
        if after <= before:
            raise InvalidValue(
                "rollout_schedule", f"{text!r}: {piece!r} starts at {unit} {after}, not after {unit} {before}"
            )
    if min(steps) < 1:
        raise InvalidValue("rollout_schedule", f"{text!r}: every K must be >= 1")
    for before, after, piece in zip(steps, steps[1:], pieces[1:], strict=False):
        if after < before:
            raise InvalidValue(
                "rollout_schedule",
                f"{text!r} goes backwards at {piece!r} (K {before} -> {after}); a curriculum's K may only grow",
            )
    return RolloutSchedule(unit, tuple(starts), tuple(steps))
