"""FLOPs per training sample (analytic vs FlopCounterMode), the peak table, precision and MFU arithmetic."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from dlscale.models.vit import VisionTransformer, vit_flops_per_sample
from dlscale.models.vit_config import ViTConfig
from dlscale.perf.flops import (
    PEAK_TFLOPS,
    FlopsEstimate,
    Utilization,
    compute_precision,
    peak_tflops,
    training_flops_per_sample,
)

IMG = (32, 64)
CHANNELS = 20
BATCH = 2


def small_vit(**overrides) -> tuple[ViTConfig, VisionTransformer]:
    fields = dict(embed_dim=64, depth=2, num_heads=4, patch_size=4)
    fields.update(overrides)
    cfg = ViTConfig(**fields)
    torch.manual_seed(0)
    return cfg, VisionTransformer(cfg, IMG, CHANNELS, CHANNELS)


def patch_embed_forward_flops(cfg: ViTConfig, img: tuple[int, int], in_channels: int) -> int:
    tokens = (img[0] // cfg.patch_size) * (img[1] // cfg.patch_size)
    return 2 * tokens * in_channels * cfg.patch_size**2 * cfg.embed_dim


# --- FLOPs per sample: the analytic ViT count against FlopCounterMode ---


def test_analytic_vit_forward_matches_flop_counter():
    cfg, model = small_vit()
    # On CPU the fused SDPA kernel has no FLOP formula, so the counter would miss attention; the math
    # backend runs it as two counted bmm calls.
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(torch.randn(BATCH, CHANNELS, *IMG))
    counted = counter.get_total_flops() / BATCH
    assert counted == pytest.approx(vit_flops_per_sample(cfg, IMG, CHANNELS, CHANNELS), rel=0.05)


def test_measured_training_flops_are_three_forwards_less_the_patch_input_gradient():
    cfg, model = small_vit()
    analytic = vit_flops_per_sample(cfg, IMG, CHANNELS, CHANNELS)
    measured = training_flops_per_sample(model, torch.randn(BATCH, CHANNELS, *IMG))
    assert measured.method == "measured"
    # The 3x rule assumes every layer needs a gradient for its input as well as for its weights. The patch
    # embedding is the first layer and the data needs no gradient, so autograd skips that matmul: the
    # measured count is 3x forward minus one patch-embedding forward, exactly. That is 4.0% here (few
    # tokens, thin model, 20 channels) and 0.28% on ERA5 base, so the 3x rule stays within 5%.
    assert measured.flops == 3 * analytic - patch_embed_forward_flops(cfg, IMG, CHANNELS)
    assert measured.flops == pytest.approx(3 * analytic, rel=0.05)
    assert 3 * analytic > measured.flops  # the analytic rule slightly overcounts, never undercounts


def test_analytic_training_flops_are_three_forwards():
    estimate = training_flops_per_sample(nn.Linear(2, 2), torch.zeros(1, 2), analytic_forward_flops=1e9)
    assert estimate == FlopsEstimate(flops=3e9, method="analytic", detail=estimate.detail)
    assert "3 x analytic forward" in estimate.detail
    with pytest.raises(ValueError, match="analytic_forward_flops"):
        training_flops_per_sample(nn.Linear(2, 2), torch.zeros(1, 2), analytic_forward_flops=0)


def test_meta_count_equals_a_real_pass():
    # training_flops_per_sample counts on the meta device; a real forward + backward must count the same.
    _, model = small_vit()
    x = torch.randn(BATCH, CHANNELS, *IMG)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(x).sum().backward()
    measured = training_flops_per_sample(model, x)
    assert "meta" in measured.detail
    assert measured.flops == counter.get_total_flops() / BATCH


def test_three_x_rule_holds_at_era5_base_size():
    # Shapes only, on meta: the production model (4050 tokens) costs no compute to count.
    cfg = ViTConfig()
    img = (360, 720)
    with torch.device("meta"):
        model = VisionTransformer(cfg, img, CHANNELS, CHANNELS)
    measured = training_flops_per_sample(model, torch.empty(1, CHANNELS, *img, device="meta"))
    analytic = vit_flops_per_sample(cfg, img, CHANNELS, CHANNELS)
    assert measured.flops == 3 * analytic - patch_embed_forward_flops(cfg, img, CHANNELS)
    assert measured.flops == pytest.approx(3 * analytic, rel=0.005)  # 0.28% below it


class ValueReadingNet(nn.Module):
    """Reads a tensor value (impossible on meta) and draws dropout masks (consumes the global RNG)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16)
        self.drop = nn.Dropout(0.5)
        self.out = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = 2.0 if x.abs().max().item() > 0 else 1.0
        return self.out(self.drop(self.bn(self.fc(x)))) * scale


def snapshot(model: nn.Module) -> dict[str, torch.Tensor | None]:
    state = {name: t.detach().clone() for name, t in model.state_dict().items()}
    state.update(
        {f"{n}.grad": None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
    )
    return state


def assert_same(before: dict, after: dict) -> None:
    assert before.keys() == after.keys()
    for key, value in before.items():
        if value is None:
            assert after[key] is None, key
        else:
            assert torch.equal(value, after[key]), key


@pytest.mark.parametrize("model_kind", ["vit_on_meta", "value_reading_on_cpu"])
def test_measurement_leaves_model_grads_buffers_and_rng_unchanged(model_kind):
    if model_kind == "vit_on_meta":
        _, model = small_vit(dropout=0.1)
        x = torch.randn(BATCH, CHANNELS, *IMG)
    else:
        torch.manual_seed(0)
        model = ValueReadingNet()
        x = torch.randn(BATCH, 8)
    model.train()
    # Some gradients set, some None: both must survive.
    params = list(model.parameters())
    params[0].grad = torch.full_like(params[0], 7.0)
    before = snapshot(model)
    rng = torch.get_rng_state()

    estimate = training_flops_per_sample(model, x)

    assert_same(before, snapshot(model))
    assert torch.equal(torch.get_rng_state(), rng)
    assert model.training
    if model_kind == "value_reading_on_cpu":
        # The fallback pass on the real device still counts both passes: fc and out forward (2*8*16 and
        # 2*16*4 per sample), weight gradients of both, and the input gradient of `out` only.
        assert "real pass on cpu" in estimate.detail
        assert estimate.flops == 3 * (2 * 8 * 16 + 2 * 16 * 4) - 2 * 8 * 16


def test_measurement_needs_a_batch_and_trainable_parameters():
    with pytest.raises(ValueError, match="batch"):
        training_flops_per_sample(nn.Linear(2, 2), [])
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        training_flops_per_sample(frozen, torch.zeros(3, 2))


# --- peak table ---


@pytest.mark.parametrize(
    ("name", "bf16", "tf32", "fp32"),
    [
        ("NVIDIA H100 80GB HBM3", 989.4, 494.7, 66.9),  # torch's name for the SXM part
        ("NVIDIA H100 PCIe", 756.0, 378.0, 51.2),
        ("NVIDIA H100 NVL", 835.0, 417.5, 60.0),
        ("NVIDIA H200", 989.4, 494.7, 66.9),
        ("NVIDIA H200 NVL", 835.0, 417.5, 60.0),
        ("NVIDIA GH200 480GB", 989.4, 494.7, 66.9),
        ("NVIDIA A100-SXM4-40GB", 312.0, 156.0, 19.5),
        ("NVIDIA A100-SXM4-80GB", 312.0, 156.0, 19.5),
        ("NVIDIA A100-PCIE-40GB", 312.0, 156.0, 19.5),
        ("NVIDIA A100 80GB PCIe", 312.0, 156.0, 19.5),
        ("NVIDIA A10", 125.0, 62.5, 31.2),
        ("NVIDIA A40", 149.7, 74.8, 37.4),
        ("NVIDIA L40S", 362.05, 183.0, 91.6),
        ("Tesla V100-SXM2-16GB", None, None, 15.7),
        ("Tesla V100-PCIE-32GB", None, None, 14.0),
        ("AMD Instinct MI250X", 191.5, None, 47.9),
        ("AMD Instinct MI300X", 1307.4, 653.7, 163.4),
    ],
)
def test_peak_lookup(name, bf16, tf32, fp32):
    assert peak_tflops(name, "bf16") == bf16
    assert peak_tflops(name, "tf32") == tf32
    assert peak_tflops(name, "fp32") == fp32


def test_fp16_peak_equals_bf16_except_on_volta():
    assert peak_tflops("Tesla V100-SXM2-16GB", "fp16") == 125.0
    for entry in PEAK_TFLOPS:
        if entry.bf16 is not None:
            assert entry.fp16 == entry.bf16, entry.pattern


def test_most_specific_pattern_wins():
    # Generic names appear inside specific ones: the variant must not get the generic part's peak.
    assert peak_tflops("NVIDIA H100 PCIe", "bf16") != peak_tflops("NVIDIA H100 80GB HBM3", "bf16")
    assert peak_tflops("NVIDIA H100 NVL", "bf16") != peak_tflops("NVIDIA H100 80GB HBM3", "bf16")
    assert peak_tflops("NVIDIA H200 NVL", "bf16") != peak_tflops("NVIDIA H200", "bf16")
    assert peak_tflops("Tesla V100-PCIE-16GB", "fp16") != peak_tflops("Tesla V100-SXM2-16GB", "fp16")
    # "A10" must not match the A100, nor the different AWS A10G.
    assert peak_tflops("NVIDIA A100-SXM4-40GB", "bf16") == 312.0
    assert peak_tflops("NVIDIA A10G", "bf16") is None


def test_peaks_are_dense_not_sparse():
    # Datasheets print sparse tensor-core peaks; dense is half. Guard the two classic mistakes.
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") < 1000
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "bf16") < 400
    # Every tensor-core generation here runs tf32 at half the 16-bit rate; 2% leaves room for datasheet
    # rounding (the L40S sheet prints 183 for tf32 next to 362.05 for bf16).
    for entry in PEAK_TFLOPS:
        if entry.tf32 is not None:
            assert entry.tf32 == pytest.approx(entry.bf16 / 2, rel=0.02), entry.pattern


@pytest.mark.parametrize(
    "name", ["cpu", "cpu (2 threads)", "NVIDIA GeForce RTX 4090", "AMD Instinct MI355X", ""]
)
def test_unknown_devices_have_no_peak(name):
    for precision in ("fp32", "tf32", "bf16", "fp16"):
        assert peak_tflops(name, precision) is None


@pytest.mark.parametrize("precision", ["fp8", "int4", "BF16", "float32"])
def test_unknown_precision_is_an_error(precision):
    with pytest.raises(ValueError, match="unknown precision"):
        peak_tflops("NVIDIA H100 80GB HBM3", precision)
    with pytest.raises(ValueError, match="unknown precision"):
        peak_tflops("cpu", precision)  # refused before the device lookup, not hidden behind None


# --- compute precision ---


@pytest.mark.parametrize(
    ("amp_mode", "tf32", "expected"),
    [
        ("bf16", False, "bf16"),
        ("bf16", True, "bf16"),
        ("fp16", False, "fp16"),
        ("fp16", True, "fp16"),
        ("none", True, "tf32"),
        ("none", False, "fp32"),
    ],
)
def test_compute_precision(amp_mode, tf32, expected):
    assert compute_precision(amp_mode, tf32) == expected


def test_compute_precision_refuses_unknown_amp_mode():
    with pytest.raises(ValueError, match="amp_mode"):
        compute_precision("fp8", False)


# --- utilization ---


@pytest.fixture
def perf_warnings(caplog):
    """Warnings of the dlscale.perf logger, even after setup_logging stopped 'dlscale' propagating."""
    dlscale_logger = logging.getLogger("dlscale")
    propagate = dlscale_logger.propagate
    dlscale_logger.propagate = True
    with caplog.at_level(logging.WARNING, logger="dlscale.perf"):
        yield lambda: [r for r in caplog.records if r.name == "dlscale.perf" and r.levelno == logging.WARNING]
    dlscale_logger.propagate = propagate


def test_utilization_arithmetic(perf_warnings):
    util = Utilization(flops_per_sample=4e12, device_name="NVIDIA H100 80GB HBM3", precision="bf16")
    assert util.peak == 989.4
    assert util.tflops(50.0) == pytest.approx(200.0)
    assert util.mfu(50.0) == pytest.approx(200.0 / 989.4)
    assert util.mfu(0.0) == 0.0
    assert util.describe() == "peak 989.4 TFLOP/s (bf16 dense, NVIDIA H100 80GB HBM3)"
    assert perf_warnings() == []


def test_utilization_describe_formats_whole_peaks_without_decimals():
    util = Utilization(1e9, "NVIDIA A100-SXM4-40GB", "tf32")
    assert util.describe() == "peak 156 TFLOP/s (tf32 dense, NVIDIA A100-SXM4-40GB)"


def test_unknown_device_gives_no_mfu_and_warns_once(perf_warnings):
    util = Utilization(flops_per_sample=1e9, device_name="cpu (2 threads)", precision="tf32")
    assert util.peak is None
    assert util.mfu(100.0) is None
    assert util.mfu(200.0) is None
    assert util.tflops(100.0) == pytest.approx(0.1)  # TFLOP/s are still reported
    assert util.describe() == "no MFU: peak of 'cpu (2 threads)' for tf32 is unknown"
    warnings = perf_warnings()
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "'cpu (2 threads)'" in message and "tf32" in message and "MFU will not be reported" in message


def test_precision_the_device_lacks_gives_no_mfu(perf_warnings):
    util = Utilization(1e9, "Tesla V100-SXM2-16GB", "bf16")
    assert util.mfu(10.0) is None
    assert len(perf_warnings()) == 1


def test_utilization_refuses_bad_inputs():
    with pytest.raises(ValueError, match="unknown precision"):
        Utilization(1e9, "NVIDIA H100 80GB HBM3", "fp8")
    with pytest.raises(ValueError, match="flops_per_sample"):
        Utilization(0.0, "NVIDIA H100 80GB HBM3", "bf16")
