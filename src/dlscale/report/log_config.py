"""The ``log:`` config section: where a run writes, and what it logs and draws (no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dlscale.errors import InvalidValue


@dataclass
class LogConfig:
    """Where a run writes, and how it reports progress."""

    expdir: str = "runs"  # root of the run directories: <expdir>/<config>/<run_num>/
    run_num: str = "00"  # run tag, to keep several runs of one config apart
    progress: Literal["auto", "bar", "lines", "none"] = (
        "auto"  # auto: a bar on a terminal, plain lines in logs
    )
    progress_interval_s: float = 30.0  # seconds between plain progress lines
    tensorboard: bool = True  # write TensorBoard scalars and images
    image_channel: str | None = None  # channel of the prediction-vs-target image; null: the workload's choice
    rank_logs: bool = False  # every other rank also logs, to <run>/ranks/rank<N>.log (for debugging)
    # A requeued job (same Slurm job id) whose previous run still holds the run directory waits this long for it
    lock_wait_s: float = 300.0

    def __post_init__(self) -> None:
        if not self.run_num or "/" in self.run_num:
            raise InvalidValue("run_num", f"must be a non-empty name without '/', got {self.run_num!r}")
        if self.progress_interval_s <= 0:
            raise InvalidValue("progress_interval_s", f"must be > 0, got {self.progress_interval_s}")
        if not 0 <= self.lock_wait_s < float("inf"):
            raise InvalidValue("lock_wait_s", f"must be a number of seconds >= 0, got {self.lock_wait_s}")
