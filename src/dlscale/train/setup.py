"""Build everything a run needs from its config: data, model, optimizer, schedule, loaders, evaluator.

This is where the workload (data + model + loss + metrics) meets the recipe (optimizer, schedule) and the
layout (ranks, device). It also continues from a checkpoint when there is one to continue from.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from dlscale.config.run_config import RunConfig
from dlscale.data.loader import build_loader
from dlscale.data.sampler import EvaluationSampler, TrainingSampler
from dlscale.errors import ConfigError
from dlscale.runtime.device import Device
from dlscale.runtime.launch import ProcessInfo
from dlscale.runtime.rng import seed_everything
from dlscale.train.checkpoint import CheckpointDir
from dlscale.train.optim import build_optimizer
from dlscale.train.progress import TrainProgress
from dlscale.train.resume import restore_training, resume_source
from dlscale.train.schedule import EpochPlan, LRSchedule, plan_epochs, scaled_lr
from dlscale.train.step import TrainStep
from dlscale.workloads import get_workload

log = logging.getLogger("dlscale.train")


@dataclass
class TrainingSetup:
    """The built pieces of a run; the trainer and its observers read them."""

    config: RunConfig
    run_dir: Path
    process: ProcessInfo
    device: Device
    workload: Any
    datasets: dict[str, Any]
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    schedule: LRSchedule
    step: TrainStep
    plan: EpochPlan
    global_batch_size: int
    local_batch_size: int
    train_sampler: TrainingSampler
    train_loader: DataLoader
    valid_loader: DataLoader
    evaluator: Any
    checkpoints: CheckpointDir
    progress: TrainProgress = field(default_factory=TrainProgress)
    resumed_from: Path | None = None


def batch_sizes(cfg: RunConfig, process: ProcessInfo) -> tuple[int, int]:
    """(global, local) batch sizes: ``local_batch_size`` wins when set, else global is split over the ranks."""
    ranks = process.world_size
    if cfg.train.local_batch_size is not None:
        return cfg.train.local_batch_size * ranks, cfg.train.local_batch_size
    if cfg.train.global_batch_size % ranks:
        raise ConfigError(
            f"train.global_batch_size {cfg.train.global_batch_size} is not divisible by the {ranks} ranks; "
            "change it or set --local_batch_size"
        )
    return cfg.train.global_batch_size, cfg.train.global_batch_size // ranks


def build_training(cfg: RunConfig, run_dir: Path, process: ProcessInfo, device: Device) -> TrainingSetup:
    """Build the run from ``cfg`` and continue from its checkpoint if ``checkpoint.resume`` says so."""
    workload = get_workload(cfg.workload)
    device.configure(cfg.train.deterministic)
    checkpoints = CheckpointDir(run_dir / "checkpoints", keep_last=cfg.checkpoint.keep_last)
    resume_from = resume_source(cfg.checkpoint, checkpoints)  # fails early, before reading any data
    seed_everything(cfg.train.seed)

    datasets = workload.build_datasets(cfg.data)
    train_set, valid_set = datasets["train"], datasets["valid"]
    global_batch, local_batch = batch_sizes(cfg, process)
    try:
        plan = plan_epochs(len(train_set), global_batch, cfg.train.num_iters, cfg.train.num_epochs)
    except ValueError as exc:
        raise ConfigError(f"{cfg.source} [config {cfg.name!r}]: {exc}") from None

    model = workload.build_model(cfg.model, cfg.data).to(device.torch)
    peak_lr = scaled_lr(cfg.optim.lr, cfg.optim.lr_scaling, global_batch, cfg.optim.base_batch_size)
    optimizer = build_optimizer(cfg.optim, model.parameters(), peak_lr)
    schedule = LRSchedule(
        peak_lr, plan.total_steps, cfg.optim.warmup, cfg.optim.end_lr, cfg.optim.lr_schedule
    )
    step = TrainStep(model, workload.loss, optimizer, schedule, cfg.optim.max_grad_norm)

    sampler = TrainingSampler(
        len(train_set), global_batch, process.world_size, process.rank, cfg.loader.shuffle, cfg.train.seed
    )
    pin = device.pin_memory_default
    train_loader = build_loader(train_set, cfg.loader, local_batch, sampler, pin, seed=cfg.train.seed)
    valid_sampler = EvaluationSampler(len(valid_set), process.world_size, process.rank)
    valid_loader = build_loader(
        valid_set, cfg.loader, local_batch, valid_sampler, pin, seed=cfg.train.seed + 1
    )

    setup = TrainingSetup(
        config=cfg,
        run_dir=run_dir,
        process=process,
        device=device,
        workload=workload,
        datasets=datasets,
        model=model,
        optimizer=optimizer,
        schedule=schedule,
        step=step,
        plan=plan,
        global_batch_size=global_batch,
        local_batch_size=local_batch,
        train_sampler=sampler,
        train_loader=train_loader,
        valid_loader=valid_loader,
        evaluator=workload.evaluator(valid_set, cfg.log.image_channel),
        checkpoints=checkpoints,
    )
    if resume_from is not None:
        setup.progress = restore_training(setup, resume_from)  # restores the RNG last, right before training
        setup.resumed_from = resume_from
    return setup


def describe_setup(setup: TrainingSetup) -> list[str]:
    """The start-of-run lines: what is being trained, on what, for how long."""
    cfg, plan = setup.config, setup.plan
    train_set, valid_set = setup.datasets["train"], setup.datasets["valid"]
    optim = cfg.optim
    lr_note = ""
    if optim.lr_scaling != "none" and optim.base_batch_size is not None:
        lr_note = (
            f" ({optim.lr_scaling} rule: lr {optim.lr:.3g} at batch {optim.base_batch_size} "
            f"-> {setup.schedule.peak_lr:.3g} at batch {setup.global_batch_size})"
        )
    lines = [
        f"Device: {setup.device.name}; torch {torch.__version__}; {setup.process.world_size} process(es)",
        f"Data: train {train_set!r}",
        f"      valid {valid_set!r}",
        f"Model: {setup.workload.describe_model(setup.model)}",
        f"Optimizer: {optim.optimizer}{' (fused)' if optim.enable_fused else ''}, peak lr "
        f"{setup.schedule.peak_lr:.3g}{lr_note}, {optim.lr_schedule} schedule, warmup {optim.warmup} steps",
        f"Batch: global {setup.global_batch_size} (local {setup.local_batch_size} x "
        f"{setup.process.world_size} rank(s)); {plan.explanation}",
    ]
    if setup.resumed_from is not None:
        p = setup.progress
        lines.append(
            f"Resuming from {setup.resumed_from}: epoch {p.epoch + 1}, step {p.step_in_epoch} of the epoch "
            f"(global step {p.global_step} of {plan.total_steps})"
        )
    return lines
