"""The ViT's parallel form on a dp x tp x cp mesh, applied from outside the model.

Tensor parallelism: in every block q, k, v and fc1 become column-parallel and proj and fc2 row-parallel, so
each tp rank holds num_heads / tp whole heads and 1 / tp of the MLP (the attention reshapes by head width, so it
runs unchanged on fewer heads). LayerNorms, the patch and position embeddings and the head stay replicated.

Context parallelism: the tokens are split after the embedding (``pos_drop`` is the last step of
``VisionTransformer.tokens``) and the head's output is gathered before ``unpatchify``; keys and values are
gathered over cp inside attention.

The parallel model keeps the serial model's module tree and parameter names; its shards are cut from the serial
weights after every rank of a model replica has received the same weights, so it starts exactly where the
serial model starts.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from dlscale.errors import ConfigError
from dlscale.models.vit import VisionTransformer
from dlscale.parallel.collectives import split_sizes
from dlscale.parallel.context_parallel import SequenceGatheredLinear, SplitSequence
from dlscale.parallel.mesh import ParallelMesh
from dlscale.parallel.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    enter_tensor_parallel_region,
)


def check_vit_layout(model: VisionTransformer, tp: int, cp: int) -> None:
    """Refuse sizes the ViT cannot be split into (naming the size and what would fit), and dropout."""
    if model.mixer != "attention":  # a config refuses this already; a model built by hand meets it here
        raise ConfigError(
            f"parallel.tensor_parallel {tp} x context_parallel {cp} with model.mixer {model.mixer!r}: only the "
            "attention mixer has a tensor/context-parallel form; set both to 1"
        )
    heads = model.blocks[0].attn.num_heads if len(model.blocks) else 1
    hidden = model.blocks[0].mlp.fc1.out_features if len(model.blocks) else 1
    if heads % tp:
        fitting = [d for d in range(1, heads + 1) if heads % d == 0]
        raise ConfigError(
            f"parallel.tensor_parallel {tp}: the model's {heads} attention heads do not split over {tp} ranks "
            f"(tp splits whole heads); use one of {fitting}"
        )
    if hidden % tp:
        raise ConfigError(
            f"parallel.tensor_parallel {tp}: the MLP's hidden width {hidden} does not split over {tp} ranks"
        )
    dropping = [
        name
        for name, module in model.named_modules()
        if (isinstance(module, nn.Dropout) and module.p > 0) or getattr(module, "rate", 0) > 0
    ]
    if dropping:
        # Every rank draws from the same random stream, so shards would get the same mask pattern (correlated
        # dropout), and uneven token chunks would consume the stream differently and desynchronize DropPath.
        raise ConfigError(
            f"model.dropout > 0 with tensor/context parallelism is not supported yet ({len(dropping)} dropout "
            f"layers, e.g. {dropping[0]}): the ranks' masks would not be those of one model; set dropout: 0"
        )
    if cp > model.num_tokens:
        raise ConfigError(
            f"parallel.context_parallel {cp}: the model has only {model.num_tokens} tokens to split; use at most "
            f"{model.num_tokens}"
        )


def parallelize_vit(model: VisionTransformer, mesh: ParallelMesh) -> VisionTransformer:
    """Turn ``model`` (in place) into this rank's part of it on ``mesh``; returns the same object."""
    tp, cp = mesh.size("tp"), mesh.size("cp")
    if tp * cp == 1:
        return model
    check_vit_layout(model, tp, cp)
    share_replica_weights(model, mesh)
    tp_group, tp_index = mesh.group("tp"), mesh.index("tp")
    cp_group = mesh.group("cp")
    tokens = split_sizes(model.num_tokens, cp) if cp > 1 else None
    for block in model.blocks:
        attn, mlp = block.attn, block.mlp
        attn.q = ColumnParallelLinear(attn.q, tp_group, tp, tp_index)
        attn.k = ColumnParallelLinear(attn.k, tp_group, tp, tp_index, cp_group, tokens)
        attn.v = ColumnParallelLinear(attn.v, tp_group, tp, tp_index, cp_group, tokens)
        attn.proj = RowParallelLinear(attn.proj, tp_group, tp, tp_index)
        mlp.fc1 = ColumnParallelLinear(mlp.fc1, tp_group, tp, tp_index)
        mlp.fc2 = RowParallelLinear(mlp.fc2, tp_group, tp, tp_index)
        if tp > 1:
            enter_tensor_parallel_region(attn, tp_group)
            enter_tensor_parallel_region(mlp, tp_group)
    if cp > 1:
        model.pos_drop = nn.Sequential(model.pos_drop, SplitSequence(cp_group, cp))
        model.head = SequenceGatheredLinear(model.head, cp_group, cp, tokens)
    return model


def share_replica_weights(model: nn.Module, mesh: ParallelMesh) -> None:
    """Give every rank of a model replica (its tp x cp ranks) the weights of the replica's first rank.

    Every rank builds the model from the same seed, so they agree already; this makes it a guarantee (a different
    torch build or an extra random draw on one rank would otherwise give shards of different models).
    """
    group = mesh.group("tp-cp")
    if group is None:
        return
    source = dist.get_global_rank(group, 0)
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=source, group=group)
