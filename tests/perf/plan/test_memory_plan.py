"""The estimator behind `dlscale plan`: layouts, parameter counts per rank, the activation formula against
the tensors autograd really saves (serial model, emulated tp / cp ranks), and how traffic scales."""

from __future__ import annotations

import gc
import math
import weakref
from pathlib import Path

import pytest
import torch
from torch import nn

from dlscale.commands.plan import describe_requested
from dlscale.config import load_run_config
from dlscale.errors import InvalidValue
from dlscale.models.parameters import count_parameters
from dlscale.models.vit import Attention, VisionTransformer
from dlscale.models.vit_config import ViTConfig
from dlscale.perf.plan.layout_cost import (
    GIB,
    Layout,
    ModelShape,
    TrainingSettings,
    count_parameters_per_gpu,
    enumerate_layouts,
    estimate_activation_bytes,
    estimate_communication,
    estimate_memory,
    layout_problems,
    local_parameter_shapes,
)
from dlscale.perf.plan.layouts import estimate_layout, model_shape_of, plan, tutorial_comparisons
from dlscale.perf.plan.saved_tensors import measure_saved_activation_bytes, measure_saved_tensor_bytes
from dlscale.scoring.metrics import relative_l2_loss

CONFIG_FILE = Path(__file__).resolve().parents[3] / "configs" / "vit_era5.yaml"
IN_CHANNELS, OUT_CHANNELS = 3, 2
# (embed_dim, depth, num_heads, image, local batch): widths, depths, head counts, grids and batches all vary.
TINY_SHAPES = [
    (32, 1, 2, (16, 32), 1),
    (64, 2, 4, (24, 48), 2),
    (96, 3, 3, (16, 32), 3),
    (48, 2, 4, (24, 48), 3),
]
# The formula is built from the model's structure; on the CPU it lands within bytes of the measurement.
TOLERANCE = 0.01


def tiny_model(
    embed: int, depth: int, heads: int, image: tuple[int, int]
) -> tuple[VisionTransformer, ModelShape]:
    torch.manual_seed(0)
    cfg = ViTConfig(embed_dim=embed, depth=depth, num_heads=heads, patch_size=4)
    return VisionTransformer(cfg, image, IN_CHANNELS, OUT_CHANNELS), ModelShape.from_config(
        cfg, image, IN_CHANNELS, OUT_CHANNELS
    )


def batch(local_batch: int, image: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(local_batch, IN_CHANNELS, *image, generator=generator)
    return inputs, torch.randn(local_batch, OUT_CHANNELS, *image, generator=generator)


def training_loss(targets: torch.Tensor):
    """The training step's loss: computed in fp32 outside autocast."""
    return lambda predictions: relative_l2_loss(predictions.float(), targets)


def autocast_dtype(amp_mode: str) -> torch.dtype | None:
    return {"none": None, "bf16": torch.bfloat16}[amp_mode]


def mp_config(*overrides: str):
    return load_run_config(CONFIG_FILE, "mp", list(overrides), {})


# ---- layouts -----------------------------------------------------------------------------------------------


def test_every_factorization_of_8_gpus_is_a_layout():
    found = {(layout.dp, layout.tp, layout.cp) for layout in enumerate_layouts(8)}
    assert found == {
        (1, 1, 8), (1, 2, 4), (1, 4, 2), (1, 8, 1), (2, 1, 4),
        (2, 2, 2), (2, 4, 1), (4, 1, 2), (4, 2, 1), (8, 1, 1),
    }  # fmt: skip
    assert [layout.gpus for layout in enumerate_layouts(8)] == [8] * 10
    assert enumerate_layouts(1) == [Layout(1, 1, 1)]


@pytest.mark.parametrize("gpus", [0, -4])
def test_a_gpu_count_below_one_is_refused(gpus):
    with pytest.raises(InvalidValue, match=f"gpus: .*got {gpus}"):
        enumerate_layouts(gpus)


def test_invalid_layouts_are_refused_with_the_reason():
    settings = TrainingSettings(global_batch_size=6)
    _, shape = tiny_model(32, 1, 4, (16, 32))  # 32 tokens, 4 heads, MLP 128
    assert layout_problems(shape, settings, Layout(1, 2, 1)) == []
    assert "does not divide the 4 attention heads" in layout_problems(shape, settings, Layout(1, 3, 1))[0]
    assert "more than the 32 tokens" in layout_problems(shape, settings, Layout(1, 1, 64))[0]
    assert "does not divide the global batch of 6" in layout_problems(shape, settings, Layout(4, 1, 1))[0]
    # a configured local batch is per replica: any dp works
    per_replica = TrainingSettings(global_batch_size=6, local_batch_size=5)
    assert layout_problems(shape, per_replica, Layout(4, 1, 1)) == []
    one_process = TrainingSettings(global_batch_size=6, data_parallel="dataparallel")
    assert "cannot be combined with tp or cp" in layout_problems(shape, one_process, Layout(1, 2, 1))[0]


def test_the_requested_layout_is_found_or_explained():
    shape = model_shape_of(mp_config())
    settings = TrainingSettings(global_batch_size=12, amp_mode="fp16")
    result = plan(shape, settings, gpus=3, gpu_memory_gb=80.0, requested_tp=3)
    assert result.requested.layout == Layout(1, 3, 1)
    assert "cannot run: tp=3 does not divide the 8 attention heads" in describe_requested(result)
    elsewhere = plan(shape, settings, gpus=4, gpu_memory_gb=80.0, requested_tp=3)
    assert elsewhere.requested is None
    assert "tp x cp = 3 does not divide 4 GPU(s)" in describe_requested(elsewhere)
    fitting = plan(shape, settings, gpus=4, gpu_memory_gb=80.0, requested_tp=2, requested_cp=2)
    row = fitting.requested
    assert row.layout == Layout(1, 2, 2) and row.fits
    assert describe_requested(fitting).endswith(f"fits ({row.memory.total / GIB:.2f} of 80.00 GB).")


def test_an_mlp_width_that_tp_does_not_divide_is_refused():
    cfg = ViTConfig(embed_dim=12, depth=1, num_heads=4, patch_size=4, mlp_ratio=0.5)  # MLP width 6
    shape = ModelShape.from_config(cfg, (16, 32), IN_CHANNELS, OUT_CHANNELS)
    problems = layout_problems(shape, TrainingSettings(global_batch_size=4), Layout(1, 4, 1))
    assert problems == ["tp=4 does not divide the MLP hidden width 6"]


def test_the_plan_ranks_fitting_layouts_by_traffic_then_the_rest():
    shape = model_shape_of(mp_config())
    settings = TrainingSettings(global_batch_size=12, amp_mode="fp16")
    result = plan(shape, settings, gpus=8, gpu_memory_gb=8.0)
    fitting = [row for row in result.rows if row.fits]
    too_big = [row for row in result.rows if row.valid and not row.fits]
    invalid = [row for row in result.rows if not row.valid]
    assert fitting and too_big and invalid, "8 GB and batch 12 should give all three kinds of rows"
    assert result.rows == fitting + too_big + invalid
    assert [r.comm.total for r in fitting] == sorted(r.comm.total for r in fitting)
    assert [r.memory.total for r in too_big] == sorted(r.memory.total for r in too_big)
    for row in fitting:
        assert row.memory.total <= 8 * GIB and row.reason == ""
    for row in too_big:
        assert row.memory.total > 8 * GIB and f"needs {row.memory.total / GIB:.2f} GB" in row.reason
    assert [row.layout for row in invalid] == [Layout(8, 1, 1)]
    assert invalid[0].reason == "dp=8 does not divide the global batch of 12"


# ---- parameters per rank -----------------------------------------------------------------------------------


@pytest.mark.parametrize("qkv_bias", [True, False])
def test_serial_parameter_shapes_are_the_models(qkv_bias):
    torch.manual_seed(0)
    cfg = ViTConfig(embed_dim=48, depth=2, num_heads=4, patch_size=4, qkv_bias=qkv_bias)
    model = VisionTransformer(cfg, (16, 32), IN_CHANNELS, OUT_CHANNELS)
    shape = ModelShape.from_config(cfg, (16, 32), IN_CHANNELS, OUT_CHANNELS)
    expected = {name: tuple(param.shape) for name, param in model.named_parameters()}
    assert local_parameter_shapes(shape, tp=1) == expected
    counts = count_parameters_per_gpu(shape, TrainingSettings(global_batch_size=1), Layout(1, 1, 1))
    assert counts.local == counts.stored == count_parameters(model)


def test_the_mp_parameter_count_is_the_models():
    cfg = mp_config()
    with torch.device("meta"):
        model = VisionTransformer(
            cfg.model, cfg.data.img_size, cfg.data.n_in_channels, cfg.data.n_out_channels
        )
    counts = count_parameters_per_gpu(
        model_shape_of(cfg), TrainingSettings.from_run_config(cfg), Layout(4, 1, 1)
    )
    assert counts.local == count_parameters(model)


def sliced_parameter_count(model: nn.Module, tp: int, rank: int) -> int:
    """Parameters of tp rank ``rank``, by slicing the model's own tensors the Megatron way."""
    total = 0
    for name, param in model.named_parameters():
        module = name.split(".")[-2] if name.startswith("blocks.") else ""  # blocks.0.attn.q.weight -> q
        if module in ("q", "k", "v", "fc1"):  # column-parallel: rows of the weight and the bias
            total += torch.tensor_split(param, tp, dim=0)[rank].numel()
        elif module in ("proj", "fc2") and name.endswith("weight"):  # row-parallel: columns; bias replicated
            total += torch.tensor_split(param, tp, dim=1)[rank].numel()
        else:
            total += param.numel()
    return total


@pytest.mark.parametrize("tp", [2, 4])
def test_parameters_per_tp_rank_equal_slicing_the_model(tp):
    model, shape = tiny_model(64, 2, 4, (16, 32))
    expected = {sliced_parameter_count(model, tp, rank) for rank in range(tp)}
    assert len(expected) == 1, "every tp rank holds as many parameters"
    counts = count_parameters_per_gpu(shape, TrainingSettings(global_batch_size=1), Layout(1, tp, 1))
    assert counts.local == expected.pop()
    assert counts.local < count_parameters(model)


def test_fsdp_stores_each_parameters_padded_shard():
    model, shape = tiny_model(64, 2, 4, (16, 32))
    replicas = 3  # 64 rows do not split evenly into 3 shards
    settings = TrainingSettings(global_batch_size=3, data_parallel="fsdp")
    counts = count_parameters_per_gpu(shape, settings, Layout(replicas, 1, 1))
    # FSDP2 splits dim 0, padding it up to a multiple of the ranks
    expected = sum(math.ceil(p.shape[0] / replicas) * p[0].numel() for p in model.parameters())
    assert counts.stored == expected
    assert counts.local == count_parameters(model)
    memory = estimate_memory(shape, settings, Layout(replicas, 1, 1))
    assert memory.parameters == memory.gradients == 4 * expected
    assert memory.optimizer_state == 8 * expected  # Adam's two fp32 moments


@pytest.mark.parametrize(
    ("optimizer", "momentum", "states"),
    [("Adam", 0.9, 2), ("AdamW", 0.9, 2), ("SGD", 0.9, 1), ("SGD", 0.0, 0)],
)
def test_optimizer_state_is_fp32_per_state_tensor(optimizer, momentum, states):
    model, shape = tiny_model(32, 1, 2, (16, 32))
    settings = TrainingSettings(global_batch_size=1, optimizer=optimizer, momentum=momentum)
    memory = estimate_memory(shape, settings, Layout(1, 1, 1))
    assert memory.optimizer_state == states * 4 * count_parameters(model)


# ---- measuring saved tensors -------------------------------------------------------------------------------


class Squares(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.exp()  # exp saves its result
        half = y.shape[1] // 2
        return (y[:, :half] * y[:, half:]).sum()  # mul saves two views of that result


def test_a_storage_counts_once_however_many_views_of_it_are_saved():
    x = torch.randn(4, 8, requires_grad=True)
    assert measure_saved_activation_bytes(Squares(), x) == x.numel() * 4
    same = torch.randn(3, 5, requires_grad=True)
    assert measure_saved_activation_bytes(nn.Identity(), same, loss_fn=lambda y: (y * y).sum()) == 3 * 5 * 4


def test_parameters_are_not_activations_and_autocast_copies_are_told_apart():
    torch.manual_seed(0)
    linear = nn.Linear(16, 8)
    x = torch.randn(5, 16, requires_grad=True)  # so the weight is saved too, for the input's gradient
    fp32 = measure_saved_tensor_bytes(linear, x)
    assert (fp32.activations, fp32.parameters, fp32.parameter_copies) == (5 * 16 * 4, 8 * 16 * 4, 0)
    bf16 = measure_saved_tensor_bytes(linear, x, autocast_dtype=torch.bfloat16)
    # autocast saves its bf16 casts: the input's is an activation (made from an input), the weight's a copy
    assert (bf16.activations, bf16.parameters, bf16.parameter_copies) == (5 * 16 * 2, 0, 8 * 16 * 2)


class KeepsItsOutput(nn.Module):
    """exp, whose backward saves its own output, with a weak reference to that output kept aside."""

    def __init__(self) -> None:
        super().__init__()
        self.outputs: list[weakref.ref] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.exp()
        self.outputs.append(weakref.ref(y))
        return y


def test_measuring_what_autograd_saves_does_not_keep_the_graph_alive():
    # A pack hook that returns a saved output itself ties it to its own grad_fn through C++, a cycle the
    # garbage collector cannot break: the forward's saved tensors then stayed allocated for good.
    model = KeepsItsOutput()
    measure_saved_tensor_bytes(model, torch.randn(4, 3, requires_grad=True), lambda y: y.sum())
    gc.collect()
    assert model.outputs[0]() is None


# ---- activation formula vs measurement ---------------------------------------------------------------------


@pytest.mark.parametrize("amp_mode", ["none", "bf16"])
@pytest.mark.parametrize(("embed", "depth", "heads", "image", "local_batch"), TINY_SHAPES)
def test_serial_activation_estimate_matches_the_saved_tensors(
    embed, depth, heads, image, local_batch, amp_mode
):
    model, shape = tiny_model(embed, depth, heads, image)
    inputs, targets = batch(local_batch, image)
    measured = measure_saved_tensor_bytes(model, inputs, training_loss(targets), autocast_dtype(amp_mode))
    estimate = estimate_activation_bytes(shape, amp_mode, local_batch).total
    assert estimate == pytest.approx(measured.activations, rel=TOLERANCE)
    settings = TrainingSettings(global_batch_size=local_batch, amp_mode=amp_mode)
    memory = estimate_memory(shape, settings, Layout(1, 1, 1))
    assert memory.autocast_weight_copies == pytest.approx(measured.parameter_copies, rel=TOLERANCE)


def tensor_parallel_rank(model: VisionTransformer, tp: int) -> VisionTransformer:
    """One tp rank of ``model``: q/k/v/fc1 keep out/tp features, proj/fc2 take in/tp (their partial sums
    need an all-reduce that saves nothing for backward, so a lone rank saves what a real one does)."""
    for block in model.blocks:
        attn, mlp = block.attn, block.mlp
        for name in ("q", "k", "v"):
            old = getattr(attn, name)
            setattr(attn, name, nn.Linear(old.in_features, old.out_features // tp, bias=old.bias is not None))
        attn.proj = nn.Linear(attn.proj.in_features // tp, attn.proj.out_features)
        mlp.fc1 = nn.Linear(mlp.fc1.in_features, mlp.fc1.out_features // tp)
        mlp.fc2 = nn.Linear(mlp.fc2.in_features // tp, mlp.fc2.out_features)
    return model


class FirstContextRank(nn.Module):
    """Context-parallel rank 0 (the one with the most tokens) of ``model``, without process groups.

    The other ranks' keys, values and head outputs arrive as tensors outside this rank's graph, as after an
    all-gather; zeros of the right size stand in for them, since memory depends only on their shapes.
    """

    def __init__(self, model: VisionTransformer, cp: int):
        super().__init__()
        self.model, self.full = model, model.num_tokens
        self.local = torch.tensor_split(torch.arange(self.full), cp)[0].numel()
        for block in model.blocks:
            block.attn.attend = self._gathered_attention(block.attn)

    def _gathered_attention(self, attn: Attention):
        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return Attention.attend(attn, q, self._gather(k, dim=2), self._gather(v, dim=2))

        return attend

    def _gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        shape = list(x.shape)
        shape[dim] = self.full - x.shape[dim]
        return torch.cat([x, x.new_zeros(shape)], dim=dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.model.tokens(x)[:, : self.local].contiguous()
        out = self.model.head(self.model.norm(self.model.blocks(tokens)))
        return self.model.unpatchify(self._gather(out, dim=1))


@pytest.mark.parametrize("amp_mode", ["none", "bf16"])
@pytest.mark.parametrize(("tp", "cp"), [(2, 1), (4, 1), (1, 2), (1, 4), (2, 3)])
def test_activation_estimate_matches_an_emulated_parallel_rank(tp, cp, amp_mode):
    image, local_batch = (24, 44), 2  # 66 tokens: uneven over 4 ranks (17, 17, 16, 16)
    model, shape = tiny_model(64, 2, 4, image)
    rank = tensor_parallel_rank(model, tp)
    if cp > 1:
        rank = FirstContextRank(rank, cp)
    inputs, targets = batch(local_batch, image)
    measured = measure_saved_tensor_bytes(rank, inputs, training_loss(targets), autocast_dtype(amp_mode))
    estimate = estimate_activation_bytes(shape, amp_mode, local_batch, tp, cp).total
    assert estimate == pytest.approx(measured.activations, rel=TOLERANCE)
    # the split parts shrink: a parallel rank saves less than the serial model
    assert estimate < estimate_activation_bytes(shape, amp_mode, local_batch).total


def test_the_estimate_stays_below_what_the_tutorial_measured_on_the_gpu():
    # The estimate counts only live tensors (no allocator reserve, no temporaries): the card held more.
    for comparison in tutorial_comparisons():
        assert 0 < comparison.estimated_gb < comparison.measured_gb


@pytest.mark.parametrize(
    ("overrides", "ahead"),
    [
        ([], 1),  # the pytorch loader copies the next batch ahead (loader.device_prefetch, on by default)
        (["loader.device_prefetch=false"], 0),
        (["data_loader_config=gpu"], 2),  # the gpu pipeline's ring: loader.prefetch_depth batches
        (["data_loader_config=gpu", "loader.prefetch_depth=3"], 3),
    ],
)
@pytest.mark.parametrize("amp_mode", ["none", "bf16"])
def test_the_batch_counts_targets_the_uncast_inputs_and_the_batches_loaded_ahead(overrides, ahead, amp_mode):
    cfg = load_run_config(CONFIG_FILE, "short", [*overrides, f"amp_mode={amp_mode}"], {})
    settings = TrainingSettings.from_run_config(cfg)
    assert settings.device_batches_ahead == ahead
    shape = model_shape_of(cfg)
    sample = 20 * 360 * 720 * 4  # one fp32 field of 20 channels
    # autograd saves the inputs themselves in fp32 (counted with the activations), their bf16 cast under autocast
    held = 16 * sample * (1 if amp_mode == "none" else 2)
    for layout in (Layout(1, 1, 1), Layout(1, 2, 2)):  # tp and cp ranks hold the whole local batch
        memory = estimate_memory(shape, settings, layout)
        assert memory.batch == held + ahead * 16 * 2 * sample
        assert memory.total == (
            memory.model_states + memory.activations + memory.batch + memory.autocast_weight_copies
            + memory.cuda_allowance
        )  # fmt: skip
    assert estimate_memory(shape, settings, Layout(2, 1, 1)).batch == (held + ahead * 16 * 2 * sample) // 2


# ---- the mp config -----------------------------------------------------------------------------------------


def test_mp_memory_per_gpu_decreases_with_tp_at_a_fixed_local_batch():
    cfg = mp_config("train.local_batch_size=16")
    shape, settings = model_shape_of(cfg), TrainingSettings.from_run_config(cfg)
    estimates = [estimate_memory(shape, settings, Layout(1, tp, 1)) for tp in (1, 2, 4, 8)]
    for smaller, larger in zip(estimates[1:], estimates, strict=False):
        assert smaller.total < larger.total
        assert smaller.activations < larger.activations
        assert smaller.model_states < larger.model_states


def test_mp_with_the_global_batch_fixed_tp_alone_holds_more_samples_per_gpu():
    # mp's global batch of 64 on 4 GPUs: dp=4 gives each GPU 16 samples, tp=4 (dp=1) all 64. Norm inputs and
    # the linears' input copies are replicated over tp, so tp=4 saves more than dp=4 however heads are split.
    cfg = mp_config()
    shape, settings = model_shape_of(cfg), TrainingSettings.from_run_config(cfg)
    pure_dp = estimate_layout(shape, settings, Layout(4, 1, 1), 80 * GIB)
    pure_tp = estimate_layout(shape, settings, Layout(1, 4, 1), 80 * GIB)
    assert (pure_dp.local_batch, pure_tp.local_batch) == (16, 64)
    replicated_per_token = 2 * shape.embed_dim * 4 + 4 * shape.embed_dim * 2  # fp32 norm inputs, fp16 copies
    lower_bound = shape.depth * 64 * shape.num_tokens * replicated_per_token
    assert pure_tp.memory.activations > lower_bound > pure_dp.memory.activations


# ---- communication -----------------------------------------------------------------------------------------


def test_tensor_parallel_traffic_grows_as_tp_minus_one_over_tp():
    shape = model_shape_of(mp_config())
    settings = TrainingSettings(global_batch_size=16, local_batch_size=16, amp_mode="fp16")
    assert estimate_communication(shape, settings, Layout(1, 1, 1)).tensor_parallel == 0
    per_fraction = [
        estimate_communication(shape, settings, Layout(1, tp, 1)).tensor_parallel / ((tp - 1) / tp)
        for tp in (2, 4, 8)
    ]
    assert per_fraction == pytest.approx([per_fraction[0]] * 3, rel=1e-9)
    # fp32 activations double the forward all-reduces; the backward ones (fp32 gradients) stay
    fp32 = TrainingSettings(global_batch_size=16, local_batch_size=16, amp_mode="none")
    ratio = estimate_communication(shape, fp32, Layout(1, 2, 1)).tensor_parallel / (per_fraction[0] / 2)
    assert ratio == pytest.approx((4 + 4) / (2 + 4))


def test_context_parallel_traffic_grows_as_cp_minus_one_over_cp():
    shape = model_shape_of(mp_config())  # 4050 tokens: 2, 3, 5 and 6 ranks split them evenly
    settings = TrainingSettings(global_batch_size=16, local_batch_size=16, amp_mode="fp16")
    assert estimate_communication(shape, settings, Layout(1, 1, 1)).context_parallel == 0
    per_fraction = [
        estimate_communication(shape, settings, Layout(1, 1, cp)).context_parallel / ((cp - 1) / cp)
        for cp in (2, 3, 5, 6)
    ]
    assert per_fraction == pytest.approx([per_fraction[0]] * 4, rel=1e-9)


def test_ddp_traffic_is_one_gradient_all_reduce_whatever_the_batch():
    cfg = mp_config()
    with torch.device("meta"):
        model = VisionTransformer(
            cfg.model, cfg.data.img_size, cfg.data.n_in_channels, cfg.data.n_out_channels
        )
    shape = model_shape_of(cfg)
    gradient_bytes = 4 * count_parameters(model)
    for global_batch in (8, 64, 256):
        settings = TrainingSettings(global_batch_size=global_batch, amp_mode="fp16")
        sent = estimate_communication(shape, settings, Layout(8, 1, 1)).data_parallel
        assert sent == pytest.approx(2 * 7 / 8 * gradient_bytes, abs=1)  # ring all-reduce over 8 ranks
    # with cp the same parameters live on dp x cp ranks, so the all-reduce spans all of them
    settings = TrainingSettings(global_batch_size=8)
    assert estimate_communication(shape, settings, Layout(2, 1, 4)).data_parallel == pytest.approx(
        2 * 7 / 8 * gradient_bytes, abs=1
    )


def test_fsdp_sends_two_parameter_gathers_and_a_gradient_reduce_scatter():
    shape = model_shape_of(mp_config())
    ddp = TrainingSettings(global_batch_size=8)
    fsdp = TrainingSettings(global_batch_size=8, data_parallel="fsdp")
    counts = count_parameters_per_gpu(shape, fsdp, Layout(8, 1, 1))
    ddp_sent = estimate_communication(shape, ddp, Layout(8, 1, 1)).data_parallel
    fsdp_sent = estimate_communication(shape, fsdp, Layout(8, 1, 1)).data_parallel
    # 3 x (g-1)/g against DDP's 2 x (g-1)/g, on the padded shards
    assert fsdp_sent / ddp_sent == pytest.approx(1.5 * 8 * counts.stored / counts.local, rel=1e-6)
    assert (
        estimate_memory(shape, fsdp, Layout(8, 1, 1)).model_states
        < estimate_memory(shape, ddp, Layout(8, 1, 1)).model_states
    )
