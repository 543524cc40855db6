"""Build a run from its config: data, model, layout, optimizer, schedule, loaders, evaluator, profiling.

This is where the workload (data + model + loss + metrics) meets the recipe (optimizer, schedule) and the
layout (ranks, device), and the one place that reads the whole config: each piece below receives only its own
section. It also continues from a checkpoint when there is one to continue from.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset

from dlscale.checkpoint.directory import CheckpointDir
from dlscale.checkpoint.resume import resume_source, weight_defining_keys
from dlscale.checkpoint.size import estimate_checkpoint_bytes
from dlscale.checkpoint.training_state import restore_training
from dlscale.config.run_config import RunConfig
from dlscale.data.dataset_description import describe_dataset
from dlscale.data.loading.pipeline import build_batch_source
from dlscale.data.loading.sampler import EvaluationSampler, TrainingSampler
from dlscale.data.values.finite_check import FiniteCheckedBatches
from dlscale.errors import ConfigError
from dlscale.parallel.data_parallel import buffer_synchronizer, wrap_data_parallel
from dlscale.parallel.model_parallel import create_mesh, data_parallel_sum, report_layout
from dlscale.perf.flops import Utilization, compute_precision, training_flops_per_sample
from dlscale.perf.profile.capture import build_profiling
from dlscale.run.ensemble_training import check_crps_workload, crps_training_loss, ensemble_utilization
from dlscale.run.preflight import SAMPLES_PER_BATCH, PreflightReport, checked_splits, preflight_check
from dlscale.run.rollout_training import (
    RolloutUtilization,
    check_rollout_workload,
    rollout_curriculum,
    rollout_splits,
    unreached_schedule_entries,
)
from dlscale.runtime.device import Device
from dlscale.runtime.launch import ProcessInfo
from dlscale.runtime.nvtx import NO_MARKERS
from dlscale.runtime.rng import seed_everything
from dlscale.runtime.storage import format_bytes
from dlscale.scoring.rollout_validation import RolloutEvaluator, RolloutPredict
from dlscale.training.graphs import GraphedTrainStep, optimizer_is_capturable
from dlscale.training.observer import Observer
from dlscale.training.optim import build_optimizer
from dlscale.training.precision import Precision
from dlscale.training.rollout_loss import RolloutLoss
from dlscale.training.schedule import EpochPlan, LRSchedule, plan_epochs, scaled_lr
from dlscale.training.step import TrainStep
from dlscale.training.train_progress import TrainProgress
from dlscale.training.training_loss import graphs_refusal
from dlscale.training.training_setup import RunRecord, TrainingSetup, Validation
from dlscale.workloads import get_workload
from dlscale.workloads.protocol import Workload
from dlscale.workloads.user_code import raised_by_workload

log = logging.getLogger("dlscale.train")


@dataclass
class BuiltRun:
    """A run built from its config: what the trainer runs, and the pieces around it that the run layer wires."""

    config: RunConfig
    setup: TrainingSetup
    workload: Workload
    datasets: Mapping[str, Dataset]
    checkpoints: CheckpointDir
    resumed_from: Path | None = None
    profilers: tuple[Observer, ...] = ()  # the profile: section's observers (their markers are in the setup)
    preflight: PreflightReport | None = None  # what the check of the workload on its first samples saw


def batch_sizes(cfg: RunConfig, replicas: int) -> tuple[int, int]:
    """(global, local) batch sizes over ``replicas`` data-parallel ranks: ``local_batch_size`` wins when set,
    else the global batch is split over them (the tp x cp ranks of one replica share its local batch)."""
    if cfg.train.local_batch_size is not None:
        return cfg.train.local_batch_size * replicas, cfg.train.local_batch_size
    if cfg.train.global_batch_size % replicas:
        raise ConfigError(
            f"train.global_batch_size {cfg.train.global_batch_size} is not divisible by the {replicas} data-parallel "
            "ranks; change it or set --local_batch_size"
        )
    return cfg.train.global_batch_size, cfg.train.global_batch_size // replicas


def build_training(
    cfg: RunConfig, run_dir: Path, process: ProcessInfo, device: Device, training: bool = True
) -> BuiltRun:
    """Build the run from ``cfg`` and continue from its checkpoint if ``checkpoint.resume`` says so.

    ``training=False`` builds it for throughput trials: no checkpoint is read, whatever ``checkpoint.resume``
    says, and no profiler is attached.
    """
    # A workload whose loss or metrics take parameters from the config is bound to it here.
    workload = get_workload(cfg.workload)
    with raised_by_workload(workload, "configured"):
        workload = workload.configured(cfg.model, cfg.data)
    if cfg.train.cuda_graphs and workload.training_loss is not None:
        raise ConfigError(f"{cfg.where}: {graphs_refusal(workload.name)}")
    rollout_steps = cfg.train.max_rollout_steps
    if rollout_steps > 1:
        check_rollout_workload(workload, cfg.where)
    if cfg.train.loss == "crps":
        check_crps_workload(workload, cfg)
    check_device_support(cfg, device, process)
    if cfg.train.on_nonfinite == "rollback" and not cfg.checkpoint.enabled:
        raise ConfigError(
            f"{cfg.where}: train.on_nonfinite 'rollback' reloads the last good checkpoint, "
            "and checkpoint.enabled is false; enable checkpoints or choose 'stop' or 'skip'"
        )
    device.configure(cfg.train.deterministic, tf32=cfg.train.tf32)
    checkpoints = CheckpointDir(run_dir / "checkpoints", keep_last=cfg.checkpoint.keep_last)
    # Fails early, before reading any data.
    resume_from = resume_source(cfg.checkpoint, checkpoints) if training else None
    # Before any data is read: a layout that cannot work fails fast.
    with errors_naming_the_config(cfg):
        mesh = create_mesh(cfg.parallel, process)
    seed_everything(cfg.train.seed)

    with raised_by_workload(workload, "build_datasets"):
        datasets = workload.build_datasets(cfg.data)
    train_set, valid_set = checked_splits(workload, datasets)
    # The pre-flight check below sees the workload's own (one-step) samples; a multi-step run trains on K + 1
    # states per sample of the same data.
    trained_on = dict(datasets)
    if rollout_steps > 1:
        splits = rollout_splits(workload, cfg.data, rollout_steps, cfg.where)
        train_set, valid_set = trained_on["train"], trained_on["valid"] = splits.train, splits.valid
    global_batch, local_batch = batch_sizes(cfg, mesh.dp_size)
    try:
        plan = plan_epochs(len(train_set), global_batch, cfg.train.num_iters, cfg.train.num_epochs)
    except ValueError as exc:
        raise ConfigError(f"{cfg.where}: {exc}") from None
    unreached = unreached_schedule_entries(cfg.train, plan) if training and process.is_main else None
    if unreached is not None:
        log.warning("%s", unreached)
    # Built before the step, which marks its phases with them (profilers attach on every rank: they decide
    # themselves which ranks record).
    markers, profilers = (
        build_profiling(cfg.profile, process.rank, device, plan) if training else (NO_MARKERS, [])
    )

    with raised_by_workload(workload, "build_model"):
        model = workload.build_model(cfg.model, cfg.data).to(device.torch)
    precision = Precision(cfg.train.amp_mode, device)
    with raised_by_workload(workload, "evaluator"):
        evaluator = workload.evaluator(datasets["valid"], cfg.log.image_channel)  # the workload's own samples
    # Before the FLOP count and any wrapper: the first samples through the plain model, loss and evaluator.
    preflight = preflight_check(
        workload, model, datasets, evaluator, precision, device, min(SAMPLES_PER_BATCH, local_batch)
    )
    # Counted on the plain model: FSDP2 and tensor parallelism change its parameters in place.
    utilization = measure_utilization(workload, model, cfg, device, train_set)
    curriculum = rollout_curriculum(cfg.train, plan.steps_per_epoch)
    crps = cfg.train.loss == "crps"
    if crps:
        utilization = ensemble_utilization(utilization, cfg.train.ensemble_members)
    if rollout_steps > 1:
        utilization = RolloutUtilization(utilization, curriculum)
    with errors_naming_the_config(cfg):
        model = workload.parallelize(model, mesh)  # this rank's part of it (tp/cp), from outside the model
    # DDP across the ranks holding the same parameters, FSDP2 (which shards the parameters first, so it comes
    # before the optimizer), or the model itself.
    replica = wrap_data_parallel(model, cfg.parallel, process, device, mesh, workload.fsdp_units(model))
    sharded_over_ranks = cfg.parallel.data_parallel == "fsdp" and mesh.size("dp-cp") > 1
    report_layout(model, mesh)
    peak_lr = scaled_lr(cfg.optim.lr, cfg.optim.lr_scaling, global_batch, cfg.optim.base_batch_size)
    graphed = cfg.train.cuda_graphs
    capturable = graphed and optimizer_is_capturable(cfg.optim.optimizer, cfg.train.amp_mode)
    optimizer = build_optimizer(cfg.optim, model.parameters(), peak_lr, capturable=capturable)
    schedule = LRSchedule(
        peak_lr,
        plan.total_steps,
        cfg.optim.warmup,
        cfg.optim.end_lr,
        cfg.optim.lr_schedule,
        step_size=cfg.optim.lr_step_epochs * plan.steps_per_epoch,
        gamma=cfg.optim.lr_gamma,
    )
    forward = compile_model(replica, cfg.train.compile_mode) if cfg.train.enable_jit else replica
    step_class, extra = (
        (GraphedTrainStep, {"warmup_steps": cfg.train.graph_warmup_steps, "batch_size": local_batch})
        if graphed
        else (TrainStep, {})
    )
    step = step_class(
        model,
        workload.loss,
        optimizer,
        schedule,
        cfg.optim.max_grad_norm,
        precision,
        forward,
        skip_nonfinite=cfg.train.on_nonfinite == "skip",
        markers=markers,
        training_loss=(
            crps_training_loss(workload, cfg, curriculum, mesh.dp_rank * local_batch)
            if crps
            else RolloutLoss(workload.loss, curriculum, cfg.train.rollout_checkpointing)
            if rollout_steps > 1
            else workload.training_loss
        ),
        **extra,
    )

    # Data is sharded over dp only: every rank of one model replica reads the same samples.
    sampler = TrainingSampler(
        len(train_set), global_batch, mesh.dp_size, mesh.dp_rank, cfg.loader.shuffle, cfg.train.seed
    )
    train_loader = build_batch_source(
        train_set, cfg.loader, local_batch, sampler, device, seed=cfg.train.seed
    )
    valid_sampler = EvaluationSampler(len(valid_set), mesh.dp_size, mesh.dp_rank)
    valid_loader = build_batch_source(
        valid_set, cfg.loader, local_batch, valid_sampler, device, seed=cfg.train.seed + 1
    )
    # Validation never goes through DDP: its forward would broadcast buffers, a collective that a rank without
    # validation samples would skip.
    predict = precision.wrap_inference(forward if replica is model else model)
    if rollout_steps > 1:
        evaluator = RolloutEvaluator(evaluator, workload.loss, rollout_steps)
        predict = RolloutPredict(predict, rollout_steps)
    if getattr(cfg.data, "check_finite", False):  # a workload's data section may not offer the check
        train_loader = FiniteCheckedBatches(train_loader, sampler, train_set, "training", local_batch)
        valid_loader = FiniteCheckedBatches(valid_loader, valid_sampler, valid_set, "validation", local_batch)

    setup = TrainingSetup(
        record=RunRecord(
            name=cfg.name,
            source=cfg.source,
            workload=workload.name,  # the same whether the config named it or gave its import path
            overrides=cfg.overrides,
            resolved=cfg.to_dict(),
            weight_defining_keys=weight_defining_keys(cfg.model, cfg.data),
        ),
        policy=cfg.train,
        run_dir=run_dir,
        process=process,
        device=device,
        mesh=mesh,
        model=model,
        optimizer=optimizer,
        schedule=schedule,
        step=step,
        precision=precision,
        plan=plan,
        global_batch_size=global_batch,
        local_batch_size=local_batch,
        train_sampler=sampler,
        train_loader=train_loader,
        validation=Validation(
            loader=valid_loader,
            evaluator=evaluator,
            predict=predict,
            metric_sum=data_parallel_sum(mesh, default=None),
            lockstep=sharded_over_ranks,
            sync_buffers=buffer_synchronizer(model, cfg.parallel, process, mesh),
        ),
        stop_check_every=cfg.parallel.stop_check_every,
        collective_timeouts=(cfg.parallel.timeout_s, cfg.parallel.train_timeout_s),
        utilization=utilization,
        markers=markers,
    )
    built = BuiltRun(
        cfg, setup, workload, trained_on, checkpoints, profilers=tuple(profilers), preflight=preflight
    )
    if resume_from is not None:
        # Restores the RNG last, right before training.
        setup.progress = restore_training(
            setup, resume_from.path, checkpoints, resume_from.weights_only, resume_from.argument
        )
        built.resumed_from, built.weights_only = resume_from.path, resume_from.weights_only
        continue_with_new_length(setup.progress, plan)
    return built


def continue_with_new_length(progress: TrainProgress, plan: EpochPlan) -> None:
    """A resumed run follows this config's length: a finished run trains on when it asks for more epochs, and
    a run that asks for no more than it has trained counts as finished."""
    if progress.completed and plan.num_epochs > progress.epoch:
        log.info(
            "The run finished after epoch %d (global step %d); this config asks for %d epochs, so it trains on "
            "to step %d. The LR schedule now spans %d steps",
            progress.epoch,
            progress.global_step,
            plan.num_epochs,
            plan.total_steps,
            plan.total_steps,
        )
        progress.completed = False
    elif not progress.completed and progress.global_step >= plan.total_steps and progress.step_in_epoch == 0:
        log.info(
            "The run has trained up to epoch %d (global step %d), as many epochs as this config asks for (%d)",
            progress.epoch,
            progress.global_step,
            plan.num_epochs,
        )
        progress.completed = True


@contextlib.contextmanager
def errors_naming_the_config(cfg: RunConfig) -> Iterator[None]:
    """Prefix a ConfigError raised inside with the config file and name, which the raising component does not know."""
    try:
        yield
    except ConfigError as exc:
        raise ConfigError(f"{cfg.where}: {exc}") from None


def measure_utilization(
    workload: Workload, model: torch.nn.Module, cfg: RunConfig, device: Device, train_set: Dataset
) -> Utilization:
    """FLOPs per training sample (analytic when the workload knows them, else counted) and the device's peak."""
    analytic = workload.forward_flops_per_sample(cfg.model, cfg.data)
    if analytic is not None:
        estimate = training_flops_per_sample(model, None, analytic)
    else:
        sample_inputs = train_set[0][0].unsqueeze(0).to(device.torch)
        estimate = training_flops_per_sample(model, sample_inputs)
    log.debug("FLOPs per training sample: %s", estimate.detail)
    precision = compute_precision(cfg.train.amp_mode, cfg.train.tf32 and device.is_gpu)  # CPUs have no TF32
    return Utilization(estimate.flops, device.name, precision, warn_if_unknown=device.is_gpu)


def check_device_support(cfg: RunConfig, device: Device, process: ProcessInfo) -> None:
    """Refuse switches this device cannot honour, naming the switch (instead of silently running without it)."""
    if cfg.train.cuda_graphs and process.world_size > 1:
        raise ConfigError(
            f"{cfg.where}: train.cuda_graphs with {process.world_size} ranks is not "
            "available yet (capturing DDP's all-reduces needs its own set-up); switch it off for multi-GPU runs"
        )
    if cfg.train.cuda_graphs and not device.is_gpu:
        raise ConfigError(
            f"{cfg.where}: train.cuda_graphs needs a CUDA GPU, and this run is on "
            f"{device.name}; switch it off (--no-cuda_graphs)"
        )


def compile_model(model: torch.nn.Module, mode: str) -> Callable[..., torch.Tensor]:
    """``torch.compile`` of the model (the module itself keeps the parameters and the checkpoint keys)."""
    log.info(
        "Compiling the model with torch.compile (mode %s); the first steps include the compilation", mode
    )
    return torch.compile(model, mode=mode)


def describe_execution(cfg: RunConfig, on_gpu: bool) -> str:
    """The speed switches of a run in one phrase, e.g. 'amp bf16, tf32 on, compiled, gpu pipeline (4 workers)'.

    TF32 is a GPU number format: a CPU run leaves its fp32 math as it is (``Device.configure``), so the phrase
    names TF32 only ``on_gpu``.
    """
    train, loader = cfg.train, cfg.loader
    parts = [f"amp {train.amp_mode}"]
    if on_gpu:
        parts.append(f"tf32 {'on' if train.tf32 else 'off'}")
    if train.enable_jit:
        parts.append(f"torch.compile ({train.compile_mode})")
    if train.cuda_graphs:
        parts.append("CUDA graphs")
    if train.max_rollout_steps > 1:
        schedule = (
            f"schedule '{train.rollout_schedule}'" if train.rollout_schedule else f"K={train.rollout_steps}"
        )
        recompute = ", activations recomputed per step" if train.rollout_checkpointing else ""
        parts.append(f"multi-step training ({schedule}{recompute})")
    parts.append(f"{loader.pipeline} data pipeline ({loader.num_data_workers} workers)")
    return ", ".join(parts)


def writes_sharded_checkpoints(run: BuiltRun) -> bool:
    """Whether the run writes sharded (DCP) checkpoints (``checkpoint.format``; ``auto`` decides by the model's
    sharding, the number of processes and the checkpoint's size)."""
    cfg, setup = run.config, run.setup
    model_sharded = cfg.parallel.data_parallel == "fsdp" or setup.mesh.size("tp") > 1
    size = estimate_checkpoint_bytes(setup.model, cfg.optim)
    return cfg.checkpoint.enabled and cfg.checkpoint.sharded(model_sharded, setup.process.world_size, size)


def describe_checkpoints(run: BuiltRun) -> str:
    """How the run's checkpoints are written, for the start-of-run lines."""
    size = format_bytes(estimate_checkpoint_bytes(run.setup.model, run.config.optim))
    if not writes_sharded_checkpoints(run):
        return f"one file of about {size}, gathered on rank 0 (checkpoint.format: file)"
    background = ", in the background" if run.config.checkpoint.async_save else ""
    return (
        f"sharded, about {size} in all: every rank writes its own shards through torch.distributed.checkpoint"
        f"{background} (checkpoint.format: dcp)"
    )


def describe_run(run: BuiltRun) -> list[str]:
    """The start-of-run lines: what is being trained, on what, for how long."""
    cfg, setup = run.config, run.setup
    plan = setup.plan
    train_set, valid_set = run.datasets["train"], run.datasets["valid"]
    optim = cfg.optim
    lr_note = ""
    if optim.lr_scaling != "none" and optim.base_batch_size is not None:
        lr_note = (
            f" ({optim.lr_scaling} rule: lr {optim.lr:.3g} at batch {optim.base_batch_size} "
            f"-> {setup.schedule.peak_lr:.3g} at batch {setup.global_batch_size})"
        )
    lines = [
        f"Device: {setup.device.name}; torch {torch.__version__}; {setup.process.world_size} process(es), "
        f"layout {setup.mesh.shape.describe()}",
        f"Data: train {describe_dataset(train_set)}",
        f"      valid {describe_dataset(valid_set)}",
        f"Model: {run.workload.describe_model(setup.model)}",
        f"Optimizer: {optim.optimizer}{' (fused)' if optim.enable_fused else ''}, peak lr "
        f"{setup.schedule.peak_lr:.3g}{lr_note}, {optim.lr_schedule} schedule, warmup {optim.warmup} steps",
        f"Batch: global {setup.global_batch_size} (local {setup.local_batch_size} x "
        f"{setup.mesh.dp_size} data-parallel rank(s)); {plan.explanation}",
        f"Execution: {describe_execution(cfg, setup.device.is_gpu)}",
    ]
    if cfg.checkpoint.enabled:
        lines.append(f"Checkpoints: {describe_checkpoints(run)}")
    if run.preflight is not None:
        lines.append(run.preflight.describe())
    if setup.utilization is not None:
        u = setup.utilization
        lines.append(f"FLOPs: {u.flops_per_sample / 1e9:.4g} GFLOP per training sample; {u.describe()}")
    if run.resumed_from is not None and run.weights_only:
        lines.append(f"Initial weights from {run.resumed_from} (weights only: a new run from step 0)")
    elif run.resumed_from is not None:
        p = setup.progress
        lines.append(
            f"Resuming from {run.resumed_from}: epoch {p.epoch + 1}, step {p.step_in_epoch} of the epoch "
            f"(global step {p.global_step} of {plan.total_steps})"
        )
    return lines
