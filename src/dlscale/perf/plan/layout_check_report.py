"""What ``dlscale plan --check_layout`` prints and writes: one rank's shards, parameter count and memory
(:mod:`dlscale.perf.plan.layout_check` builds them)."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence

from dlscale.perf.plan.layout_check import LayoutCheck, RankParameter


def representative(parameters: Sequence[RankParameter], limit: int = 12) -> list[RankParameter]:
    """The matrices of the model, one per repeated layer (``blocks.3.attn.q.weight`` is ``blocks.0``'s kind)."""
    seen, chosen = set(), []
    for parameter in parameters:
        kind = re.sub(r"\.\d+\.", ".*.", parameter.name)
        if len(parameter.serial_shape) >= 2 and kind not in seen:
            seen.add(kind)
            chosen.append(parameter)
    return chosen[:limit]


def _mib(size: int) -> str:
    return f"{size / 2**20:,.1f} MiB"


def layout_check_report(check: LayoutCheck, source: str) -> list[str]:
    """The printed result: the layout, the rank's shards, its counts and its memory."""
    coordinates = check.mesh.coordinates(check.rank)
    lines = [
        f"dlscale plan --check_layout: {source}",
        f"  layout {check.mesh.describe()} on {check.mesh.world_size} GPUs, {check.wrapper}: builds "
        f"(checked rank {check.rank}: dp {coordinates['dp']}, tp {coordinates['tp']}, cp {coordinates['cp']}; "
        f"{check.seconds:.1f} s)",
        f"  forward, loss and backward on fake tensors: output {check.pass_output}, "
        f"{len(check.parameters) - len(check.without_gradient)} of {len(check.parameters)} parameters got a "
        "gradient",
        "",
        f"  {'parameter':<34} {'serial shape':>20} {'this rank':>20}  split",
    ]
    for p in representative(check.parameters):
        if p.local_numel == 0:  # FSDP2 splits dim 0 unevenly: the last ranks may hold none of it
            split = "none here"
        else:
            split = "whole" if p.local_numel == p.serial_numel else f"1/{p.serial_numel / p.local_numel:.4g}"
        lines.append(f"  {p.name:<34} {str(p.serial_shape):>20} {str(p.local_shape):>20}  {split}")
    memory = (
        f"memory on rank {check.rank}: parameters {_mib(check.parameter_bytes)}, gradients "
        f"{_mib(check.gradient_bytes)}, optimizer state {_mib(check.optimizer_state_bytes)}"
        + (f", DDP buckets {_mib(check.ddp_bucket_bytes)}" if check.ddp_bucket_bytes else "")
        + " (activations and the rest: dlscale plan without --check_layout)"
    )
    lines += [
        "",
        f"  parameters on rank {check.rank}: {check.local_count:,} of {check.serial_count:,} "
        f"({check.local_count / check.serial_count:.1%})",
        *textwrap.wrap(memory, 108, initial_indent="  ", subsequent_indent="    "),
    ]
    if check.without_gradient:
        lines.append(
            f"  no gradient after backward (unused in forward?): {', '.join(check.without_gradient[:5])}"
        )
    return lines


def layout_check_document(check: LayoutCheck, config: str, source: str) -> dict[str, object]:
    """The check as JSON: the layout, the rank, every parameter's shapes, the counts and bytes."""
    return {
        "config": config,
        "source": source,
        "layout": {
            "dp": check.mesh.dp,
            "tp": check.mesh.tp,
            "cp": check.mesh.cp,
            "order": list(check.mesh.order),
        },
        "gpus": check.mesh.world_size,
        "rank": check.rank,
        "wrapper": check.wrapper,
        "output_shape": list(check.pass_output),
        "parameters": [
            {"name": p.name, "serial_shape": list(p.serial_shape), "local_shape": list(p.local_shape)}
            for p in check.parameters
        ],
        "parameter_count": {"rank": check.local_count, "serial": check.serial_count},
        "bytes": {
            "parameters": check.parameter_bytes,
            "gradients": check.gradient_bytes,
            "optimizer_state": check.optimizer_state_bytes,
            "ddp_buckets": check.ddp_bucket_bytes,
        },
        "without_gradient": check.without_gradient,
        "seconds": round(check.seconds, 3),
    }
