"""``dlscale plan --check_layout``: build one rank of an N-GPU layout in this process and see that it works.

A layout of 64 GPUs (tp 4 x cp 2 x dp 8) can fail only once the allocation has started: a size that does not
divide, a wrapper that refuses the model, a collective whose shapes do not match. This check builds, for ONE
chosen rank, what a real run builds (:func:`dlscale.run.assembly.build_training`'s path): the mesh and its
process groups (``create_mesh``), the model, the workload's ``parallelize`` (tp/cp) and the data-parallel
wrapper (DDP or FSDP2, ``wrap_data_parallel``), then runs one forward pass, the loss and backward at the local
batch.

Nothing is real: the process group is torch's fake backend (every collective returns at once without
communicating, so one process can claim to be rank 5 of 64), the model is built on the meta device, and the
pass runs on fake tensors (shapes and dtypes, no data, no memory). What it checks: every size and divisibility
rule the run's own code enforces, every parameter's shard shape on this rank, and that the pass goes through
tp/cp's collectives and FSDP2's all-gathers and reduce-scatters with consistent shapes (a fake collective
moves nothing, but the operators around it, the matmuls and concatenations, check the shapes they receive).
What it cannot check: values (no numerics,
no NaN), other ranks' shapes (run it with ``rank`` = another rank), the real network or GPU, and DDP's own
gradient buckets in backward: DDP's reducer cannot run on fake tensors, so with DDP the pass runs on the
wrapped model (DDP changes no shape) and DDP is only constructed.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from unittest import mock

import torch
import torch.distributed as dist
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from dlscale.errors import ConfigError, DlscaleError, exception_line
from dlscale.parallel.data_parallel import wrap_data_parallel
from dlscale.parallel.mesh import MeshShape, ParallelMesh
from dlscale.parallel.model_parallel import create_mesh
from dlscale.parallel.parallel_config import ParallelConfig
from dlscale.perf.plan.traced_layouts import OptimizerMemory
from dlscale.perf.plan.traced_memory import LossFunction, ParameterInfo, TensorSpec
from dlscale.runtime.device import Device
from dlscale.runtime.launch import ProcessInfo
from dlscale.training.precision import AMP_DTYPES


@dataclass(frozen=True)
class LayoutRequest:
    """What to build: the layout (from ``parallel`` and ``world_size``), the rank, and the workload's pieces."""

    world_size: int
    rank: int
    parallel: ParallelConfig
    build_model: Callable[[], nn.Module]
    parallelize: Callable[[nn.Module, ParallelMesh], nn.Module]
    fsdp_units: Callable[[nn.Module], Sequence[nn.Module]]
    loss: LossFunction
    sample: tuple[TensorSpec, TensorSpec]  # one sample's input and target
    local_batch: int
    amp_mode: str
    optimizer: OptimizerMemory

    def describe(self) -> str:
        """The layout as the user asked for it (valid or not), for the error line."""
        tp, cp = self.parallel.tensor_parallel, self.parallel.context_parallel
        dp = f"{self.world_size // (tp * cp)}" if tp * cp > 0 and self.world_size % (tp * cp) == 0 else "?"
        return (
            f"{self.world_size} GPUs as dp={dp} x tp={tp} x cp={cp} ({self.parallel.data_parallel}), "
            f"rank {self.rank}"
        )


@dataclass(frozen=True)
class RankParameter:
    """One parameter on the checked rank: its serial shape, the part this rank holds, and its gradient."""

    name: str
    serial_shape: tuple[int, ...]
    local_shape: tuple[int, ...]
    itemsize: int
    gradient_bytes: int | None  # this rank's gradient after backward; None: the pass left it without one

    @property
    def local_numel(self) -> int:
        return math.prod(self.local_shape)

    @property
    def serial_numel(self) -> int:
        return math.prod(self.serial_shape)


@dataclass(frozen=True)
class LayoutCheck:
    """What one rank of the layout holds, and how the pass went."""

    mesh: MeshShape
    rank: int
    wrapper: str  # what wrap_data_parallel returned: DDP, FSDP2 or none
    parameters: tuple[RankParameter, ...]
    optimizer_state_bytes: int
    ddp_bucket_bytes: int  # DDP's separate gradient buckets (gradient_as_bucket_view: false), else 0
    pass_output: tuple[int, ...]  # the model's output shape on this rank
    seconds: float

    @property
    def local_count(self) -> int:
        return sum(p.local_numel for p in self.parameters)

    @property
    def serial_count(self) -> int:
        return sum(p.serial_numel for p in self.parameters)

    @property
    def parameter_bytes(self) -> int:
        return sum(p.local_numel * p.itemsize for p in self.parameters)

    @property
    def gradient_bytes(self) -> int:
        return sum(p.gradient_bytes or 0 for p in self.parameters)

    @property
    def without_gradient(self) -> list[str]:
        return [p.name for p in self.parameters if p.gradient_bytes is None]


def check_layout(request: LayoutRequest) -> LayoutCheck:
    """Build ``request``'s rank on a fake process group and run the shape pass; a ConfigError naming the
    layout and the stage that failed otherwise. The process group is destroyed before this returns."""
    if not 0 <= request.rank < request.world_size:
        raise ConfigError(f"{request.describe()}: --rank must be in 0..{request.world_size - 1}")
    if dist.is_available() and dist.is_initialized():
        # The fake group would replace the caller's default group; refuse rather than break a running job.
        raise ConfigError(f"{request.describe()}: a process group is already running in this process")
    started = time.perf_counter()
    stage = "creating the process group"
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

        dist.init_process_group("fake", store=FakeStore(), rank=request.rank, world_size=request.world_size)
        try:
            stage = "creating the mesh"
            process = ProcessInfo(
                rank=request.rank, world_size=request.world_size, local_world_size=request.world_size
            )
            mesh = create_mesh(request.parallel, process)
            stage = "building the model"
            with torch.device("meta"):
                serial_shapes = {n: tuple(p.shape) for n, p in request.build_model().named_parameters()}
                model = request.build_model()
                stage = "the workload's parallelize (tensor/context parallelism)"
                model = request.parallelize(model, mesh)
                stage = "the data-parallel wrapper"
                with ddp_without_value_checks():
                    replica = wrap_data_parallel(
                        model, request.parallel, process, Device("cpu"), mesh, request.fsdp_units(model)
                    )
            stage = "the forward/backward shape pass"
            output = shape_pass(request, model, replica)
        finally:
            dist.destroy_process_group()
    except DlscaleError as error:
        raise ConfigError(f"{request.describe()}: {error}") from None
    except Exception as error:  # a torch error: its first line is what the user needs
        raise ConfigError(f"{request.describe()}: {stage} failed: {exception_line(error)}") from None
    parameters = tuple(_rank_parameter(n, p, serial_shapes[n]) for n, p in model.named_parameters())
    trainable = tuple(
        ParameterInfo(p.name, p.local_shape, p.itemsize) for p in parameters if p.gradient_bytes is not None
    )
    is_ddp = isinstance(replica, nn.parallel.DistributedDataParallel)
    buckets = (
        sum(p.gradient_bytes or 0 for p in parameters)
        if is_ddp and not request.parallel.gradient_as_bucket_view
        else 0
    )
    return LayoutCheck(
        mesh=mesh.shape,
        rank=request.rank,
        wrapper="DDP" if is_ddp else "FSDP2" if replica is model and _is_fully_sharded(model) else "none",
        parameters=parameters,
        optimizer_state_bytes=request.optimizer.state_bytes(trainable),
        ddp_bucket_bytes=buckets,
        pass_output=output,
        seconds=time.perf_counter() - started,
    )


@contextlib.contextmanager
def ddp_without_value_checks() -> Iterator[None]:
    """Let DDP be constructed on meta parameters.

    DDP's constructor compares every rank's parameter shapes by reading numbers out of a tensor (``.item()``),
    which meta tensors do not have; the fake group would answer with this rank's own shapes anyway, so the
    check cannot find anything here. Everything else DDP's constructor does runs as in a real run.
    """
    import torch.nn.parallel.distributed as ddp_module

    name = "_verify_param_shape_across_processes"
    if not hasattr(ddp_module, name):  # a torch that checks differently: let it try
        yield
        return
    with mock.patch.object(ddp_module, name, lambda *args, **kwargs: None):
        yield


def shape_pass(request: LayoutRequest, model: nn.Module, replica: nn.Module) -> tuple[int, ...]:
    """One forward, loss and backward on fake tensors at the local batch; the output's shape."""
    # DDP's reducer allocates and hooks real buckets, which fake tensors cannot feed: run the model it wraps.
    runner = model if isinstance(replica, nn.parallel.DistributedDataParallel) else replica
    inputs, target = request.sample
    amp_dtype = AMP_DTYPES[request.amp_mode]
    # allow_non_fake_inputs: to_empty turns the meta parameters into fake ones from inside the mode.
    with FakeTensorMode(allow_non_fake_inputs=True):
        model.to_empty(device="cpu")
        batch = torch.zeros((request.local_batch, *inputs.shape), dtype=inputs.dtype)
        labels = torch.zeros((request.local_batch, *target.shape), dtype=target.dtype)
        autocast = torch.autocast("cpu", dtype=amp_dtype) if amp_dtype else contextlib.nullcontext()
        with autocast:
            prediction = runner(batch)
            loss = request.loss(prediction, labels)
        loss.backward()
        return tuple(prediction.shape)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    # FSDP2's parameters and gradients are DTensors: their shape is the whole tensor's, to_local this rank's.
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _rank_parameter(name: str, parameter: nn.Parameter, serial_shape: tuple[int, ...]) -> RankParameter:
    local = _local(parameter)
    grad = None
    if parameter.requires_grad and parameter.grad is not None:
        grad = _local(parameter.grad).numel() * parameter.grad.dtype.itemsize
    return RankParameter(name, serial_shape, tuple(local.shape), parameter.dtype.itemsize, grad)


def _is_fully_sharded(model: nn.Module) -> bool:
    return any(hasattr(p, "to_local") for p in model.parameters())
