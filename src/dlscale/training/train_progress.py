"""Where a run is: epoch, step, best validation loss, and the running train loss of the current epoch.

It is saved in every checkpoint, so a resumed run continues mid-epoch with the same average train loss.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from dlscale.errors import CheckpointError


@dataclass
class TrainProgress:
    """A run's position (all counters are 0-based)."""

    epoch: int = 0  # the epoch being trained (or next to train)
    step_in_epoch: int = 0  # optimizer steps done in that epoch
    global_step: int = 0  # optimizer steps done in the whole run
    samples_seen: int = 0  # training samples consumed in the whole run
    epoch_loss_sum: float = 0.0  # sum of step losses in the current epoch (for the epoch's average)
    best_val_loss: float | None = None
    best_epoch: int | None = None  # 1-based epoch that reached best_val_loss
    completed: bool = False  # the run trained all its steps
    skipped_steps: int = 0  # steps whose update the divergence policy "skip" left out, in the whole run
    epoch_skipped_steps: int = 0  # of those, in the current epoch (their losses are not in epoch_loss_sum)
    rollbacks: int = 0  # times the divergence policy "rollback" went back to the last good checkpoint
    history: list[dict[str, Any]] = field(default_factory=list)  # one row of results per finished epoch

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, state: dict[str, Any], source: str) -> TrainProgress:
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(state, dict) or not names.issuperset(state):
            raise CheckpointError(f"{source}: its 'progress' entry is not a dlscale training position")
        return cls(**state)
