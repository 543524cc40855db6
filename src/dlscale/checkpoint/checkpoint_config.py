"""The ``checkpoint:`` config section: when checkpoints are written and how a run continues from one (no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from dlscale.errors import InvalidValue


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
