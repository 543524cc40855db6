"""What autograd saves for backward, measured: the ground truth that :mod:`dlscale.perf.plan.layout_cost`'s
activation formula is checked against (on the CPU, serial and on forked parallel ranks)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class SavedTensorBytes:
    """Distinct storages autograd saved for backward, in bytes, by what they hold."""

    activations: int  # everything computed from the inputs: the memory that grows with batch and tokens
    parameter_copies: int  # new tensors made from parameters alone (autocast's half-precision weights)
    parameters: int  # the parameters themselves (saved by reference: no extra memory)


# Views and casts between a saved tensor and the leaf it came from: a short chain in practice (t() of a cast).
_MAX_LEAF_HOPS = 8


def _storage_key(tensor: torch.Tensor) -> tuple[str, int]:
    storage = tensor.untyped_storage()
    return (str(storage.device), storage.data_ptr())


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (FSDP2, tensor parallelism); the tensor itself otherwise."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _source_leaf(tensor: torch.Tensor) -> torch.Tensor | None:
    """The leaf tensor requiring grad that ``tensor`` was made from by single-input ops only, or None."""
    if tensor.is_leaf:
        return tensor if tensor.requires_grad else None
    node = tensor.grad_fn
    for _ in range(_MAX_LEAF_HOPS):
        if node is None:
            return None
        variable = getattr(node, "variable", None)  # only AccumulateGrad nodes carry one: the leaf
        if variable is not None:
            return variable
        inputs = [parent for parent, _ in node.next_functions if parent is not None]
        if len(inputs) != 1:
            return None
        node = inputs[0]
    return None


def measure_saved_tensor_bytes(
    model: nn.Module,
    inputs: torch.Tensor | Sequence[torch.Tensor],
    loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    autocast_dtype: torch.dtype | None = None,
) -> SavedTensorBytes:
    """Run ``model(*inputs)`` (and ``loss_fn`` on its output); sum the storages autograd saves for backward.

    Each storage counts once, however many tensors or views of it are saved, and whole: a view keeps its
    entire storage alive. ``autocast_dtype`` runs the forward under autocast on the inputs' device type; the
    loss runs outside it, as in the training step. Backward is not run. Works on any device, on forked
    parallel ranks too (a DTensor counts by its local shard); the parameters are the model's at call time.
    """
    inputs = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
    parameter_keys = {_storage_key(_local(p)) for p in model.parameters()}
    input_keys = {_storage_key(_local(x)) for x in inputs}
    totals = {"activations": 0, "parameter_copies": 0, "parameters": 0}
    seen: set[tuple[str, int]] = set()

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        local = _local(tensor)
        key = _storage_key(local)
        nbytes = local.untyped_storage().nbytes()
        if key in seen or nbytes == 0:
            return tensor.detach()
        seen.add(key)
        leaf = _source_leaf(local)
        if key in parameter_keys:
            kind = "parameters"
        elif leaf is not None and _storage_key(_local(leaf)) not in input_keys:
            # a parameter (e.g. one FSDP has just unsharded), a view of one, or a copy such as autocast's cast
            kind = "parameters" if _storage_key(_local(leaf)) == key else "parameter_copies"
        else:
            kind = "activations"
        totals[kind] += nbytes
        # Not the tensor itself: a saved output would then hold its own grad_fn, a reference cycle through
        # C++ that the garbage collector cannot break, and since backward never runs to release it, the whole
        # forward's saved tensors would stay allocated for the rest of the process. The detached alias keeps
        # the same storage alive only as long as the graph.
        return tensor.detach()

    if autocast_dtype is None:
        autocast = contextlib.nullcontext()
    else:
        autocast = torch.autocast(device_type=inputs[0].device.type, dtype=autocast_dtype)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        with autocast:
            output = model(*inputs)
        if loss_fn is not None:
            loss_fn(output)
    return SavedTensorBytes(**totals)


def measure_saved_activation_bytes(
    model: nn.Module,
    inputs: torch.Tensor | Sequence[torch.Tensor],
    loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    autocast_dtype: torch.dtype | None = None,
) -> int:
    """Bytes of activations saved for backward by ``model(*inputs)`` and ``loss_fn`` (parameters and their
    autocast copies excluded); see :func:`measure_saved_tensor_bytes`."""
    return measure_saved_tensor_bytes(model, inputs, loss_fn, autocast_dtype).activations
