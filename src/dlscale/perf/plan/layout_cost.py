"""The cost model of one dp x tp x cp layout of the ViT: per-GPU memory and per-step communication, without
any GPU.

:mod:`dlscale.perf.plan.layouts` ranks the layouts of a number of GPUs with it (``dlscale plan``); the parallel
tests reuse :func:`dlscale.perf.plan.saved_tensors.measure_saved_activation_bytes` to check the activation formula
on real ranks.

The parallel model estimated (see :mod:`dlscale.parallel.vit_parallel`)
-----------------------------------------------------------------------
* tp: in every block q, k, v and fc1 keep out/tp rows of their weight and bias, proj and fc2 in/tp columns of
  their weight (their bias is replicated); heads are split over tp. The patch embedding, pos_embed, the
  LayerNorms and the head are replicated. Needs num_heads % tp == 0 and mlp_hidden_dim % tp == 0.
* cp: the N = (H/p)(W/p) tokens are split after the embedding as ``torch.tensor_split`` does, so the busiest
  rank holds n = ceil(N/cp) tokens; attention all-gathers k and v (every rank keeps full-length k and v of its
  heads) and the head's output is all-gathered before ``unpatchify``. Needs cp <= N.
* dp: DDP all-reduces the gradients over the dp x cp ranks that hold the same parameters; FSDP2 shards
  parameters, gradients and optimizer state over them. The global batch is split over dp.

Memory per GPU (bytes; the busiest rank)
----------------------------------------
parameters, gradients and optimizer state are fp32: 4 + 4 + 4 * (2 for Adam/AdamW, 1 for SGD with momentum,
0 without) bytes per stored parameter. Activations are the tensors autograd saves for backward. With b the
local batch, n = ceil(N/cp), D the width, F the MLP width, h the heads, a the bytes of a matmul output (2
under fp16/bf16 autocast, else 4), one block saves::

    2 * b*n*D*4            inputs of norm1 and norm2 (the residual stream stays fp32 under autocast)
    2 * 2 * b*n*4          their mean and 1/std per token
    L * b*n*D*a            inputs of q, k, v and fc1: autocast casts the norm output once per linear (L = 4);
                           in fp32 q, k and v share norm1's output (L = 2)
    b*n*(D/tp)*a           queries                    saved by scaled_dot_product_attention, with
    2 * b*N*(D/tp)*a       keys and values, gathered  the logsumexp below; the output's storage is
    b*n*(D/tp)*a           attention output           also proj's input
    b*(h/tp)*n*4           logsumexp, fp32, per head and query
    2 * b*n*(F/tp)*a       fc1's output (GELU's input) and GELU's output (fc2's input)

plus, once: the input image cast for the patch convolution (b*C_in*H*W*a; in fp32 the batch itself), the final
norm's input and statistics, the head's input, and the relative-L2 loss's fp32 difference (b*C_out*H*W*4, on
every cp rank, since the loss is computed on the gathered output) and two per-sample norms. Under autocast,
the half-precision copy of every matmul weight is saved for backward too (2 bytes per weight). These terms are
exactly what :func:`~dlscale.perf.plan.saved_tensors.measure_saved_tensor_bytes` finds on the CPU (the unit
tests check several shapes in fp32 and bf16, serial and emulated tp/cp ranks).

On a GPU, scaled_dot_product_attention runs flash attention (fp16/bf16) or the memory-efficient kernel (fp32);
both save q, k, v, the output and a float32 logsumexp of shape (B, heads, N) (the efficient kernel pads N to a
multiple of 32) and two RNG scalars, which is what the CPU flash kernel saves, so the formula holds there. The
math fallback (odd head sizes) would save the (B, heads, n, N) attention matrix instead; it is not modelled.

FSDP keeps, beyond its shards, the unsharded parameters of the unit being computed and of the prefetched one
and the unsharded gradients of one unit (each block, and the rest of the model, are assumed to be one unit).
DDP with ``gradient_as_bucket_view: false`` keeps its buckets beside the gradients. The batch itself (fp32)
counts where autograd does not hold it: the targets, the inputs under autocast, and the batches the loader has
copied ahead for the next steps (``loader.prefetch_depth`` with the gpu pipeline, one with the pytorch loader's
``device_prefetch``); without them the estimate was 17 % below the peak an H100 measured for `short` in bf16
(benchmarks/results/2026-11-26-h100-first-light.md). Finally, each GPU gets a fixed
:data:`CUDA_ALLOWANCE_BYTES` for the CUDA context and library workspaces.

Communication per GPU and step (bytes sent, ring algorithms)
------------------------------------------------------------
An all-reduce of S bytes over g ranks sends 2(g-1)/g * S; an all-gather or reduce-scatter of a total of S
bytes sends (g-1)/g * S. Uneven token chunks are padded to the largest one (cp * n tokens in all), as the
gathers do.

* tp, per block: forward all-reduces of the attention and the MLP output (b*n*D values in the matmul dtype),
  backward all-reduces of the gradients of the two norm outputs entering the tp region (fp32: LayerNorm
  runs in fp32 under autocast).
* cp, per block: all-gather of k and v (2*b*(cp*n)*(D/tp) values) forward, reduce-scatter of their gradients
  backward; once: the all-gather of the head output forward (its backward keeps the local slice, no traffic)
  and the all-gather of the embedding's fp32 gradient when the split is undone in backward.
* dp over dp*cp ranks: DDP all-reduces the fp32 gradients of the local parameters; FSDP all-gathers the
  parameters in forward and again in backward and reduce-scatters the gradients (1.5 times DDP's bytes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from dlscale.errors import InvalidValue
from dlscale.models.vit import token_grid
from dlscale.models.vit_config import ViTConfig

GIB = 1 << 30  # the "GB" of nvidia-smi and pynvml, and of dlscale plan's output
FP32_BYTES = 4
HALF_BYTES = 2
# The CUDA context of a process that has loaded torch's kernels (about 0.5 GB on A100/H100 with CUDA 12's
# lazy module loading), cuBLAS/cuDNN workspaces (tens of MB) and NCCL's communicator buffers (a few hundred
# MB): none of it is a tensor, all of it is on the card.
CUDA_ALLOWANCE_BYTES = 1 * GIB
# Saved tensors of the relative-L2 loss besides the difference, one value per sample each: ||difference||
# (saved by the norm's backward and by the division, one storage) and ||target||.
LOSS_NORMS_PER_SAMPLE = 2
DATA_PARALLEL_KINDS = ("ddp", "fsdp", "dataparallel")
OPTIMIZER_STATES = {"Adam": 2, "AdamW": 2}  # fp32 tensors per parameter; SGD: 1 with momentum, else 0


@dataclass(frozen=True)
class ModelShape:
    """Everything about the ViT and its data that memory and traffic depend on."""

    embed_dim: int
    depth: int
    num_heads: int
    mlp_hidden_dim: int
    patch_size: int
    qkv_bias: bool
    img_size: tuple[int, int]
    in_channels: int
    out_channels: int
    dropout: float = 0.0

    @classmethod
    def from_config(
        cls, model: ViTConfig, img_size: Sequence[int], in_channels: int, out_channels: int
    ) -> ModelShape:
        """The shape of the model ``VisionTransformer(model, img_size, in_channels, out_channels)`` builds."""
        token_grid(tuple(img_size), model.patch_size)  # raises InvalidValue when the patch does not divide
        return cls(
            embed_dim=model.embed_dim,
            depth=model.depth,
            num_heads=model.num_heads,
            mlp_hidden_dim=model.mlp_hidden_dim,
            patch_size=model.patch_size,
            qkv_bias=model.qkv_bias,
            img_size=(int(img_size[0]), int(img_size[1])),
            in_channels=in_channels,
            out_channels=out_channels,
            dropout=model.dropout,
        )

    @property
    def num_tokens(self) -> int:
        """N: patches per image."""
        rows, cols = token_grid(self.img_size, self.patch_size)
        return rows * cols

    @property
    def head_features(self) -> int:
        """Outputs of the head per token: out_channels * p * p."""
        return self.out_channels * self.patch_size**2

    @property
    def pixels(self) -> int:
        return self.img_size[0] * self.img_size[1]


@dataclass(frozen=True)
class TrainingSettings:
    """The parts of a run's config other than the model that decide memory and traffic."""

    global_batch_size: int
    local_batch_size: int | None = None  # when set, the per-replica batch (global = local x dp)
    amp_mode: str = "none"  # none | fp16 | bf16
    optimizer: str = "Adam"  # Adam | AdamW | SGD
    momentum: float = 0.9  # SGD only
    data_parallel: str = "ddp"  # ddp | fsdp | dataparallel
    gradient_as_bucket_view: bool = True  # DDP: gradients are views into the all-reduce buckets
    noddp: bool = False  # no gradient synchronization at all
    # Batches the loader has on the GPU ahead of the one computing: the gpu pipeline's prefetch_depth, the
    # pytorch loader's one with device_prefetch (loader section), none without.
    device_batches_ahead: int = 1
    # Multi-step training (train.rollout_steps, the largest K of a rollout_schedule): K model steps per sample,
    # with each step's activations recomputed in backward under rollout_checkpointing.
    rollout_steps: int = 1
    rollout_checkpointing: bool = False

    def __post_init__(self) -> None:
        if self.rollout_steps < 1:
            raise InvalidValue("rollout_steps", f"must be >= 1, got {self.rollout_steps}")
        if self.global_batch_size < 1:
            raise InvalidValue("global_batch_size", f"must be >= 1, got {self.global_batch_size}")
        if self.local_batch_size is not None and self.local_batch_size < 1:
            raise InvalidValue("local_batch_size", f"must be >= 1 or null, got {self.local_batch_size}")
        if self.device_batches_ahead < 0:
            raise InvalidValue("prefetch_depth", f"must be >= 0, got {self.device_batches_ahead}")
        if self.amp_mode not in ("none", "fp16", "bf16"):
            raise InvalidValue("amp_mode", f"must be none, fp16 or bf16, got {self.amp_mode!r}")
        if self.optimizer not in ("Adam", "AdamW", "SGD"):
            raise InvalidValue("optimizer", f"must be Adam, AdamW or SGD, got {self.optimizer!r}")
        if self.data_parallel not in DATA_PARALLEL_KINDS:
            raise InvalidValue(
                "data_parallel",
                f"must be one of {', '.join(DATA_PARALLEL_KINDS)}, got {self.data_parallel!r}",
            )

    @classmethod
    def from_run_config(cls, cfg: Any) -> TrainingSettings:
        """The settings of a loaded :class:`~dlscale.config.run_config.RunConfig`."""
        return cls(
            global_batch_size=cfg.train.global_batch_size,
            local_batch_size=cfg.train.local_batch_size,
            amp_mode=cfg.train.amp_mode,
            optimizer=cfg.optim.optimizer,
            momentum=cfg.optim.momentum,
            data_parallel=cfg.parallel.data_parallel,
            gradient_as_bucket_view=cfg.parallel.gradient_as_bucket_view,
            noddp=cfg.parallel.noddp,
            device_batches_ahead=cfg.loader.prefetch_depth
            if cfg.loader.pipeline == "gpu"
            else int(bool(cfg.loader.device_prefetch)),
            rollout_steps=cfg.train.max_rollout_steps,
            rollout_checkpointing=cfg.train.rollout_checkpointing,
        )

    @property
    def matmul_bytes(self) -> int:
        """Bytes per value of a matmul's output: half precision under autocast, else fp32."""
        return HALF_BYTES if self.amp_mode != "none" else FP32_BYTES

    @property
    def optimizer_states(self) -> int:
        """fp32 state tensors the optimizer keeps per parameter."""
        if self.optimizer == "SGD":
            return 1 if self.momentum > 0 else 0
        return OPTIMIZER_STATES[self.optimizer]


@dataclass(frozen=True, order=True)
class Layout:
    """Sizes of the mesh: data-, tensor- and context-parallel ranks (dp * tp * cp GPUs)."""

    dp: int
    tp: int
    cp: int

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.cp

    def __str__(self) -> str:
        return f"dp={self.dp} tp={self.tp} cp={self.cp}"


def enumerate_layouts(gpus: int) -> list[Layout]:
    """Every (dp, tp, cp) with dp * tp * cp == gpus, in ascending (dp, tp, cp) order."""
    if gpus < 1:
        raise InvalidValue("gpus", f"must be a whole number of GPUs >= 1, got {gpus}")
    divisors = [d for d in range(1, gpus + 1) if gpus % d == 0]
    return sorted(
        Layout(dp, tp, gpus // (dp * tp)) for dp in divisors for tp in divisors if (gpus // dp) % tp == 0
    )


def layout_problems(shape: ModelShape, settings: TrainingSettings, layout: Layout) -> list[str]:
    """Why ``layout`` cannot run this model and batch (empty when it can)."""
    problems = []
    if shape.num_heads % layout.tp:
        problems.append(
            f"tp={layout.tp} does not divide the {shape.num_heads} attention heads (tp splits whole heads)"
        )
    if shape.mlp_hidden_dim % layout.tp:
        problems.append(f"tp={layout.tp} does not divide the MLP hidden width {shape.mlp_hidden_dim}")
    if layout.cp > shape.num_tokens:
        problems.append(f"cp={layout.cp} is more than the {shape.num_tokens} tokens to split")
    if settings.local_batch_size is None and settings.global_batch_size % layout.dp:
        problems.append(f"dp={layout.dp} does not divide the global batch of {settings.global_batch_size}")
    if settings.data_parallel == "dataparallel" and layout.tp * layout.cp > 1:
        problems.append("data_parallel 'dataparallel' (one process) cannot be combined with tp or cp")
    if settings.noddp and layout.cp > 1:
        problems.append("noddp cannot be used with cp > 1 (the cp ranks' gradients must be summed)")
    return problems


def local_batch_size(settings: TrainingSettings, layout: Layout) -> int:
    """Samples per replica: the configured local batch, else the global batch over dp."""
    if settings.local_batch_size is not None:
        return settings.local_batch_size
    return settings.global_batch_size // layout.dp


def local_tokens(shape: ModelShape, cp: int) -> int:
    """Tokens on the busiest cp rank: ceil(N / cp) (tensor_split gives the first ranks the extra ones)."""
    return -(-shape.num_tokens // cp)


def local_parameter_shapes(shape: ModelShape, tp: int) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter one tp rank holds (names as ``VisionTransformer`` has them)."""
    d, hidden, p = shape.embed_dim, shape.mlp_hidden_dim, shape.patch_size
    shapes: dict[str, tuple[int, ...]] = {
        "pos_embed": (1, shape.num_tokens, d),
        "patch_embed.proj.weight": (d, shape.in_channels, p, p),
        "patch_embed.proj.bias": (d,),
    }
    for i in range(shape.depth):
        block = f"blocks.{i}"
        shapes[f"{block}.norm1.weight"] = shapes[f"{block}.norm1.bias"] = (d,)
        for name in ("q", "k", "v"):  # column-parallel: out/tp rows
            shapes[f"{block}.attn.{name}.weight"] = (d // tp, d)
            if shape.qkv_bias:
                shapes[f"{block}.attn.{name}.bias"] = (d // tp,)
        shapes[f"{block}.attn.proj.weight"] = (d, d // tp)  # row-parallel: in/tp columns, replicated bias
        shapes[f"{block}.attn.proj.bias"] = (d,)
        shapes[f"{block}.norm2.weight"] = shapes[f"{block}.norm2.bias"] = (d,)
        shapes[f"{block}.mlp.fc1.weight"] = (hidden // tp, d)
        shapes[f"{block}.mlp.fc1.bias"] = (hidden // tp,)
        shapes[f"{block}.mlp.fc2.weight"] = (d, hidden // tp)
        shapes[f"{block}.mlp.fc2.bias"] = (d,)
    shapes["norm.weight"] = shapes["norm.bias"] = (d,)
    shapes["head.weight"] = (shape.head_features, d)
    return shapes


def _is_matmul_weight(name: str, dims: tuple[int, ...]) -> bool:
    """Weights that autocast copies to half precision: those of the convolution and the linears."""
    return name.endswith(".weight") and len(dims) >= 2


def _fsdp_shard(dims: tuple[int, ...], shards: int) -> int:
    """Elements of one FSDP2 shard of a parameter: dim 0 is split, padded up to a multiple of ``shards``."""
    return -(-dims[0] // shards) * math.prod(dims[1:])


@dataclass(frozen=True)
class ParameterCounts:
    """Parameters of one GPU: the tp shard (``local``) and what it stores after FSDP sharding (``stored``)."""

    local: int
    stored: int
    matmul_weights: int  # local conv and linear weights (autocast copies these)
    largest_unit: int  # local parameters of the largest FSDP unit (one block, or the rest of the model)


def count_parameters_per_gpu(
    shape: ModelShape, settings: TrainingSettings, layout: Layout
) -> ParameterCounts:
    """Parameter counts of one GPU of ``layout``."""
    shapes = local_parameter_shapes(shape, layout.tp)
    shards = layout.dp * layout.cp if settings.data_parallel == "fsdp" else 1
    block_zero = sum(math.prod(dims) for name, dims in shapes.items() if name.startswith("blocks.0."))
    local = sum(math.prod(dims) for dims in shapes.values())
    return ParameterCounts(
        local=local,
        stored=sum(_fsdp_shard(dims, shards) for dims in shapes.values()),
        matmul_weights=sum(math.prod(dims) for name, dims in shapes.items() if _is_matmul_weight(name, dims)),
        largest_unit=max(block_zero, local - shape.depth * block_zero),
    )


@dataclass(frozen=True)
class ActivationEstimate:
    """Bytes autograd saves for backward on one GPU, by where they are saved."""

    per_block: int
    depth: int
    input_image: int  # the patch convolution's input
    final_norm: int  # input and statistics of the last LayerNorm
    head_input: int
    loss: int

    @property
    def total(self) -> int:
        return self.per_block * self.depth + self.input_image + self.final_norm + self.head_input + self.loss


def estimate_activation_bytes(
    shape: ModelShape, amp_mode: str, local_batch: int, tp: int = 1, cp: int = 1
) -> ActivationEstimate:
    """Saved-for-backward bytes of one training step of one GPU (see the module docstring for each term)."""
    amp = amp_mode != "none"
    a = HALF_BYTES if amp else FP32_BYTES
    b, n, full = local_batch, local_tokens(shape, cp), shape.num_tokens
    d, hidden = shape.embed_dim, shape.mlp_hidden_dim
    tokens = b * n
    norm_input_and_stats = tokens * d * FP32_BYTES + 2 * tokens * FP32_BYTES
    # Autocast casts the norm output once per linear (q, k, v; fc1); in fp32 the linears save the norm
    # outputs themselves, and q, k and v share norm1's.
    linear_input_copies = 4 if amp else 2
    per_block = (
        2 * norm_input_and_stats
        + linear_input_copies * tokens * d * a
        + tokens * (d // tp) * a  # queries
        + 2 * b * full * (d // tp) * a  # keys and values, gathered to full length over cp
        + tokens * (d // tp) * a  # attention output = proj's input
        + b * (shape.num_heads // tp) * n * FP32_BYTES  # logsumexp
        + 2 * tokens * (hidden // tp) * a  # fc1 output (GELU input), GELU output (fc2 input)
    )
    return ActivationEstimate(
        per_block=per_block,
        depth=shape.depth,
        input_image=b * shape.in_channels * shape.pixels * a,
        final_norm=norm_input_and_stats,
        head_input=tokens * d * a,
        loss=b * shape.out_channels * shape.pixels * FP32_BYTES + LOSS_NORMS_PER_SAMPLE * b * FP32_BYTES,
    )


def estimate_batch_bytes(shape: ModelShape, settings: TrainingSettings, local_batch: int) -> int:
    """The fp32 batches on one GPU that the activations do not count: the targets, the inputs under autocast
    (autograd saves their half-precision cast; in fp32 it saves the inputs themselves, counted there), and
    ``device_batches_ahead`` whole batches the loader has already copied for the next steps. Every tp and cp rank
    holds the whole local batch (cp splits the tokens after the patch embedding)."""
    inputs = local_batch * shape.in_channels * shape.pixels * FP32_BYTES
    targets = settings.rollout_steps * local_batch * shape.out_channels * shape.pixels * FP32_BYTES
    held = targets + (inputs if settings.amp_mode != "none" else 0)
    return held + settings.device_batches_ahead * (inputs + targets)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes on one GPU at the peak of a training step (the parts that are modelled)."""

    parameters: int
    gradients: int
    optimizer_state: int
    sharding_overhead: int  # FSDP's unsharded working set, or DDP's buckets beside the gradients
    activations: int
    autocast_weight_copies: int
    cuda_allowance: int = CUDA_ALLOWANCE_BYTES
    batch: int = 0  # the input and target batches where autograd does not hold them, and those loaded ahead

    @property
    def model_states(self) -> int:
        """Parameters, gradients, optimizer state and the data-parallel wrapper's extra copies."""
        return self.parameters + self.gradients + self.optimizer_state + self.sharding_overhead

    @property
    def total(self) -> int:
        return (
            self.model_states
            + self.activations
            + self.batch
            + self.autocast_weight_copies
            + self.cuda_allowance
        )

    def json_fields(self) -> dict[str, dict[str, Any]]:
        """``memory_bytes`` (every part, the model states and the total) and the same in ``memory_gb`` (2 decimals),
        as a plan's JSON row holds them."""
        in_bytes = {**asdict(self), "model_states": self.model_states, "total": self.total}
        return {
            "memory_bytes": in_bytes,
            "memory_gb": {key: round(value / GIB, 2) for key, value in in_bytes.items()},
        }


def estimate_memory(shape: ModelShape, settings: TrainingSettings, layout: Layout) -> MemoryEstimate:
    """Per-GPU memory of ``layout`` (which must be valid: see :func:`layout_problems`)."""
    counts = count_parameters_per_gpu(shape, settings, layout)
    replicas = layout.dp * layout.cp
    sharding_overhead = 0
    if settings.data_parallel == "fsdp" and replicas > 1:
        # the unit being computed and the prefetched one unsharded, and one unit's unsharded gradients
        sharding_overhead = 3 * counts.largest_unit * FP32_BYTES
    elif settings.data_parallel == "ddp" and replicas > 1 and not settings.noddp:
        sharding_overhead = 0 if settings.gradient_as_bucket_view else counts.local * FP32_BYTES
    activations = estimate_activation_bytes(
        shape, settings.amp_mode, local_batch_size(settings, layout), layout.tp, layout.cp
    )
    state = local_batch_size(settings, layout) * shape.in_channels * shape.pixels * FP32_BYTES
    saved = rollout_activation_bytes(activations.total, activations.loss, state, settings)
    copies = counts.matmul_weights * HALF_BYTES if settings.amp_mode != "none" else 0
    return MemoryEstimate(
        batch=estimate_batch_bytes(shape, settings, local_batch_size(settings, layout)),
        parameters=counts.stored * FP32_BYTES,
        gradients=counts.stored * FP32_BYTES,
        optimizer_state=counts.stored * FP32_BYTES * settings.optimizer_states,
        sharding_overhead=sharding_overhead,
        activations=saved,
        autocast_weight_copies=copies,
    )


def rollout_activation_bytes(one_step: int, loss: int, state: int, settings: TrainingSettings) -> int:
    """Saved-for-backward bytes of a K-step rollout (``settings.rollout_steps``) whose one step saves
    ``one_step`` bytes, ``loss`` of them the loss's, from an fp32 input ``state`` of that many bytes.

    Without checkpointing autograd keeps every step's tensors: K x ``one_step``. With
    ``rollout_checkpointing`` each step keeps only its input (what its recomputation starts from) and its loss's
    tensors; the peak is the recomputation of the last step, first in backward, with everything else still
    saved: (K - 1) x (``state`` + ``loss``) + ``one_step`` (the first step's input is the batch, which one
    step's count already holds, in fp32 as the patch embedding's saved input, under autocast in the batch). One
    step (K = 1) is ``one_step`` either way."""
    steps = settings.rollout_steps
    if steps == 1:
        return one_step
    if not settings.rollout_checkpointing:
        return steps * one_step
    return (steps - 1) * (state + loss) + one_step


@dataclass(frozen=True)
class CommEstimate:
    """Bytes one GPU sends per training step, by the parallel dimension that sends them."""

    tensor_parallel: int
    context_parallel: int
    data_parallel: int

    @property
    def total(self) -> int:
        return self.tensor_parallel + self.context_parallel + self.data_parallel


def _all_reduce_sent(total_bytes: float, ranks: int) -> float:
    return 2 * (ranks - 1) / ranks * total_bytes


def _gather_sent(total_bytes: float, ranks: int) -> float:
    """Bytes one rank sends in a ring all-gather (or reduce-scatter) of ``total_bytes`` in all."""
    return (ranks - 1) / ranks * total_bytes


def estimate_communication(
    shape: ModelShape, settings: TrainingSettings, layout: Layout, local_parameters: int | None = None
) -> CommEstimate:
    """Bytes sent per GPU and step by tp, cp and dp (see the module docstring for each collective)."""
    tp, cp = layout.tp, layout.cp
    b, n, d = local_batch_size(settings, layout), local_tokens(shape, cp), shape.embed_dim
    a = settings.matmul_bytes
    # A K-step rollout calls the model K times (twice that many forwards with checkpointing's recomputation).
    steps = settings.rollout_steps
    forwards = steps * (2 if settings.rollout_checkpointing and steps > 1 else 1)
    tensor_parallel = 0.0
    if tp > 1:
        forward = 2 * _all_reduce_sent(b * n * d * a, tp)  # attention and MLP outputs
        backward = 2 * _all_reduce_sent(b * n * d * FP32_BYTES, tp)  # gradients of the fp32 norm outputs
        tensor_parallel = shape.depth * (forwards * forward + steps * backward)
    context_parallel = 0.0
    if cp > 1:
        padded_tokens = cp * n
        keys_values = 2 * b * padded_tokens * (d // tp) * a
        # all-gather forward, reduce-scatter backward
        per_block = (forwards + steps) * _gather_sent(keys_values, cp)
        head_output = forwards * _gather_sent(b * padded_tokens * shape.head_features * a, cp)
        embedding_gradient = steps * _gather_sent(b * padded_tokens * d * FP32_BYTES, cp)
        context_parallel = shape.depth * per_block + head_output + embedding_gradient
    replicas = layout.dp * cp
    data_parallel = 0.0
    if replicas > 1 and not settings.noddp:
        if local_parameters is None:
            local_parameters = count_parameters_per_gpu(shape, settings, layout).local
        if settings.data_parallel == "fsdp":
            padded = replicas * count_parameters_per_gpu(shape, settings, layout).stored
            # all-gathers of the parameters in every forward and backward of a unit, one reduce-scatter of
            # the gradients (a K-step rollout runs each unit's forward and backward K times)
            data_parallel = (forwards + steps + 1) * _gather_sent(padded * FP32_BYTES, replicas)
        else:
            data_parallel = _all_reduce_sent(local_parameters * FP32_BYTES, replicas)
    return CommEstimate(round(tensor_parallel), round(context_parallel), round(data_parallel))
