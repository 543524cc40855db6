"""The ``bench:`` config section: benchy-style throughput trials (IO, SYNTHETIC, FULL)."""

from __future__ import annotations

from dataclasses import dataclass

from dlscale.errors import InvalidValue


@dataclass
class BenchConfig:
    """How many trials of how many batches each throughput test runs (benchy's defaults)."""

    enable_benchy: bool = False  # `dlscale train`: run the throughput trials instead of training
    nwarmup: int = 1  # unrecorded warm-up trials before the recorded ones, per test
    ntrials: int = 3  # recorded trials per test
    nbatches: int = 50  # timed batches per trial
    report_freq: int = 10  # print the iteration throughput every this many batches (0 = never)
    run_io: bool = True  # IO: drain the loader, no compute
    run_synthetic: bool = True  # SYNTHETIC: train on one cached device batch, no IO
    run_full: bool = True  # FULL: real training steps on real batches
    use_distributed_barrier: bool = False  # add a barrier to the device sync at each timing point
    # in <run dir>/bench/, prefixed with the date and time, so no bench overwrites another (an absolute path is kept)
    output_filename: str = "benchy_result.json"

    def __post_init__(self) -> None:
        for name in ("ntrials", "nbatches"):
            if getattr(self, name) < 1:
                raise InvalidValue(name, f"must be >= 1, got {getattr(self, name)}")
        for name in ("nwarmup", "report_freq"):
            if getattr(self, name) < 0:
                raise InvalidValue(name, f"must be >= 0, got {getattr(self, name)}")
        if not (self.run_io or self.run_synthetic or self.run_full):
            raise InvalidValue(
                "run_io", "run_io, run_synthetic and run_full are all false: nothing to measure"
            )
