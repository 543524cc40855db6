"""Which process of a launch this is (rank, local rank, world size), from the launcher's environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from dlscale.errors import DlscaleError

# Variables that say how many processes a launcher started, and which launcher set them. For Slurm this is
# the job *step's* task count, which srun sets: SLURM_NTASKS describes the allocation and is also set in a batch
# script or an salloc shell, where a single `dlscale train` is one process.
_WORLD_SIZE_VARIABLES = {
    "WORLD_SIZE": "torchrun",
    "SLURM_STEP_NUM_TASKS": "Slurm (srun)",
    "OMPI_COMM_WORLD_SIZE": "LSF/jsrun (Open MPI)",
}


@dataclass(frozen=True)
class ProcessInfo:
    """This process's place in the launch."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        """Rank 0 writes the console log, TensorBoard and checkpoints."""
        return self.rank == 0


def detect_process(environ: Mapping[str, str] | None = None) -> ProcessInfo:
    """Single-process information; refuses a multi-process launch, which this version cannot train yet.

    Two processes training the same run independently would overwrite each other's checkpoints, so a launch
    of several processes stops here with a message instead.
    """
    env = os.environ if environ is None else environ
    for variable, launcher in _WORLD_SIZE_VARIABLES.items():
        value = env.get(variable)
        if value is None:
            continue
        try:
            size = int(value)
        except ValueError:
            raise DlscaleError(f"{variable}={value!r} (set by {launcher}) is not an integer") from None
        if size > 1:
            raise DlscaleError(
                f"{variable}={size}: {launcher} started {size} processes, but multi-process (data-parallel) "
                "training is not available yet in this version of dlscale; launch one process"
            )
    return ProcessInfo()
