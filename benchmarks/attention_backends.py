"""How fast each of PyTorch's attention kernels runs the ViT's attention, forward and forward + backward.

    PYTHONPATH=src python3 benchmarks/attention_backends.py [--config short] [--out benchmarks/results]

The ViT of `short` attends over 4,050 tokens with 8 heads of 48 channels (embed 384): at batch 16 its
attention is about 63 % of a training step's FLOPs, and 48 is not a head size the fast kernels are built for
(they pad to 64). This times ``F.scaled_dot_product_attention`` on random (B, heads, tokens, head_dim) tensors
of the config's shape in the config's precision (bf16 by default, as the ladder's best rungs run), once per
backend that this torch offers on this device (cuDNN, FlashAttention, memory-efficient; the math backend is left
out at this size: it materializes the 4050 x 4050 scores of every head), and reports seconds and TFLOP/s with
the FLOPs dlscale counts (forward 4 B h N^2 d, a training step 3x that), means and 95 % intervals over
``--trials`` trials of ``--repeats`` calls after a warm-up. On a CPU it runs a small shape (``--tokens``) and
the backends the CPU has.

Results: ``<out>/<date>-<device>-attention-backends.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from benchmark_text import command_line, write_device_record
from torch.nn.attention import SDPBackend, sdpa_kernel

from dlscale.config import load_run_config
from dlscale.perf.bench.intervals import mean_interval
from dlscale.runtime.device import Device

REPO = Path(__file__).resolve().parents[1]
BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--config", default="short", help="config of configs/vit_era5.yaml (its attention shape)"
    )
    parser.add_argument("--batch", type=int, help="samples (default: the config's global batch)")
    parser.add_argument("--tokens", type=int, help="tokens per sample (default: the config's; 256 on a CPU)")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5, help="calls per trial")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    return parser.parse_args(argv)


def attention_shape(args: argparse.Namespace, on_gpu: bool) -> tuple[int, int, int, int]:
    """(batch, heads, tokens, head_dim) of the config's attention."""
    cfg = load_run_config(REPO / "configs" / "vit_era5.yaml", args.config, [])
    height, width = cfg.data.img_size
    tokens = (height // cfg.model.patch_size) * (width // cfg.model.patch_size)
    batch = args.batch or cfg.train.global_batch_size
    heads = cfg.model.num_heads
    return batch, heads, args.tokens or (tokens if on_gpu else 256), cfg.model.embed_dim // heads


def time_backend(
    name: str, shape: tuple[int, int, int, int], dtype: torch.dtype, device: Device, args: argparse.Namespace
) -> dict[str, Any]:
    """Seconds per call of the forward and of forward + backward under one backend (or why it cannot run)."""
    generator = torch.Generator(device=device.torch).manual_seed(0)
    q, k, v = (
        torch.randn(shape, device=device.torch, dtype=dtype, generator=generator).requires_grad_()
        for _ in range(3)
    )
    grad = torch.randn(shape, device=device.torch, dtype=dtype, generator=generator)

    def forward() -> None:
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v)

    def training() -> None:
        F.scaled_dot_product_attention(q, k, v).backward(grad)

    result: dict[str, Any] = {"backend": name}
    try:
        with sdpa_kernel(BACKENDS[name]):
            for label, call in (("forward", forward), ("forward_backward", training)):
                result[label] = trial_seconds(call, device, args)
    except RuntimeError as exc:  # "No available kernel": this backend does not take this shape/dtype/device
        result["unavailable"] = str(exc).strip().splitlines()[0][:200]
    return result


def trial_seconds(call: Any, device: Device, args: argparse.Namespace) -> list[float]:
    """Seconds per call in each of ``args.trials`` trials, after one untimed warm-up trial."""
    seconds = []
    for trial in range(args.trials + 1):
        device.synchronize()
        began = time.perf_counter()
        for _ in range(args.repeats):
            call()
        device.synchronize()
        if trial:
            seconds.append((time.perf_counter() - began) / args.repeats)
    return seconds


def summarize(entry: dict[str, Any], forward_flop: float) -> None:
    """Means, intervals and TFLOP/s beside each measured list of seconds (a training step counts 3x forward)."""
    for label, flop in (("forward", forward_flop), ("forward_backward", 3 * forward_flop)):
        if label in entry:
            found = mean_interval(entry[label])
            entry[f"{label}_ms"] = {
                "mean": 1e3 * found.mean,
                "low": 1e3 * found.low,
                "high": 1e3 * found.high,
            }
            entry[f"{label}_tflops"] = flop / found.mean / 1e12


def markdown(record: dict[str, Any]) -> str:
    batch, heads, tokens, head_dim = record["shape"]
    lines = [
        f"# Attention kernels on {record['device']}",
        "",
        f"- date: {record['date']}; torch {record['torch']}; command: `{record['command']}`",
        f"- shape of `{record['config']}`: batch {batch}, {heads} heads, {tokens} tokens, head dim {head_dim}; "
        f"{record['dtype']}; {record['trials']} trials of {record['repeats']} calls after a warm-up",
        f"- FLOPs per call: forward {record['forward_gflop']:.0f} GFLOP (4 B h N^2 d), forward + backward 3x",
        "",
        "| backend | forward ms (95% CI) | forward TFLOP/s | fwd + bwd ms (95% CI) | fwd + bwd TFLOP/s |",
        "|---|---|---:|---|---:|",
    ]
    for entry in record["backends"]:
        if "unavailable" in entry:
            lines.append(f"| {entry['backend']} | not available: {entry['unavailable']} | | | |")
            continue
        cells = []
        for label in ("forward", "forward_backward"):
            ms = entry[f"{label}_ms"]
            cells += [
                f"{ms['mean']:.2f} ({ms['low']:.2f}-{ms['high']:.2f})",
                f"{entry[f'{label}_tflops']:.0f}",
            ]
        lines.append(f"| {entry['backend']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = Device.select()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    shape = attention_shape(args, device.is_gpu)
    batch, heads, tokens, head_dim = shape
    forward_flop = 4.0 * batch * heads * tokens**2 * head_dim
    backends = []
    for name in BACKENDS:
        entry = time_backend(name, shape, dtype, device, args)
        summarize(entry, forward_flop)
        backends.append(entry)
        device.release_cached_memory()
    device_name = device.name if device.is_gpu else f"cpu-{torch.get_num_threads()}-threads"
    record = {
        "benchmark": "attention backends",
        "device": device_name,
        "date": datetime.now().strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "command": command_line(
            "benchmarks/attention_backends.py", argv if argv is not None else sys.argv[1:]
        ),
        "config": args.config,
        "shape": list(shape),
        "dtype": args.dtype,
        "trials": args.trials,
        "repeats": args.repeats,
        "forward_gflop": forward_flop / 1e9,
        "backends": backends,
    }
    write_device_record(args.out, "attention-backends", record, markdown(record))
    print(markdown(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
