"""The ``checkpoint:`` config section: when checkpoints are written and how a run continues from one (no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dlscale.errors import InvalidValue

# Above this many bytes of checkpoint, a run of several processes writes sharded checkpoints by default
# (checkpoint.format: auto): benchmarks/results/checkpoint_save.md measures where gathering on rank 0 falls behind.
SHARDED_ABOVE_BYTES = 1 << 30


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
    # file: one file, gathered on rank 0 (small models; dlscale export's input); dcp: every rank writes its own
    # shards in parallel through torch.distributed.checkpoint (a directory); auto: dcp when the model is sharded
    # (FSDP2, tensor parallelism) or a multi-process run's checkpoint is above 1 GiB, else file
    format: Literal["auto", "file", "dcp"] = "auto"
    async_save: bool = (
        False  # dcp: write in a background thread; the loop waits only for the copy to host memory
    )
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
        if self.format not in ("auto", "file", "dcp"):
            raise InvalidValue("format", f"must be 'auto', 'file' or 'dcp', got {self.format!r}")
        if self.async_save and self.format == "file":
            raise InvalidValue(
                "async_save",
                "writes sharded checkpoints in the background: set checkpoint.format to dcp or auto",
            )
        if self.resume_weights_only and self.resume in ("auto", "never"):
            raise InvalidValue(
                "resume_weights_only",
                "needs the checkpoint to take the weights from: --resume PATH (a checkpoint file or run directory)",
            )

    def sharded(self, model_sharded: bool, processes: int, checkpoint_bytes: int) -> bool:
        """Whether this run writes sharded (DCP) checkpoints: ``format``, with ``auto`` decided by whether the model
        is sharded, the number of processes and the checkpoint's size (``async_save`` implies them)."""
        if self.format != "auto":
            return self.format == "dcp"
        big = processes > 1 and checkpoint_bytes > SHARDED_ABOVE_BYTES
        return self.async_save or model_sharded or big
