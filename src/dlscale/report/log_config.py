"""The ``log:`` config section: where a run writes, and what it logs and draws (no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dlscale.errors import InvalidValue

LOGGERS = ("csv", "tensorboard", "wandb", "mlflow")  # the backends of dlscale.report.loggers


@dataclass
class LogConfig:
    """Where a run writes, and how it reports progress."""

    expdir: str = "runs"  # root of the run directories: <expdir>/<config>/<run_num>/
    run_num: str = "00"  # run tag, to keep several runs of one config apart
    progress: Literal["auto", "bar", "lines", "none"] = (
        "auto"  # auto: a bar on a terminal, plain lines in logs
    )
    progress_interval_s: float = 30.0  # seconds between plain progress lines
    tensorboard: bool = True  # write TensorBoard scalars and images (false: none, whatever ``loggers`` says)
    # Where scalars go besides <run>/metrics/steps.csv and epochs.csv (always written): tensorboard, wandb
    # (offline unless WANDB_MODE says otherwise), mlflow (a file store under the run unless MLFLOW_TRACKING_URI).
    # A tuple: the command line would read a list[str] key as one verbatim string.
    loggers: tuple[str, ...] = ("tensorboard",)
    image_channel: str | None = None  # channel of the prediction-vs-target image; null: the workload's choice
    # The validation's figures (prediction vs target; a classifier's per-class accuracy and confusion matrix) go
    # to TensorBoard every this many epochs and at the last. Measured on 2 CPU cores (torch CPU, no other job):
    # drawing them takes 0.20 s for vit_era5 (32x64, mean of 5), 0.16 s for MNIST's 10 classes, 0.20 s for
    # CIFAR-100; an epoch with its validation of the demo configs takes 7.5 s (vit_era5), 3.9 s (cnn_mnist),
    # 6.1 s (resnet_cifar). Every 5th epoch costs 0.53%, 0.82% and 0.66% of an epoch (every epoch: 2.7-4.1%).
    # The tiny configs (2 epochs of about a second) draw at their last epoch only, as every run does.
    image_every: int = 5
    rank_logs: bool = False  # every other rank also logs, to <run>/ranks/rank<N>.log (for debugging)
    # A requeued job (same Slurm job id) whose previous run still holds the run directory waits this long for it
    lock_wait_s: float = 300.0

    def __post_init__(self) -> None:
        if not self.run_num or "/" in self.run_num:
            raise InvalidValue("run_num", f"must be a non-empty name without '/', got {self.run_num!r}")
        if self.progress_interval_s <= 0:
            raise InvalidValue("progress_interval_s", f"must be > 0, got {self.progress_interval_s}")
        unknown = [name for name in self.loggers if name not in LOGGERS]
        if unknown:
            raise InvalidValue(
                "loggers",
                f"unknown logger {unknown[0]!r}; choose from {', '.join(LOGGERS)} (csv is always on)",
            )
        repeated = sorted({name for name in self.loggers if self.loggers.count(name) > 1})
        if repeated:
            raise InvalidValue("loggers", f"{repeated[0]!r} is listed more than once")
        if self.image_every < 1:
            raise InvalidValue("image_every", f"must be a number of epochs >= 1, got {self.image_every}")
        if not 0 <= self.lock_wait_s < float("inf"):
            raise InvalidValue("lock_wait_s", f"must be a number of seconds >= 0, got {self.lock_wait_s}")

    @property
    def writes_tensorboard(self) -> bool:
        """TensorBoard is on when ``loggers`` names it and ``tensorboard`` does not switch it off."""
        return self.tensorboard and "tensorboard" in self.loggers

    def draws_images(self, epoch: int, is_last: bool) -> bool:
        """Whether the validation figures of ``epoch`` (1-based) are drawn: every ``image_every``-th, and the
        last epoch's always."""
        return is_last or epoch % self.image_every == 0
