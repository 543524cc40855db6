"""What one throughput measurement and one numerics check of a tune found, as plain JSON-able records.

Both are kept in the tune's cache (:mod:`dlscale.tuning.cache`) and in its JSON record, so a resumed tune and a
reader of the record see the same numbers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

MeasurementStatus = Literal["ok", "out of memory", "failed"]


@dataclass
class Measurement:
    """The IO / SYNTHETIC / FULL trials of one set of settings (global samples/s of each recorded trial)."""

    status: MeasurementStatus
    throughputs: dict[str, list[float]] = field(default_factory=dict)
    verdict: str = "inconclusive"  # the bottleneck the trials point to (dlscale.perf.bench.report)
    verdict_reason: str = ""
    seconds: float = 0.0  # wall time of the measurement, build included
    peak_memory_gb: float | None = None  # device memory peak of FULL (None on a CPU)
    message: str = ""  # why it failed

    @property
    def full(self) -> list[float]:
        """FULL's trials: the speed training runs at, which the tune maximizes."""
        return self.throughputs.get("FULL", [])

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> Measurement:
        return cls(**document)


@dataclass
class NumericsCheck:
    """A short training run's loss (same seed, same number of samples): does a knob change the result?"""

    status: Literal["ok", "failed"]
    loss: float | None = None  # validation loss at the end of the check
    steps: int = 0
    seconds: float = 0.0
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> NumericsCheck:
        return cls(**document)
