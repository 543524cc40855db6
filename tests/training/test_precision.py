"""The compute switches: AMP (bf16/fp16 with the grad scaler), torch.compile, CUDA graphs, resume flags; AMP and
torch.compile for each of the ViT's token mixers (attention, AFNO, SFNO)."""

from __future__ import annotations

import pytest
import torch

from dlscale.checkpoint.resume import load_optimizer_state
from dlscale.data.era5.coordinates import formula_latitudes
from dlscale.models.vit import VisionTransformer
from dlscale.models.vit_config import ViTConfig
from dlscale.runtime.device import Device
from dlscale.scoring.metrics import relative_l2_loss
from dlscale.training.graphs import GraphedTrainStep, optimizer_is_capturable
from dlscale.training.optim import build_optimizer
from dlscale.training.optim_config import OptimConfig
from dlscale.training.precision import Precision
from dlscale.training.schedule import LRSchedule
from dlscale.training.step import TrainStep

CPU = Device("cpu")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


# The ViT's token mixers (model.mixer): each trains under AMP and torch.compile as attention does.
MIXERS = ("attention", "afno", "sfno")


def tiny_vit(
    seed: int = 0, device: str = "cpu", mixer: str = "attention", depth: int = 2
) -> VisionTransformer:
    torch.manual_seed(seed)
    cfg = ViTConfig(patch_size=4, embed_dim=32, depth=depth, num_heads=4, mixer=mixer)
    # SFNO's transform on the 16 rows the tiny ERA5 data has (the pole-to-pole grid of 17 without its last row)
    return VisionTransformer(cfg, (16, 32), 20, 20, formula_latitudes(17)[:16]).to(device)


def batch(seed: int = 1, size: int = 2, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(size, 20, 16, 32, generator=generator)
    return inputs.to(device), (inputs + 0.1 * torch.randn(inputs.shape, generator=generator)).to(device)


def make_step(model, amp_mode="none", device=CPU, forward=None, step_class=TrainStep, **kwargs):
    optimizer = build_optimizer(
        OptimConfig(), model.parameters(), 1e-3, capturable=kwargs.pop("capturable", False)
    )
    schedule = LRSchedule(peak_lr=1e-3, total_steps=100, warmup=0)
    return step_class(
        model, relative_l2_loss, optimizer, schedule, None, Precision(amp_mode, device), forward, **kwargs
    )


@pytest.mark.parametrize("mixer", MIXERS)
def test_bf16_autocast_runs_the_model_in_bf16_but_keeps_fp32_weights_and_loss(mixer):
    model = tiny_vit(mixer=mixer)
    seen = []
    model.blocks[0].mlp.fc1.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    step = make_step(model, "bf16")
    before = [p.detach().clone() for p in model.parameters()]
    loss = step(*batch(), global_step=0)
    assert seen == [torch.bfloat16]
    assert loss.dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    assert step.precision.scaler is None  # bf16 needs no loss scaling

    reference = make_step(tiny_vit(mixer=mixer), "none")(*batch(), global_step=0)
    assert loss.item() == pytest.approx(reference.item(), rel=2e-2)  # bf16 keeps 8 bits of mantissa
    assert loss.item() != reference.item()  # ... so it really computed in bf16


@pytest.mark.parametrize("mixer", MIXERS)
def test_fp16_scales_the_loss_and_unscales_gradients_before_the_update(mixer):
    fp16 = make_step(tiny_vit(mixer=mixer), "fp16")
    assert fp16.precision.scaler is not None
    inputs, targets = batch()
    fp16.optimizer.zero_grad()
    fp16.forward_backward(inputs, targets)
    scale = fp16.precision.scaler.get_scale()
    assert scale > 1
    scaled = torch.cat([p.grad.flatten().float() for p in fp16.model.parameters()])
    fp16.precision.unscale(fp16.optimizer)
    unscaled = torch.cat([p.grad.flatten().float() for p in fp16.model.parameters()])
    torch.testing.assert_close(unscaled * scale, scaled, rtol=1e-5, atol=0)

    fp32 = make_step(tiny_vit(mixer=mixer), "none")
    fp32.forward_backward(inputs, targets)
    reference = torch.cat([p.grad.flatten() for p in fp32.model.parameters()])
    cosine = torch.nn.functional.cosine_similarity(unscaled, reference, dim=0)
    assert cosine > 0.999


def test_fp16_skips_an_update_with_overflowing_gradients_and_lowers_the_scale():
    step = make_step(tiny_vit(), "fp16")
    inputs, targets = batch()
    inputs[0, 0, 0, 0] = float("inf")
    before = [p.detach().clone() for p in step.model.parameters()]
    scale = step.precision.scaler.get_scale()
    step(inputs, targets, global_step=0)
    assert all(torch.equal(b, p) for b, p in zip(before, step.model.parameters(), strict=True))
    assert step.precision.scaler.get_scale() < scale


def test_the_grad_scaler_state_round_trips_and_is_none_without_fp16():
    step = make_step(tiny_vit(), "fp16")
    step(*batch(), global_step=0)
    state = step.precision.state_dict()
    other = Precision("fp16", CPU)
    other.load_state_dict(state)
    assert other.scaler.get_scale() == step.precision.scaler.get_scale()
    assert Precision("bf16", CPU).state_dict() is None and Precision("none", CPU).state_dict() is None


def test_inference_under_amp_returns_fp32_predictions():
    model = tiny_vit()
    predict = Precision("bf16", CPU).wrap_inference(model)
    with torch.inference_mode():
        prediction = predict(batch()[0])
    assert prediction.dtype == torch.float32
    assert Precision("none", CPU).wrap_inference(model) is model


# The step is handed a torch.compile-d forward and must train through it exactly as through the model. Dynamo
# captures the ViT and AOTAutograd splits it into compiled forward and backward graphs; they run on ATen's
# kernels (aot_eager) rather than on inductor's C++, whose cold g++ build of this ViT's kernels made this the
# suite's slowest test (70-90 s on CI's two cores) and adds nothing to what is checked here. Inductor's
# kernels are compared with eager by the compiled runs of tests/e2e (train.enable_jit: dlscale's own
# torch.compile call).
COMPILE_BACKEND = "aot_eager"


# AFNO's compiled training is tests/models/test_afno.py::test_torch_compile_trains_the_afno_vit_as_eager_does.
# SFNO's has one block: every block compiles alike, and one takes half the time of two.
@pytest.mark.slow
@pytest.mark.parametrize(("mixer", "depth"), [("attention", 2), ("sfno", 1)])
def test_compiled_model_trains_like_the_eager_model(mixer, depth):
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    eager_model, compiled_model = tiny_vit(mixer=mixer, depth=depth), tiny_vit(mixer=mixer, depth=depth)
    eager = make_step(eager_model)
    compiled = make_step(compiled_model, forward=torch.compile(compiled_model, backend=COMPILE_BACKEND))
    for global_step in range(2):
        inputs, targets = batch(seed=global_step)
        expected = eager(inputs, targets, global_step)
        actual = compiled(inputs, targets, global_step)
        assert actual.item() == pytest.approx(expected.item(), rel=1e-4)
    assert counters["stats"]["unique_graphs"] >= 1  # dynamo really captured and compiled the model
    assert not counters["graph_break"]  # in one piece: no op of the mixer (FFTs, complex tensors) left out
    for a, b in zip(eager_model.parameters(), compiled_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_which_optimizer_updates_a_cuda_graph_can_capture():
    assert optimizer_is_capturable("Adam", "none") and optimizer_is_capturable("AdamW", "bf16")
    assert not optimizer_is_capturable("Adam", "fp16")  # the scaler decides on the host
    assert not optimizer_is_capturable("SGD", "none")
    with pytest.raises(ValueError, match="SGD has no capturable"):
        build_optimizer(OptimConfig(optimizer="SGD"), tiny_vit().parameters(), 0.1, capturable=True)


def test_a_resumed_optimizer_keeps_this_runs_fused_flag():
    """Optimizer.load_state_dict copies every saved hyper-parameter, `fused` too; resume must not."""
    model = tiny_vit()
    step = make_step(model)
    step(*batch(), global_step=0)
    saved = step.optimizer.state_dict()
    assert not saved["param_groups"][0].get("fused")
    fused = build_optimizer(OptimConfig(enable_fused=True), model.parameters(), 1e-3)
    load_optimizer_state(fused, saved, "ckpt.pt")
    assert fused.param_groups[0]["fused"] is True
    first = next(iter(model.parameters()))
    torch.testing.assert_close(fused.state[first]["exp_avg"], step.optimizer.state[first]["exp_avg"])


# ------------------------------------------------------------------------------------------- GPU only


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("amp_mode", ["none", "bf16", "fp16"])
def test_graphed_step_matches_eager_losses_and_weights(amp_mode):
    device = Device("cuda")
    device.configure(deterministic=False, tf32=False)
    capturable = optimizer_is_capturable("Adam", amp_mode)
    eager = make_step(tiny_vit(device="cuda"), amp_mode, device)
    graphed = make_step(
        tiny_vit(device="cuda"),
        amp_mode,
        device,
        step_class=GraphedTrainStep,
        warmup_steps=3,
        batch_size=4,
        capturable=capturable,
    )
    assert graphed.capture_optimizer == capturable
    # A short batch first (a run resumed at an epoch's short last batch: capture waits for a full one), five
    # full ones, and a short one after the capture.
    short = [batch(seed=s, size=3, device="cuda") for s in (8, 9)]
    batches = [short[0], *(batch(seed=s, size=4, device="cuda") for s in range(5)), short[1]]
    for global_step, (inputs, targets) in enumerate(batches):
        expected = eager(inputs, targets, global_step)
        actual = graphed(inputs, targets, global_step)
        torch.testing.assert_close(actual, expected, rtol=2e-3 if amp_mode == "none" else 2e-2, atol=1e-5)
    assert graphed.graph is not None and graphed.eager_steps == 2  # the two short batches ran eagerly
    assert graphed.static_inputs.shape[0] == 4
    for a, b in zip(eager.model.parameters(), graphed.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-3)


@needs_gpu
@pytest.mark.gpu
def test_graph_warm_up_leaves_weights_and_optimizer_state_as_they_were():
    device = Device("cuda")
    step = make_step(
        tiny_vit(device="cuda"),
        "none",
        device,
        step_class=GraphedTrainStep,
        warmup_steps=5,
        batch_size=4,
        capturable=True,
    )
    step.model.blocks[0].mlp.drop1 = torch.nn.Dropout(0.5)  # warm-up steps draw random numbers
    before = [p.detach().clone() for p in step.model.parameters()]
    random_state = torch.cuda.get_rng_state()
    inputs, targets = batch(size=4, device="cuda")
    step._capture(inputs, targets)
    torch.cuda.synchronize()
    assert all(torch.equal(b, p) for b, p in zip(before, step.model.parameters(), strict=True))
    assert torch.equal(torch.cuda.get_rng_state(), random_state)
    for state in step.optimizer.state.values():
        assert float(state["step"]) == 0 and not state["exp_avg"].any()
