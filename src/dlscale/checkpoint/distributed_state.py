"""A run's state as each rank holds it, in the serial model's coordinates: what a sharded checkpoint writes and
reads, so that DCP can reshard it between layouts.

Every tensor is named as in the serial model (``model.<name>``, wrapper prefixes dropped; ``optimizer.<parameter
index>.<state key>``) and has the serial shape. A tensor-parallel shard (a :class:`ShardSpec`) becomes a DTensor
sharded along its dimension over its tp group; an FSDP2 parameter or moment is a DTensor already, sharded over
dp; a tp shard that FSDP2 shards too becomes a DTensor on the 2-D (tp, dp) mesh of the two groups. Replicated
tensors stay plain tensors: DCP writes one copy of them. DCP then writes each rank's pieces at their offsets in
the serial tensor, and on loading reads, for each rank, the part its own layout needs, whichever layout wrote
the checkpoint.

A tp shard must be one of equal chunks (torch.chunk's rule), which is how DTensor places shards; the ViT's
tensor parallelism always splits evenly (whole heads, an MLP width divisible by tp).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from dlscale.checkpoint.files import canonical_names, load_model_state
from dlscale.checkpoint.noise_inputs import NoiseWidening, noise_widening
from dlscale.checkpoint.sharded_files import (
    MODEL_PREFIX,
    load_tensors,
    optimizer_name,
    parse_optimizer_name,
    tensor_entries,
    with_optimizer_tensors,
)
from dlscale.errors import CheckpointError
from dlscale.parallel.shard_specs import ShardSpec, is_dtensor, shard_specs
from dlscale.runtime.distributed import is_distributed


def model_tensors(model: nn.Module) -> dict[str, Any]:
    """{``model.<serial name>``: this rank's tensor, placed in the serial tensor} (no copies, no collectives)."""
    return {name: in_serial_coordinates(value, spec, key) for name, key, value, spec in _model_entries(model)}


def _model_entries(model: nn.Module) -> Iterator[tuple[str, str, torch.Tensor, ShardSpec | None]]:
    """(checkpoint name, the model's own state_dict key, this rank's tensor, its ShardSpec) of every tensor."""
    state = model.state_dict()
    specs = shard_specs(model)
    for canonical, key in canonical_names(list(state)).items():
        if torch.is_tensor(state[key]):
            yield f"{MODEL_PREFIX}{canonical}", key, state[key], specs.get(key)


def optimizer_parts(
    model: nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the optimizer's tensors, named and placed as :func:`model_tensors`'s; the rest of its state dict: param
    groups and non-tensor per-parameter entries, the same on every rank)."""
    state = optimizer.state_dict()
    params, specs = _indexed_parameters(model, optimizer)
    tensors: dict[str, Any] = {}
    rest: dict[int, dict[str, Any]] = {}
    for index, entries in state["state"].items():
        param = params[index]
        for key, value in entries.items():
            if not torch.is_tensor(value):
                rest.setdefault(index, {})[key] = value
                continue
            moment = value.ndim > 0 and tuple(value.shape) == tuple(param.shape)
            spec = specs.get(index) if moment else None
            tensors[optimizer_name(index, key)] = in_serial_coordinates(
                value, spec, f"optimizer state {index}.{key}"
            )
    return tensors, {**state, "state": rest}


def model_template(model: nn.Module) -> tuple[dict[str, Any], dict[str, str]]:
    """(empty tensors to load this rank's part of the model into, named as in the checkpoint; {checkpoint name:
    the model's own state_dict key})."""
    template, keys = {}, {}
    for name, key, value, spec in _model_entries(model):
        template[name] = in_serial_coordinates(torch.empty_like(value), spec, key)
        keys[name] = key
    return template, keys


def optimizer_template(
    model: nn.Module, optimizer: torch.optim.Optimizer, saved: Mapping[str, Any]
) -> dict[str, Any]:
    """Empty tensors for the optimizer tensors the checkpoint holds (``saved``: {name: DCP's tensor metadata}):
    a moment of a parameter's serial shape is placed like the parameter, anything else (a step count) is whole."""
    params, specs = _indexed_parameters(model, optimizer)
    template: dict[str, Any] = {}
    for name, md in saved.items():
        parsed = parse_optimizer_name(name)
        if parsed is None:
            continue
        index = parsed[0]
        param = params[index] if index < len(params) else None
        dtype = md.properties.dtype
        if (
            param is not None
            and tuple(md.size) == _serial_shape(param, specs.get(index))
            and len(md.size) > 0
        ):
            local = torch.empty_like(param, dtype=dtype)
            template[name] = in_serial_coordinates(local, specs.get(index), name)
        else:
            template[name] = torch.empty(tuple(md.size), dtype=dtype)
    return template


def local_value(value: Any, original: Any) -> Any:
    """A loaded template tensor back as this rank holds it: the tp shard itself, or the FSDP2 DTensor like
    ``original`` (the parameter or tensor the template was made for)."""
    if not is_dtensor(value):
        return value
    local = value.to_local()
    if is_dtensor(original):
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(
            local,
            original.device_mesh,
            original.placements,
            run_check=False,
            shape=original.shape,
            stride=original.stride(),
        )
    return local


def in_serial_coordinates(value: torch.Tensor, spec: ShardSpec | None, what: str) -> Any:
    """``value`` as a tensor of the serial shape that this rank holds a piece of (see the module's text)."""
    if spec is None:
        return value.detach() if torch.is_tensor(value) and not is_dtensor(value) else value
    from torch.distributed.tensor import DTensor, Shard

    ranks = len(spec.sizes)
    even = list(torch.empty(spec.full_length()).chunk(ranks))
    if [len(chunk) for chunk in even] != list(spec.sizes):
        raise CheckpointError(
            f"{what}: its {ranks} tensor-parallel shards have sizes {list(spec.sizes)}, not the equal chunks a "
            "sharded checkpoint can place; use checkpoint.format: file"
        )
    full = _serial_shape(value, spec)
    stride = torch.empty(full, device="meta").stride()
    if is_dtensor(value):  # FSDP2 over dp, of this tp shard: a 2-D mesh (tp first, as the shards nest)
        mesh = _tp_and_dp_mesh(spec.group, value.device_mesh, value.device.type)
        placements = [Shard(spec.dim), *value.placements]
        local = value.to_local()
    else:
        mesh = _mesh_of(spec.group, value.device.type)
        placements = [Shard(spec.dim)]
        local = value.detach()
    return DTensor.from_local(local, mesh, placements, run_check=False, shape=full, stride=stride)


def _serial_shape(value: Any, spec: ShardSpec | None) -> tuple[int, ...]:
    shape = list(value.shape)  # a DTensor's shape is its global one (the tp shard's, for FSDP2 over dp)
    if spec is not None:
        shape[spec.dim] = spec.full_length()
    return tuple(shape)


def _indexed_parameters(
    model: nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[list[nn.Parameter], dict[int, ShardSpec]]:
    """The optimizer's parameters in its state_dict's index order, and the ShardSpecs of the sharded ones."""
    specs = shard_specs(model)
    by_identity = {id(p): specs.get(name) for name, p in model.named_parameters()}
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return params, {i: by_identity[id(p)] for i, p in enumerate(params) if by_identity.get(id(p)) is not None}


# DeviceMeshes made from the run's groups, made once: {(id of each group, device type): (groups, mesh)}. The
# groups are kept with their mesh, so that a key is only taken for the very groups it was made from.
_MESHES: dict[tuple[Any, ...], tuple[tuple[Any, ...], Any]] = {}


def _cached_mesh(groups: tuple[Any, ...], device_type: str, make: Any) -> Any:
    key = (*(id(g) for g in groups), device_type)
    cached = _MESHES.get(key)
    if cached is None or any(a is not b for a, b in zip(cached[0], groups, strict=True)):
        cached = _MESHES[key] = (groups, make())
    return cached[1]


def _mesh_of(group: Any, device_type: str) -> Any:
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    group = group if group is not None else dist.group.WORLD
    return _cached_mesh((group,), device_type, lambda: DeviceMesh.from_group(group, device_type))


def _tp_and_dp_mesh(tp_group: Any, dp_mesh: Any, device_type: str) -> Any:
    """The 2-D mesh (tp, dp) of a tp group and the dp mesh FSDP2 shards over, built from the existing groups.

    Ranks are linear in their mesh indices, so the rank at (tp index i, dp index j) is this rank's tp peer i plus
    its dp peer j minus itself.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    dp_group = dp_mesh.get_group()

    def make() -> Any:
        me = dist.get_rank()
        tp_ranks = dist.get_process_group_ranks(tp_group)
        dp_ranks = dist.get_process_group_ranks(dp_group)
        grid = torch.tensor([[t + d - me for d in dp_ranks] for t in tp_ranks])
        return DeviceMesh.from_group(
            [tp_group, dp_group], device_type, mesh=grid, mesh_dim_names=("tp", "dp")
        )

    return _cached_mesh((tp_group, dp_group), device_type, make)


def load_model_shards(model: nn.Module, path: Any, source: str, weights_only: bool = False) -> None:
    """Load this rank's part of the model from the sharded checkpoint in ``path`` (every rank calls it).

    With ``weights_only``, a checkpoint of the model without its noise inputs loads too: the noise-input weight
    is widened by zeros as from a single file (:mod:`dlscale.checkpoint.noise_inputs`).
    """
    template, keys = model_template(model)
    entries = tensor_entries(path)
    saved = {name for name in entries if name.startswith(MODEL_PREFIX)}
    missing, unexpected = sorted(set(template) - saved), sorted(saved - set(template))
    if missing or unexpected:  # as strict as the single file: a weight left out is a different model
        listed = [f"missing from the checkpoint: {_names(missing)}"] if missing else []
        listed += [f"unexpected in the checkpoint: {_names(unexpected)}"] if unexpected else []
        raise CheckpointError(
            f"{source}: the checkpoint's model state does not fit the model ({'; '.join(listed)}). The checkpoint "
            "was written for a different model configuration; compare the `model:` sections of the two configs."
        )
    state = model.state_dict()
    widening = _noise_widening(model, entries, keys) if weights_only else None
    narrow = f"{MODEL_PREFIX}{widening.name}" if widening is not None else None
    if narrow is not None:
        # The checkpoint's narrower weight has no place in this rank's layout: every rank reads all of it (DCP
        # loads a plain tensor whole), widens it, and keeps what its layout holds of the widened weight.
        ours = state[keys[narrow]]
        template[narrow] = torch.empty(tuple(entries[narrow].size), dtype=ours.dtype, device=ours.device)
    load_tensors(template, path, entries, no_dist=not is_distributed())
    loaded = {keys[n]: local_value(v, state[keys[n]]) for n, v in template.items()}
    if narrow is not None:
        loaded[keys[narrow]] = _placed_like(widening.widen(template[narrow], source), state[keys[narrow]])
    load_model_state(model, loaded, source)


def _noise_widening(
    model: nn.Module, entries: Mapping[str, Any], keys: Mapping[str, str]
) -> NoiseWidening | None:
    """:func:`~dlscale.checkpoint.noise_inputs.noise_widening` of a sharded checkpoint (``entries``: DCP's tensor
    metadata; ``keys``: {checkpoint name: the model's state_dict key}). None for a tensor-parallel shard of the
    weight too (tp refuses noise inputs): :func:`load_tensors` then reports its shape mismatch."""
    shapes = {
        n[len(MODEL_PREFIX) :]: tuple(md.size) for n, md in entries.items() if n.startswith(MODEL_PREFIX)
    }
    widening = noise_widening(model, shapes)
    key = keys.get(f"{MODEL_PREFIX}{widening.name}") if widening is not None else None
    if key is None or shard_specs(model).get(key) is not None:
        return None
    return widening


def _placed_like(full: torch.Tensor, original: Any) -> Any:
    """The serial tensor ``full`` (the same on every rank) as this rank holds ``original``: its FSDP2 shard when
    ``original`` is a DTensor (cut on each rank, no scatter), ``full`` itself otherwise."""
    if not is_dtensor(original):
        return full
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(full, original.device_mesh, original.placements, src_data_rank=None)


def _names(names: list[str], shown: int = 4) -> str:
    names = [name[len(MODEL_PREFIX) :] for name in names]
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def optimizer_state_from_shards(
    model: nn.Module, optimizer: torch.optim.Optimizer, path: Any, saved_rest: Mapping[str, Any]
) -> dict[str, Any]:
    """The optimizer's state dict for this rank, from the sharded checkpoint in ``path`` and its header's part
    ``saved_rest`` (param groups, non-tensor entries); every rank calls it."""
    entries = tensor_entries(path)
    template = optimizer_template(model, optimizer, entries)
    load_tensors(template, path, entries, no_dist=not is_distributed())
    params, _ = _indexed_parameters(model, optimizer)
    local = {}
    for name, value in template.items():
        index = parse_optimizer_name(name)[0]
        local[name] = local_value(value, params[index] if index < len(params) else value)
    return with_optimizer_tensors(saved_rest, local)
