"""FLOPs per training sample, dense peak TFLOP/s per GPU, and model FLOPs utilization (MFU).

MFU = achieved model FLOP/s on one GPU / that GPU's dense peak at the precision the matmuls run in.
"Model" FLOPs are those of the mathematical model (forward + backward), not of the implementation:
recomputation under activation checkpointing is not counted, so MFU does not reward it (PaLM's
convention, also torchtitan's and nanoGPT's).

The peak table holds only numbers from vendor datasheets and returns None for anything it does not
know: a silent fallback to some other GPU's peak is how other tools came to report 563 % MFU.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

__all__ = [
    "PEAK_TFLOPS",
    "PRECISIONS",
    "FlopsEstimate",
    "GpuPeak",
    "Utilization",
    "compute_precision",
    "find_gpu",
    "peak_tflops",
    "training_flops_per_sample",
]

log = logging.getLogger("dlscale.perf")

# The precisions the matrix units run in during training: fp32 (no tensor cores), tf32 (fp32 matmuls on
# tensor cores), and the two 16-bit autocast types. fp8 is deliberately absent: mixed fp8/bf16 runs have
# no single peak, so an MFU against either would mislead.
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


@dataclass(frozen=True)
class GpuPeak:
    """Dense peak TFLOP/s of one GPU (one torch device) per precision; None where it has no such unit."""

    # regular expression searched, case-insensitively, in torch.cuda.get_device_name()
    pattern: str
    fp32: float | None
    tf32: float | None
    bf16: float | None
    fp16: float | None

    def get(self, precision: str) -> float | None:
        """The peak at `precision` (one of PRECISIONS)."""
        return getattr(self, precision)


# Dense (without 2:4 structured sparsity) peaks. Datasheets print the sparse figure for tensor-core
# precisions, marked with an asterisk; the dense one is half of it. fp32 is the non-tensor-core rate.
# Order matters: the first pattern that matches wins, so specific variants come before the generic name
# (GH200 before H200, which it contains; H100 PCIe/NVL before plain H100, which is the SXM part).
PEAK_TFLOPS: tuple[GpuPeak, ...] = (
    # NVIDIA GH200 Grace Hopper Superchip datasheet: the Hopper GPU has H100 SXM's compute.
    GpuPeak(r"GH200", fp32=66.9, tf32=494.7, bf16=989.4, fp16=989.4),
    # NVIDIA H200 datasheet (2024), NVL column: 60 FP32; 835 TF32*, 1,671 BF16/FP16* (sparse).
    GpuPeak(r"H200.*NVL", fp32=60.0, tf32=417.5, bf16=835.0, fp16=835.0),
    # NVIDIA H200 datasheet, SXM column: same compute as H100 SXM (67 FP32; 989 TF32*, 1,979 BF16*).
    GpuPeak(r"H200", fp32=66.9, tf32=494.7, bf16=989.4, fp16=989.4),
    # NVIDIA H100 datasheet, PCIe column: 51 FP32; 756 TF32*, 1,513 BF16/FP16* (sparse).
    GpuPeak(r"H100.*PCIe", fp32=51.2, tf32=378.0, bf16=756.0, fp16=756.0),
    # NVIDIA H100 datasheet, NVL column, per GPU of the pair: 60 FP32; 835 TF32*, 1,671 BF16/FP16*.
    GpuPeak(r"H100.*NVL", fp32=60.0, tf32=417.5, bf16=835.0, fp16=835.0),
    # NVIDIA H100 datasheet, SXM column: 67 FP32; 989 TF32*, 1,979 BF16/FP16* (sparse). torch names the
    # SXM part only by its memory ("NVIDIA H100 80GB HBM3"), hence the generic pattern.
    GpuPeak(r"H100", fp32=66.9, tf32=494.7, bf16=989.4, fp16=989.4),
    # NVIDIA A100 datasheet: 19.5 FP32; 156 TF32 (312*), 312 BF16/FP16 (624*); the same for SXM4 and
    # PCIe, 40 and 80 GB (they differ in memory and power, not in peak). One entry covers all four.
    GpuPeak(r"A100", fp32=19.5, tf32=156.0, bf16=312.0, fp16=312.0),
    # NVIDIA A40 datasheet: 37.4 FP32; 74.8 TF32 (149.6*), 149.7 BF16/FP16 (299.4*).
    GpuPeak(r"\bA40\b", fp32=37.4, tf32=74.8, bf16=149.7, fp16=149.7),
    # NVIDIA A10 datasheet: 31.2 FP32; 62.5 TF32 (125*), 125 BF16/FP16 (250*). Word boundaries keep it
    # from matching "A100" or the different AWS "A10G".
    GpuPeak(r"\bA10\b", fp32=31.2, tf32=62.5, bf16=125.0, fp16=125.0),
    # NVIDIA L40S datasheet: 91.6 FP32; 183 TF32 (366*), 362.05 BF16/FP16 (733*).
    GpuPeak(r"\bL40S\b", fp32=91.6, tf32=183.0, bf16=362.05, fp16=362.05),
    # NVIDIA V100 datasheet: Volta has fp16 tensor cores only (no tf32, no bf16). V100S PCIe: 16.4 FP32,
    # 130 tensor; V100 PCIe: 14 FP32, 112 tensor; V100 SXM2: 15.7 FP32, 125 tensor.
    GpuPeak(r"V100S", fp32=16.4, tf32=None, bf16=None, fp16=130.0),
    GpuPeak(r"V100.*PCIe", fp32=14.0, tf32=None, bf16=None, fp16=112.0),
    GpuPeak(r"V100", fp32=15.7, tf32=None, bf16=None, fp16=125.0),
    # AMD Instinct MI300X datasheet: 163.4 FP32 matrix; 653.7 TF32, 1,307.4 BF16/FP16 (dense).
    GpuPeak(r"MI300X", fp32=163.4, tf32=653.7, bf16=1307.4, fp16=1307.4),
    # AMD Instinct MI300A datasheet: 122.6 FP32 matrix; 490.3 TF32, 980.6 BF16/FP16 (dense).
    GpuPeak(r"MI300A", fp32=122.6, tf32=490.3, bf16=980.6, fp16=980.6),
    # AMD Instinct MI250X datasheet, halved: the OAM module holds two GCDs and torch sees each GCD as one
    # device, so per device 47.9 FP32 (95.7 per module) and 191.5 BF16/FP16 (383). CDNA2 has no TF32.
    GpuPeak(r"MI250X", fp32=47.9, tf32=None, bf16=191.5, fp16=191.5),
)


def _validate_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; expected one of {', '.join(PRECISIONS)}")


def find_gpu(device_name: str) -> GpuPeak | None:
    """The first PEAK_TFLOPS entry whose pattern occurs in `device_name`, or None if none does."""
    for entry in PEAK_TFLOPS:
        if re.search(entry.pattern, device_name, flags=re.IGNORECASE):
            return entry
    return None


def peak_tflops(device_name: str, precision: str) -> float | None:
    """Dense peak TFLOP/s of one device at `precision`, from its `torch.cuda.get_device_name()` name.

    Returns None for a device the table does not know (including "cpu") and for a precision the device
    has no matrix unit for (bf16 or tf32 on a V100). Raises ValueError for a precision outside PRECISIONS.
    """
    _validate_precision(precision)
    entry = find_gpu(device_name)
    return None if entry is None else entry.get(precision)


def compute_precision(amp_mode: str, tf32: bool) -> str:
    """The precision the matmuls of a run execute in: the autocast type, else tf32 or fp32.

    `amp_mode` is the run's `none`, `fp16` or `bf16`; `tf32` whether fp32 matmuls may use tf32 tensor cores
    (it only matters without autocast, since autocast moves the matmuls to 16 bits).
    """
    if amp_mode in ("bf16", "fp16"):
        return amp_mode
    if amp_mode != "none":
        raise ValueError(f"unknown amp_mode {amp_mode!r}; expected none, fp16 or bf16")
    return "tf32" if tf32 else "fp32"


@dataclass(frozen=True)
class FlopsEstimate:
    """FLOPs of one training sample (forward + backward) and how they were obtained."""

    flops: float
    method: Literal["analytic", "measured"]
    detail: str


def training_flops_per_sample(
    model: nn.Module,
    sample_inputs: torch.Tensor | Sequence[Any],
    analytic_forward_flops: float | None = None,
) -> FlopsEstimate:
    """FLOPs of one training sample: 3x an analytic forward count, or counted by FlopCounterMode.

    With `analytic_forward_flops` (forward FLOPs of ONE sample) the backward is taken as twice the forward
    (a gradient for the activations and one for the weights, each a matmul as large as the forward's),
    and `model` and `sample_inputs` are not used.

    Otherwise the model runs forward and backward on `sample_inputs` (a batch: one tensor, or a sequence of
    positional arguments whose first tensor has the batch as dimension 0) under FlopCounterMode, and the
    count is divided by the batch size. It counts matmuls, convolutions and attention, both passes, with
    the gradients autograd really computes (none for frozen parameters or for the input), but not the
    loss. Pass the bare model, before DDP/FSDP wrapping.

    The caller's model is left untouched: the count runs with stand-ins for its parameters and buffers,
    preferably on the meta device (shapes only: no compute, no memory), otherwise on the inputs' device
    (for models that read tensor values, e.g. `.item()`). Either way no `.grad` or buffer of `model`
    changes, and the global torch RNG state is restored, so a seeded run stays reproducible.
    """
    if analytic_forward_flops is not None:
        if not analytic_forward_flops > 0:
            raise ValueError(f"analytic_forward_flops must be > 0, got {analytic_forward_flops}")
        return FlopsEstimate(
            flops=3.0 * analytic_forward_flops,
            method="analytic",
            detail=f"3 x analytic forward {analytic_forward_flops:.4g} FLOPs (backward ~ 2 x forward)",
        )

    args = (sample_inputs,) if isinstance(sample_inputs, torch.Tensor) else tuple(sample_inputs)
    tensors = [arg for arg in args if isinstance(arg, torch.Tensor)]
    if not tensors or tensors[0].ndim == 0 or tensors[0].shape[0] < 1:
        raise ValueError("sample_inputs must hold a tensor whose dimension 0 is a non-empty batch")
    batch = tensors[0].shape[0]
    device = tensors[0].device

    try:
        forward, backward = _count_on_meta(model, args)
        where = "shapes only, on the meta device"
    except (RuntimeError, NotImplementedError) as err:
        # Models that read values (`.item()`, data-dependent branches) or keep tensors outside their
        # parameters and buffers cannot run on meta; count a real pass instead.
        log.debug("FLOP count on the meta device failed (%s); counting a real pass on %s", err, device)
        forward, backward = _count_on_device(model, args, device)
        where = f"one real pass on {device}"
    return FlopsEstimate(
        flops=(forward + backward) / batch,
        method="measured",
        detail=(
            f"FlopCounterMode: forward {forward / batch:.4g} + backward {backward / batch:.4g} FLOPs "
            f"per sample (batch of {batch}, {where})"
        ),
    )


def _count_on_meta(model: nn.Module, args: tuple[Any, ...]) -> tuple[int, int]:
    """Forward and backward FLOPs of `model(*args)` computed with meta stand-ins for every tensor."""

    def to_meta(tensor: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(tensor, device="meta").requires_grad_(tensor.requires_grad)

    state = {name: to_meta(p) for name, p in model.named_parameters()}
    state.update({name: torch.empty_like(b, device="meta") for name, b in model.named_buffers()})
    meta_args = tuple(to_meta(a).requires_grad_(False) if isinstance(a, torch.Tensor) else a for a in args)
    # Meta tensors draw no random numbers, but the forked RNG costs nothing and guards against modules that
    # draw on the host (e.g. a mask made with torch.rand on the CPU).
    with torch.random.fork_rng(devices=[]):
        return _forward_backward_flops(model, state, meta_args)


def _count_on_device(model: nn.Module, args: tuple[Any, ...], device: torch.device) -> tuple[int, int]:
    """Forward and backward FLOPs of a real pass, leaving the model's tensors and the RNG untouched."""
    # Parameters are aliased, not copied (the forward only reads them), but as new leaves: their gradients
    # land on the aliases, not in the model's .grad. Buffers are cloned because a forward may update them
    # in place (BatchNorm's running statistics).
    state = {name: p.detach().requires_grad_(p.requires_grad) for name, p in model.named_parameters()}
    state.update({name: b.detach().clone() for name, b in model.named_buffers()})
    real_args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
    # Dropout and stochastic depth draw from the device's generator; fork it so training draws the same
    # numbers as it would without this measurement.
    rng = torch.random.fork_rng(devices=_cuda_index(device))
    # FlopCounterMode has no formula for the CPU's fused attention kernel and would count attention as
    # zero; the math backend runs it as two counted bmm calls. The CUDA kernels (flash, memory-efficient,
    # cuDNN) have formulas, and forcing math there would materialise the N x N scores.
    backend = sdpa_kernel(SDPBackend.MATH) if device.type == "cpu" else contextlib.nullcontext()
    with rng, backend:
        return _forward_backward_flops(model, state, real_args)


def _cuda_index(device: torch.device) -> list[int]:
    """The CUDA generator to fork for `device`: its index, the current one, or none off CUDA."""
    if device.type != "cuda":
        return []
    return [device.index if device.index is not None else torch.cuda.current_device()]


def _forward_backward_flops(
    model: nn.Module, state: Mapping[str, torch.Tensor], args: tuple[Any, ...]
) -> tuple[int, int]:
    with torch.enable_grad(), FlopCounterMode(display=False) as counter:
        output = functional_call(model, dict(state), args)
        forward = counter.get_total_flops()
        grads_needed = [t for t in _tensors_in(output) if t.requires_grad]
        if not grads_needed:
            raise ValueError("the model's output needs no gradient: it has no trainable parameters to count")
        # A sum as the loss: its backward is the model's backward; the loss itself is not model FLOPs.
        torch.autograd.backward([t.sum() for t in grads_needed])
        return forward, counter.get_total_flops() - forward


def _tensors_in(output: Any) -> list[torch.Tensor]:
    """Every tensor in a model output: a tensor, or tuples, lists and dicts of them."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, Mapping):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        return [t for item in output for t in _tensors_in(item)]
    return []


class Utilization:
    """Achieved TFLOP/s and MFU of one GPU, for a fixed model, device and precision.

    Every method takes `samples_per_second`: the samples per second processed by ONE GPU. Under data
    parallelism that is the global throughput divided by the number of GPUs; when several GPUs share one
    model replica (tensor, context or spatial parallelism), divide the replica's throughput by the GPUs
    in it (the non-data-parallel size), since `flops_per_sample` counts the whole model.

    A device whose peak is unknown gets one warning, at construction (unless `warn_if_unknown` is false: a
    CPU run knows it has no MFU); its `mfu()` is then None and only
    `tflops()` is meaningful.
    """

    def __init__(
        self, flops_per_sample: float, device_name: str, precision: str, warn_if_unknown: bool = True
    ):
        if not flops_per_sample > 0:
            raise ValueError(f"flops_per_sample must be > 0, got {flops_per_sample}")
        self.flops_per_sample = float(flops_per_sample)
        self.device_name = device_name
        self.precision = precision
        self.peak = peak_tflops(device_name, precision)  # also validates the precision
        if self.peak is None and warn_if_unknown:
            log.warning(
                "%s; MFU will not be reported (TFLOP/s still are). If it is a GPU, add its dense peak "
                "from the vendor datasheet to dlscale.perf.flops.PEAK_TFLOPS.",
                self._unknown_peak(),
            )

    def _unknown_peak(self) -> str:
        return f"peak of {self.device_name!r} for {self.precision} is unknown"

    def over_steps(self, first: int, stop: int) -> Utilization:
        """The rating of global steps ``first`` .. ``stop - 1`` (this one: a sample's FLOPs do not change with
        the step; a multi-step run's do, see :class:`dlscale.run.rollout_training.RolloutUtilization`)."""
        return self

    def tflops(self, samples_per_second: float) -> float:
        """Achieved model TFLOP/s of one GPU: flops_per_sample * samples_per_second / 1e12."""
        return self.flops_per_sample * samples_per_second / 1e12

    def mfu(self, samples_per_second: float) -> float | None:
        """Model FLOPs utilization of one GPU as a fraction (0..1) of its dense peak; None if unknown."""
        if self.peak is None:
            return None
        return self.tflops(samples_per_second) / self.peak

    def describe(self) -> str:
        """One line for the log: the peak MFU is measured against, or why there is no MFU."""
        if self.peak is None:
            return f"no MFU: {self._unknown_peak()}"
        return f"peak {self.peak:g} TFLOP/s ({self.precision} dense, {self.device_name})"
