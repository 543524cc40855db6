"""The best MFU the ViT can reach on this GPU, from its two kinds of work measured alone at the model's shapes.

    PYTHONPATH=src python3 benchmarks/attention_ceiling.py [--config short] [--out DIR]

A training step of the ViT is matrix products (patch embedding, q/k/v/proj, the MLP, the head) and attention
(QK^T and AV: about 64 % of the step's FLOPs at `short`'s 4,050 tokens). If each ran at the rate it reaches
alone, at the model's own shapes and precision, a step could take no less than

    T_min = F_gemm / R_gemm + F_attention / R_attention

and the model's MFU could be no higher than F_step / T_min / peak (peak: the datasheet's dense rate that
dlscale's MFU divides by). This script measures

* R_gemm: each of the model's matrix products at batch x tokens rows, forward and both backward products
  (dX = dY W, dW = dY^T X), weighted by how often a step runs it;
* R_attention: ``F.scaled_dot_product_attention`` forward + backward at the model's (B, heads, N, head_dim),
  per backend, and again with the head dimension padded with zeros to the next multiple of 64 (the padded
  kernel computes more, but the model's FLOPs are what count: the pad and the slice are timed with it);

and writes the ceiling for each attention option beside the rates: ``<out>/<date>-<device>-attention-ceiling``
``.json`` and ``.md``. Norms, activations, softmax, the optimizer and the loss are left out of both the FLOPs
(as dlscale's MFU leaves them out) and the ceiling's time, so the ceiling is an upper bound: no schedule of
these kernels beats it. On a CPU it runs a small shape for the rehearsal.
"""

from __future__ import annotations

import argparse
import math
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from attention_backends import BACKENDS, trial_seconds
from benchmark_text import command_line, write_device_record
from torch.nn.attention import sdpa_kernel

from dlscale.config import load_run_config
from dlscale.models.vit import token_grid, vit_flops_per_sample
from dlscale.perf.bench.intervals import mean_interval
from dlscale.perf.flops import peak_tflops
from dlscale.runtime.device import Device

REPO = Path(__file__).resolve().parents[1]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="short", help="config of configs/vit_era5.yaml (its shapes)")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5, help="calls per trial")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    parser.add_argument("--rehearse", action="store_true", help="a small shape, on whatever device there is")
    return parser.parse_args(argv)


def model_shapes(config: str, rehearse: bool) -> dict[str, Any]:
    """Batch, tokens, widths and the step's FLOPs split into matrix products and attention."""
    cfg = load_run_config(REPO / "configs" / "vit_era5.yaml", config, [])
    rows, cols = token_grid(cfg.data.img_size, cfg.model.patch_size)
    tokens, batch = rows * cols, cfg.train.global_batch_size
    if rehearse:
        tokens, batch = 256, 2
    m = cfg.model
    width, patch = m.embed_dim, m.patch_size
    pixels_in = cfg.data.n_in_channels * patch * patch
    pixels_out = cfg.data.n_out_channels * patch * patch
    # (in features, out features, how many per step) of every matrix product, on batch x tokens rows
    linears = [
        (pixels_in, width, 1),  # patch embedding (a strided convolution: one product)
        (width, width, 4 * m.depth),  # q, k, v, proj
        (width, m.mlp_hidden_dim, m.depth),  # fc1
        (m.mlp_hidden_dim, width, m.depth),  # fc2
        (width, pixels_out, 1),  # head
    ]
    attention_forward = m.depth * 4.0 * batch * tokens**2 * width  # QK^T and AV, as vit_flops_per_sample
    step_forward = float(
        vit_flops_per_sample(m, cfg.data.img_size, cfg.data.n_in_channels, cfg.data.n_out_channels)
    )
    step_forward *= batch
    if rehearse:  # the small shape's own FLOPs (the config's image is not the rehearsal's)
        step_forward = (
            sum(2.0 * batch * tokens * k * n * count for k, n, count in linears) + attention_forward
        )
    return {
        "batch": batch,
        "tokens": tokens,
        "heads": m.num_heads,
        "head_dim": width // m.num_heads,
        "linears": linears,
        "step_flop": 3 * step_forward,
        "attention_flop": 3 * attention_forward,
    }


def gemm_rate(shapes: dict[str, Any], dtype: torch.dtype, device: Device, args: argparse.Namespace) -> dict:
    """Each product forward and backward at rows = batch x tokens; the step-weighted rate of all of them."""
    rows = shapes["batch"] * shapes["tokens"]
    entries, flop_total, seconds_total = [], 0.0, 0.0
    for k, n, count in shapes["linears"]:
        x = torch.randn(rows, k, device=device.torch, dtype=dtype)
        w = torch.randn(n, k, device=device.torch, dtype=dtype)
        dy = torch.randn(rows, n, device=device.torch, dtype=dtype)

        def forward_backward(x=x, w=w, dy=dy) -> None:
            x @ w.t()  # Y = X W^T
            dy @ w  # dX
            dy.t() @ x  # dW

        seconds = mean_interval(trial_seconds(forward_backward, device, args))
        flop = 3 * 2.0 * rows * k * n
        entries.append(
            {
                "in": k,
                "out": n,
                "per_step": count,
                "ms": 1e3 * seconds.mean,
                "tflops": flop / seconds.mean / 1e12,
            }
        )
        flop_total += count * flop
        seconds_total += count * seconds.mean
        del x, w, dy
    return {"rows": rows, "products": entries, "tflops": flop_total / seconds_total / 1e12}


def attention_rate(
    shapes: dict[str, Any], backend: str, pad_to: int | None, dtype: torch.dtype, device: Device, args
) -> dict:
    """Forward + backward TFLOP/s of the model's attention FLOPs under one backend (head dim padded or not)."""
    batch, heads, tokens, head_dim = shapes["batch"], shapes["heads"], shapes["tokens"], shapes["head_dim"]
    generator = torch.Generator(device=device.torch).manual_seed(0)
    q, k, v = (
        torch.randn(
            batch, heads, tokens, head_dim, device=device.torch, dtype=dtype, generator=generator
        ).requires_grad_()
        for _ in range(3)
    )
    grad = torch.randn(batch, heads, tokens, head_dim, device=device.torch, dtype=dtype, generator=generator)
    padding = (0, pad_to - head_dim) if pad_to else None
    scale = 1.0 / math.sqrt(head_dim)  # the model's scale, not the padded width's

    def step() -> None:
        if padding is None:
            out = F.scaled_dot_product_attention(q, k, v)
        else:
            out = F.scaled_dot_product_attention(
                F.pad(q, padding), F.pad(k, padding), F.pad(v, padding), scale=scale
            )[..., :head_dim]
        out.backward(grad)

    entry: dict[str, Any] = {"backend": backend, "head_dim": pad_to or head_dim}
    try:
        with sdpa_kernel(BACKENDS[backend]):
            seconds = mean_interval(trial_seconds(step, device, args))
    except RuntimeError as exc:  # this backend does not take this shape, dtype or device
        entry["unavailable"] = str(exc).strip().splitlines()[0][:200]
        return entry
    flop = 3 * 4.0 * batch * heads * tokens**2 * head_dim  # the model's (unpadded) attention, one layer
    entry.update(
        ms={"mean": 1e3 * seconds.mean, "low": 1e3 * seconds.low, "high": 1e3 * seconds.high},
        tflops=flop / seconds.mean / 1e12,
    )
    return entry


def ceilings(
    shapes: dict[str, Any], gemm_tflops: float, attention: list[dict], peak: float | None
) -> list[dict]:
    """The best MFU for each measured attention option: F_step / (F_gemm / R_gemm + F_attn / R_attn) / peak."""
    f_step, f_attention = shapes["step_flop"], shapes["attention_flop"]
    out = []
    for entry in attention:
        if "tflops" not in entry:
            continue
        seconds = (f_step - f_attention) / (gemm_tflops * 1e12) + f_attention / (entry["tflops"] * 1e12)
        rate = f_step / seconds / 1e12
        out.append(
            {
                "backend": entry["backend"],
                "head_dim": entry["head_dim"],
                "step_ms": 1e3 * seconds,
                "tflops": rate,
                "mfu": rate / peak if peak else None,
            }
        )
    return sorted(out, key=lambda row: -row["tflops"])


def markdown(record: dict[str, Any]) -> str:
    shapes = record["shapes"]
    lines = [
        f"# The ViT's MFU ceiling on {record['device']}",
        "",
        f"- date: {record['date']}; torch {record['torch']}; command: `{record['command']}`",
        f"- `{record['config']}`: batch {shapes['batch']}, {shapes['tokens']} tokens, {shapes['heads']} heads of "
        f"{shapes['head_dim']}; {record['dtype']}; attention is "
        f"{100 * shapes['attention_flop'] / shapes['step_flop']:.1f}% of a step's {shapes['step_flop'] / 1e12:.2f} "
        "TFLOP",
        f"- matrix products at the model's shapes, forward + backward, step-weighted: "
        f"**{record['gemm']['tflops']:.0f} TFLOP/s**; datasheet peak {record['peak_tflops']} TFLOP/s",
        "",
        "| attention | head dim | fwd + bwd ms (95% CI) | TFLOP/s (model's FLOPs) |",
        "|---|---:|---|---:|",
    ]
    for entry in record["attention"]:
        if "unavailable" in entry:
            lines.append(
                f"| {entry['backend']} | {entry['head_dim']} | not available: {entry['unavailable']} | |"
            )
            continue
        ms = entry["ms"]
        lines.append(
            f"| {entry['backend']} | {entry['head_dim']} | {ms['mean']:.2f} ({ms['low']:.2f}-{ms['high']:.2f}) "
            f"| {entry['tflops']:.0f} |"
        )
    lines += [
        "",
        "| attention | head dim | best step ms | TFLOP/s | MFU ceiling |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in record["ceilings"]:
        mfu = "-" if row["mfu"] is None else f"{100 * row['mfu']:.1f}%"
        lines.append(
            f"| {row['backend']} | {row['head_dim']} | {row['step_ms']:.1f} | {row['tflops']:.0f} | {mfu} |"
        )
    lines += ["", "| product (in x out) | per step | fwd + bwd ms | TFLOP/s |", "|---|---:|---:|---:|"]
    for product in record["gemm"]["products"]:
        lines.append(
            f"| {product['in']} x {product['out']} | {product['per_step']} | {product['ms']:.3f} | "
            f"{product['tflops']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = Device.select()
    dtype = DTYPES[args.dtype]
    shapes = model_shapes(args.config, args.rehearse or not device.is_gpu)
    gemm = gemm_rate(shapes, dtype, device, args)
    device.release_cached_memory()
    attention = []
    padded = -(-shapes["head_dim"] // 64) * 64
    for backend in BACKENDS:
        for pad_to in (None, padded) if padded != shapes["head_dim"] else (None,):
            attention.append(attention_rate(shapes, backend, pad_to, dtype, device, args))
            device.release_cached_memory()
    device_name = device.name if device.is_gpu else f"cpu-{torch.get_num_threads()}-threads"
    peak = peak_tflops(device.name, args.dtype) if device.is_gpu else None
    record = {
        "benchmark": "attention ceiling",
        "device": device_name,
        "date": datetime.now().strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "command": command_line(
            "benchmarks/attention_ceiling.py", argv if argv is not None else sys.argv[1:]
        ),
        "config": args.config,
        "dtype": args.dtype,
        "peak_tflops": peak,
        "shapes": {key: value for key, value in shapes.items() if key != "linears"},
        "gemm": gemm,
        "attention": attention,
        "ceilings": ceilings(shapes, gemm["tflops"], attention, peak),
    }
    write_device_record(args.out, "attention-ceiling", record, markdown(record))
    print(markdown(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
