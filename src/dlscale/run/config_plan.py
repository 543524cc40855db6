"""The traced memory plan of a whole config (any workload): ``dlscale plan`` prints it, ``dlscale tune`` bounds
its batch size by it. Also the config's side of ``dlscale plan --check_layout`` (:func:`layout_check_of`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dlscale.config import RunConfig
from dlscale.errors import ConfigError
from dlscale.models.vit_config import ViTConfig
from dlscale.perf.plan.layout_check import LayoutCheck, LayoutRequest, check_layout
from dlscale.perf.plan.traced_layouts import OptimizerMemory
from dlscale.perf.plan.traced_memory import TensorSpec
from dlscale.perf.plan.traced_plan import TracedPlan, plan_data_parallel
from dlscale.run.assembly import batch_sizes
from dlscale.workloads import get_workload
from dlscale.workloads.protocol import Workload


@dataclass(frozen=True)
class ConfigPlan:
    """The plan and what it was made from."""

    plan: TracedPlan
    workload: Workload
    sample: tuple[TensorSpec, TensorSpec]
    global_batch: int
    optimizer: OptimizerMemory


def traced_plan_of(cfg: RunConfig, gpus: int, gpu_memory_gb: float) -> ConfigPlan:
    """The data-parallel layouts of ``cfg`` on ``gpus`` GPUs of ``gpu_memory_gb``, from a trace of its step."""
    workload = get_workload(cfg.workload).configured(cfg.model, cfg.data)
    sample = sample_of(cfg, workload)  # another workload's missing data set names its path here
    try:
        global_batch, local_batch = batch_sizes(cfg, gpus)
        problem = ""
    except ConfigError as error:  # every row then says so
        global_batch, local_batch, problem = cfg.train.global_batch_size, None, str(error)
    optimizer = OptimizerMemory(cfg.optim.optimizer, cfg.optim.momentum)
    plan = plan_data_parallel(
        lambda: workload.build_model(cfg.model, cfg.data),
        sample,
        workload.loss,
        local_batch=local_batch,
        batch_problem=problem,
        gpus=gpus,
        gpu_memory_gb=gpu_memory_gb,
        amp_mode=cfg.train.amp_mode,
        optimizer=optimizer,
        units_of=workload.fsdp_units,
        gradient_as_bucket_view=cfg.parallel.gradient_as_bucket_view,
        requested=cfg.parallel.data_parallel,
        compiled=cfg.train.enable_jit,
        members=cfg.train.ensemble_members,
    )
    return ConfigPlan(plan, workload, sample, global_batch, optimizer)


def sample_of(cfg: RunConfig, workload: Workload) -> tuple[TensorSpec, TensorSpec]:
    """One sample's input and target specs: the ViT's from its config (so a layout is checked without its
    ERA5 data), any other workload's from the first sample of its training data."""
    if isinstance(cfg.model, ViTConfig):
        image = tuple(cfg.data.img_size)
        return (
            TensorSpec((cfg.data.n_in_channels, *image), torch.float32),
            TensorSpec((cfg.data.n_out_channels, *image), torch.float32),
        )
    first = workload.build_datasets(cfg.data)["train"][0]
    return TensorSpec.of(first[0]), TensorSpec.of(first[1])


def layout_check_of(cfg: RunConfig, gpus: int, rank: int) -> LayoutCheck:
    """Build rank ``rank`` of ``cfg``'s layout on ``gpus`` GPUs as a run would, on a fake process group."""
    workload = get_workload(cfg.workload).configured(cfg.model, cfg.data)
    tp, cp = cfg.parallel.tensor_parallel, cfg.parallel.context_parallel
    replicas = gpus // (tp * cp) if tp * cp > 0 and gpus % (tp * cp) == 0 else 1  # the mesh names a misfit
    try:
        _, local_batch = batch_sizes(cfg, replicas)
    except ConfigError as error:
        raise ConfigError(f"{gpus} GPUs as dp={replicas} x tp={tp} x cp={cp}: {error}") from None
    request = LayoutRequest(
        world_size=gpus,
        rank=rank,
        parallel=cfg.parallel,
        build_model=lambda: workload.build_model(cfg.model, cfg.data),
        parallelize=workload.parallelize,
        fsdp_units=workload.fsdp_units,
        loss=workload.loss,
        sample=sample_of(cfg, workload),
        local_batch=local_batch,
        amp_mode=cfg.train.amp_mode,
        optimizer=OptimizerMemory(cfg.optim.optimizer, cfg.optim.momentum),
    )
    return check_layout(request)
