"""A stand-in for the trainer an observer is handed: the few members the monitor's observer reads (its run
directory, rank, device, plan and progress), so that the observer runs without a training loop."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace


def fake_trainer(
    run_dir: Path, gpu: bool, steps_per_epoch: int = 25, global_batch_size: int = 4
) -> SimpleNamespace:
    """One process (rank 0 of 1) on a GPU or the CPU, ``steps_per_epoch`` steps of ``global_batch_size``."""
    setup = SimpleNamespace(
        run_dir=run_dir,
        process=SimpleNamespace(rank=0, world_size=1, local_rank=0),
        device=SimpleNamespace(is_gpu=gpu, torch=SimpleNamespace(index=0) if gpu else "cpu"),
        plan=SimpleNamespace(steps_per_epoch=steps_per_epoch, steps_in_epoch=lambda epoch: steps_per_epoch),
        global_batch_size=global_batch_size,
    )
    progress = SimpleNamespace(samples_seen=0, global_step=0, epoch=0, step_in_epoch=0)
    return SimpleNamespace(setup=setup, progress=progress, last_fetch_seconds=0.002)
