"""``dlscale train --dry_run``: build the run, run the pre-flight check, time two training steps on the first
batch, and say what one step costs; nothing is written (no run directory, log file or checkpoint) and no
checkpoint is read (the steps start from fresh weights), so it can run beside a run of the same directory."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from dlscale.config import RunConfig
from dlscale.report.run_dir import run_directory, setup_logging
from dlscale.run.assembly import build_training, describe_run
from dlscale.run.process_group import distributed_run
from dlscale.runtime.device import Device
from dlscale.runtime.launch import detect_process
from dlscale.training.training_setup import TrainingSetup

log = logging.getLogger("dlscale.train")


@dataclass(frozen=True)
class StepCost:
    """What a training step of the config costs on this device."""

    first_step_s: float  # with the warm-up: allocator, cuDNN autotuning, torch.compile's compilation
    step_s: float  # the second step on the same batch
    local_batch_size: int
    total_steps: int
    memory_peaks_gb: dict[str, float]  # Device.memory_peaks: GPU allocated/reserved, or the host's peak RSS
    preflight_s: float

    def describe(self) -> str:
        memory = ", ".join(f"{name} {value:.3g} GB" for name, value in self.memory_peaks_gb.items())
        return (
            f"Dry run: one training step of {self.local_batch_size} samples per rank takes {self.step_s:.3g} s "
            f"(the first, with warm-up, {self.first_step_s:.3g} s); peak memory: {memory}. The config's "
            f"{self.total_steps} steps would take about {self.step_s * self.total_steps:.3g} s, plus data "
            f"loading and validation; the pre-flight check took {self.preflight_s:.2f} s. Nothing was written."
        )


def dry_run(cfg: RunConfig) -> StepCost:
    """Check the workload and time one step of ``cfg`` on every rank of the launch; rank 0 logs the cost."""
    process = detect_process()
    device = Device.select(process.local_rank)
    with distributed_run(process, device, cfg.parallel.timeout_s) as ending:
        setup_logging(None, enabled=process.is_main)  # the console only: a dry run writes no file
        # training=False: no checkpoint is read and no profiler attached.
        run = build_training(cfg, run_directory(cfg.log, cfg.name), process, device, training=False)
        for line in describe_run(run):
            log.info("%s", line)
        cost = time_one_step(run.setup, run.preflight.seconds if run.preflight else 0.0)
        log.info("%s", cost.describe())
        ending.alike = True
        return cost


def time_one_step(setup: TrainingSetup, preflight_s: float) -> StepCost:
    """Two training steps on the first batch (the weights change; nothing keeps them)."""
    device = setup.device
    setup.train_sampler.set_epoch(0)
    batches = iter(setup.train_loader)
    inputs, targets = next(batches)
    del batches  # stops the loader's workers or reader threads
    inputs, targets = device.move(inputs), device.move(targets)
    device.reset_peak_memory()
    seconds = []
    for step in range(2):
        device.synchronize()
        started = time.perf_counter()
        setup.step(inputs, targets, step)
        device.synchronize()
        seconds.append(time.perf_counter() - started)
    return StepCost(
        first_step_s=seconds[0],
        step_s=seconds[1],
        local_batch_size=setup.local_batch_size,
        total_steps=setup.plan.total_steps,
        memory_peaks_gb=device.memory_peaks(),
        preflight_s=preflight_s,
    )
