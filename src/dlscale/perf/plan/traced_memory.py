"""What one training step of any model holds, found by running it on fake tensors: no memory, no GPU.

``dlscale plan`` cannot have a formula for every model (the ViT's is :mod:`dlscale.perf.plan.layout_cost`), so for
the others it builds the model and runs one forward pass and the loss under ``FakeTensorMode``: every tensor there
has a shape, a dtype and a device but no data, so a model planned for an 80 GB GPU traces on a laptop in
seconds. Saved-tensor hooks see each tensor autograd keeps for backward, as
:func:`dlscale.perf.plan.saved_tensors.measure_saved_tensor_bytes` does on real tensors (the unit tests check that
both find the same bytes), and sort the storages: the parameters themselves (no extra memory), activations
(everything computed from the batch: a dispatch mode follows that through every operator) and the rest, made
from parameters alone (autocast's half-precision weights). Each storage counts once and whole. A fake
storage has no address, so storages are told apart by their identity (``StorageWeakRef``), kept unique by
holding every traced tensor until the trace ends.

The trace follows the CPU's kernels (autocast on the CPU, the CPU's choice of attention kernel): on a GPU the
same operators save the same tensors, except where a GPU library picks another algorithm (see
:mod:`dlscale.perf.plan.layout_cost` on attention). What the trace returns is only what depends on the model and
the batch; per-layout memory (sharding, buckets, optimizer state) is :mod:`dlscale.perf.plan.traced_layouts`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from dlscale.errors import InvalidValue
from dlscale.training.precision import AMP_DTYPES

LossFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
UnitsOf = Callable[[nn.Module], Sequence[nn.Module]]


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one sample's input or target (a batch adds the leading dimension)."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @classmethod
    def of(cls, value: object) -> TensorSpec:
        """The spec of a data set's tensor (or of anything ``torch.as_tensor`` takes, such as a label)."""
        tensor = torch.as_tensor(value)
        return cls(tuple(tensor.shape), tensor.dtype)

    def __str__(self) -> str:
        return f"{str(self.dtype).removeprefix('torch.')} {tuple(self.shape)}"


@dataclass(frozen=True)
class ParameterInfo:
    """One parameter tensor: its name, shape, bytes per element, whether it is contiguous (FSDP2 shards only
    contiguous ones) and the FSDP unit that owns it (-1: the root)."""

    name: str
    shape: tuple[int, ...]
    itemsize: int
    unit: int = -1
    contiguous: bool = True

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


@dataclass(frozen=True)
class TracedStep:
    """What the traced step holds that depends on the model and the local batch (bytes, one replica)."""

    parameters: tuple[ParameterInfo, ...]  # the ones that train (requires_grad)
    units: int  # FSDP units the workload names (the root, holding the rest, is not counted)
    local_batch: int
    amp_mode: str
    saved_activations: int  # storages autograd saves for backward that were computed from the batch
    autocast_weight_copies: int  # saved storages not computed from the batch (autocast's casts of weights)
    unsaved_batch: int  # bytes of the input and target batches that autograd does not hold itself

    @property
    def parameter_count(self) -> int:
        return sum(p.numel for p in self.parameters)

    @property
    def parameter_bytes(self) -> int:
        return sum(p.nbytes for p in self.parameters)


def _storage_identity(tensor: torch.Tensor) -> int:
    """An id of the storage holding ``tensor`` (its StorageImpl), unique while the storage lives."""
    return StorageWeakRef(tensor.untyped_storage()).cdata


class _TraceMode(TorchDispatchMode):
    """Sees every operator of the traced forward: notes which storages are computed from the batch, and gives
    batch norm's statistics the dtype the real kernels give them.

    "Computed from the batch" is followed through the operators themselves, so a convolution of the input
    image by a weight (whose autograd node has the weight as its only input) is an activation, as it is. Every
    output is kept referenced until the trace ends (fake: it costs nothing), so that no storage id is reused.

    Batch norm: with a half-precision input and fp32 weights (autocast leaves BatchNorm's parameters alone),
    the CPU and CUDA kernels keep the saved mean and 1/std in fp32; the fake kernel makes them half precision.
    """

    def __init__(self) -> None:
        super().__init__()
        self.from_batch: set[int] = set()
        self.outputs: list[torch.Tensor] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        outputs = func(*args, **kwargs)
        if func is torch.ops.aten.native_batch_norm.default:
            weight = args[1]
            if weight is not None and weight.dtype != args[0].dtype:
                outputs = (outputs[0], *(stat.to(weight.dtype) for stat in outputs[1:]))
        produced = [t for t in pytree.tree_leaves(outputs) if isinstance(t, torch.Tensor)]
        self.outputs += produced
        consumed = pytree.tree_leaves((args, kwargs))
        if any(isinstance(t, torch.Tensor) and _storage_identity(t) in self.from_batch for t in consumed):
            self.from_batch.update(_storage_identity(t) for t in produced)
        return outputs


class _SavedStorages:
    """The pack hook: sums each storage autograd saves once, by whether it was computed from the batch."""

    def __init__(self, model: nn.Module, trace: _TraceMode):
        # parameters and buffers (BatchNorm's running statistics) are saved by reference: nothing new
        self.own_ids = {_storage_identity(t) for t in (*model.parameters(), *model.buffers())}
        self.trace = trace
        self.seen: set[int] = set()
        self.activations = self.weight_copies = 0

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        identity = _storage_identity(tensor)
        nbytes = tensor.untyped_storage().nbytes()
        if identity not in self.seen and identity not in self.own_ids:
            self.seen.add(identity)
            if identity in self.trace.from_batch:
                self.activations += nbytes
            else:  # made from parameters alone (autocast's cast of a weight), or a constant of the forward
                self.weight_copies += nbytes
        # A detached alias, not the tensor: a saved output would otherwise hold its own grad_fn (a cycle).
        return tensor.detach()


def _make_fake(model: nn.Module) -> nn.Module:
    """``model`` (built on the meta device) with its parameters and buffers replaced by fake CPU tensors of
    the same shapes, strides (channels-last stays) and dtypes; call inside the ``FakeTensorMode``.

    The model is built on the meta device rather than under the fake mode, because ``Module.to`` (to a memory
    format, a dtype) cannot swap a fake parameter in place.
    """
    replaced: dict[int, torch.Tensor] = {}  # tied parameters stay tied

    def fake(tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) not in replaced:
            new = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device="cpu")
            if isinstance(tensor, nn.Parameter):
                new = nn.Parameter(new, requires_grad=tensor.requires_grad)
            replaced[id(tensor)] = new
        return replaced[id(tensor)]

    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for name, tensor in table.items():
                if tensor is not None:
                    table[name] = fake(tensor)
    return model


def check_amp_mode(amp_mode: str) -> torch.dtype | None:
    """The autocast dtype of ``amp_mode`` (none, fp16, bf16)."""
    if amp_mode not in AMP_DTYPES:
        raise InvalidValue("amp_mode", f"must be one of {', '.join(AMP_DTYPES)}, got {amp_mode!r}")
    return AMP_DTYPES[amp_mode]


def trace_training_step(
    build_model: Callable[[], nn.Module],
    sample: tuple[TensorSpec, TensorSpec],
    loss: LossFunction,
    local_batch: int,
    amp_mode: str = "none",
    units_of: UnitsOf | None = None,
) -> TracedStep:
    """Build the model, run forward and loss on a fake batch as the training step does; nothing is allocated.

    ``sample`` is one (input, target) pair's specs; ``units_of`` (the workload's ``fsdp_units``) names the
    submodules FSDP2 shards as units of their own. The forward runs under autocast, the loss in fp32 on the
    prediction (as :class:`dlscale.training.step.TrainStep` does). ``build_model`` runs on the meta device, so it
    must not read tensor values (``.item()``, numpy); initialization in place is fine.
    """
    if local_batch < 1:
        raise InvalidValue("local_batch", f"must be >= 1, got {local_batch}")
    autocast_dtype = check_amp_mode(amp_mode)
    input_spec, target_spec = sample
    with torch.device("meta"):
        model = build_model()
    trace = _TraceMode()
    with FakeTensorMode(), torch.device("cpu"), trace:
        model = _make_fake(model)
        units = list(units_of(model)) if units_of is not None else []
        owners: dict[int, int] = {}  # as FSDP2 shards them: a parameter belongs to the first unit holding it
        for unit, module in enumerate(units):
            for parameter in module.parameters():
                owners.setdefault(id(parameter), unit)
        trained = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        inputs = torch.zeros((local_batch, *input_spec.shape), dtype=input_spec.dtype)
        targets = torch.zeros((local_batch, *target_spec.shape), dtype=target_spec.dtype)
        trace.from_batch.update(_storage_identity(t) for t in (inputs, targets))
        saved = _SavedStorages(model, trace)
        autocast = torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda tensor: tensor):
            with autocast:
                predictions = model(inputs)
            loss_value = loss(predictions.float(), targets)
        unsaved = sum(
            t.untyped_storage().nbytes() for t in (inputs, targets) if _storage_identity(t) not in saved.seen
        )
    del loss_value, trace  # the graph and the fake tensors go here
    return TracedStep(
        parameters=tuple(
            ParameterInfo(name, tuple(p.shape), p.element_size(), owners.get(id(p), -1), p.is_contiguous())
            for name, p in trained
        ),
        units=len(units),
        local_batch=local_batch,
        amp_mode=amp_mode,
        saved_activations=saved.activations,
        autocast_weight_copies=saved.weight_copies,
        unsaved_batch=unsaved,
    )
