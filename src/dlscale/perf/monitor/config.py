"""The ``monitor:`` config section: GPU and host sampling during a run (utilization, power, energy, memory)."""

from __future__ import annotations

from dataclasses import dataclass

from dlscale.errors import InvalidValue


@dataclass
class MonitorConfig:
    """Whether a run samples its GPUs and host in the background, and how often."""

    enable_monitor: bool = True  # sample GPU utilization, power, energy, memory, clocks and the host
    monitor_interval_s: float = 1.0  # seconds between samples

    def __post_init__(self) -> None:
        if self.monitor_interval_s <= 0:
            raise InvalidValue("monitor_interval_s", f"must be > 0 seconds, got {self.monitor_interval_s}")
