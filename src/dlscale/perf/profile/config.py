"""The ``profile:`` config section: NVTX ranges and an nsys capture window, torch profiler, line profiler."""

from __future__ import annotations

from dataclasses import dataclass

from dlscale.errors import InvalidValue


@dataclass
class ProfileConfig:
    """Which profilers run, and over which part of the run."""

    enable_manual_profiling: bool = (
        False  # NVTX ranges + cudaProfilerApi start/stop (for nsys -c cudaProfilerApi)
    )
    profile_epoch: int | None = None  # 1-based epoch of the capture window; null = the run's last epoch
    profile_start_step: int = 0  # first step (0-based, within that epoch) inside the window
    profile_end_step: int | None = None  # step after the window (exclusive); null = to the end of the epoch
    profile_ranks: str = "0"  # ranks that profile (CUDA profiler window, torch/line profiler): "all" or "0,4"
    torch_profiler: bool = False  # torch.profiler trace (*.pt.trace.json) over a step window
    torch_profiler_wait: int = 1  # steps skipped before the profiler warms up
    torch_profiler_warmup: int = 1  # steps profiled but discarded (profiler start-up costs)
    torch_profiler_active: int = 3  # steps recorded in the trace
    line_profile: bool = False  # per-line timings of the training step and loop (needs line_profiler)

    def __post_init__(self) -> None:
        if self.profile_epoch is not None and self.profile_epoch < 1:
            raise InvalidValue(
                "profile_epoch", f"must be >= 1 (epochs count from 1) or null, got {self.profile_epoch}"
            )
        if self.profile_start_step < 0:
            raise InvalidValue("profile_start_step", f"must be >= 0, got {self.profile_start_step}")
        if self.profile_end_step is not None and self.profile_end_step <= self.profile_start_step:
            raise InvalidValue(
                "profile_end_step",
                f"must be greater than profile_start_step ({self.profile_start_step}), got {self.profile_end_step}",
            )
        self.ranks()  # validates the text
        for name in ("torch_profiler_wait", "torch_profiler_warmup"):
            if getattr(self, name) < 0:
                raise InvalidValue(name, f"must be >= 0, got {getattr(self, name)}")
        if self.torch_profiler_active < 1:
            raise InvalidValue("torch_profiler_active", f"must be >= 1, got {self.torch_profiler_active}")

    def ranks(self) -> set[int] | None:
        """The ranks that profile (None = all of them)."""
        text = self.profile_ranks.strip().lower()
        if text == "all":
            return None
        try:
            ranks = {int(part) for part in text.replace(" ", "").split(",") if part}
        except ValueError:
            ranks = set()
        if not ranks or min(ranks) < 0:
            raise InvalidValue(
                "profile_ranks", f"expected 'all' or rank numbers such as '0,4', got {self.profile_ranks!r}"
            )
        return ranks
