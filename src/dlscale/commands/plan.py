"""``dlscale plan``: which layouts of N GPUs fit a config's model in memory (for the ViT: what each sends).

    dlscale plan --yaml_config configs/vit_era5.yaml --config mp --gpus 4 --gpu_memory_gb 80 \
        [--set key=value] [--json plan.json]
    dlscale plan --config mp --gpus 64 --set parallel.tensor_parallel=4 --set parallel.context_parallel=2 \
        --check_layout [--rank 5]      # build one rank of that layout on a fake process group

The attention ViT has an analytic cost model, its declared parallel plan: every layout with dp * tp * cp ==
GPUs is estimated (the formulas are in :mod:`dlscale.perf.plan.layout_cost`, how they compare with measurements
in :mod:`dlscale.perf.plan.layouts` and benchmarks/plan_vs_measured.py): those that fit come first, least traffic
per step first, then those that do not fit, then those the model cannot be split into, each with its reason.

Every other workload, and the ViT with another mixer (``model.mixer: afno``), is planned from a trace of its
training step on fake tensors (:mod:`dlscale.perf.plan.traced_plan`): DDP and FSDP2 over the N GPUs, at the
config's batch size, precision and optimizer; the ViT's sample shapes come from its config, any other
workload's from one sample of its training data. Nothing runs on a GPU, and nothing of the
model's size is allocated.
"""

from __future__ import annotations

import argparse
import math
import textwrap
from typing import TYPE_CHECKING, Any

from dlscale.config import load_run_config
from dlscale.config.run_config import RunConfig
from dlscale.errors import InvalidValue
from dlscale.models.vit_config import ViTConfig
from dlscale.runtime.atomic_files import write_text_atomically
from dlscale.runtime.strict_json import to_json
from dlscale.workloads.protocol import Workload

if TYPE_CHECKING:
    from dlscale.perf.plan.layout_cost import ModelShape, TrainingSettings
    from dlscale.perf.plan.layouts import LayoutEstimate, Plan

COLUMNS = (
    f"  {'rank':>4}  {'dp':>2} {'tp':>2} {'cp':>2}  {'batch':>5}  {'params/GPU':>11}  {'states':>6}  "
    f"{'activ.':>6}  {'data':>5}  {'copies':>6}  {'CUDA':>4}  {'total':>6}  {'use':>4}  | {'tp comm':>7}  {'cp comm':>7}  "
    f"{'dp comm':>7}  {'comm':>6}"
)
LEGEND = (
    "GB per GPU (GB = 2^30 bytes): states = parameters + gradients + optimizer state (+ FSDP's unsharded "
    "working set or DDP's separate buckets); activ. = tensors saved for backward; data = the input and target "
    "batches autograd does not hold, with those the loader copied ahead; copies = autocast's "
    "half-precision weights; CUDA = allowance for the CUDA context and libraries; use = total / GPU memory. "
    "comm = GB each GPU sends per training step."
)
REPORT_WIDTH = 110


def run_plan_command(args: argparse.Namespace) -> int:
    """Estimate every layout, print the ranked table, optionally write the JSON; 0 on success.

    The options and the config are checked before the cost models (which import torch) are.
    """
    if args.gpus < 1:
        raise InvalidValue("--gpus", f"must be a whole number of GPUs >= 1, got {args.gpus}")
    if not (args.gpu_memory_gb > 0 and math.isfinite(args.gpu_memory_gb)):
        raise InvalidValue("--gpu_memory_gb", f"must be a number of GB > 0, got {args.gpu_memory_gb}")
    if args.check_layout and not 0 <= args.rank < args.gpus:
        raise InvalidValue(
            "--rank", f"must be one of the --gpus {args.gpus} ranks, 0..{args.gpus - 1}, got {args.rank}"
        )
    cfg = load_run_config(args.yaml_config, args.config, args.set, {})
    if args.check_layout:
        return run_layout_check(args, cfg)
    # The analytic cost model is the deterministic attention ViT's; other mixers, and a model with noise inputs
    # (CRPS training, whose members multiply the batch), are planned from a trace of their step.
    if not isinstance(cfg.model, ViTConfig) or cfg.model.mixer != "attention" or cfg.model.noise_channels > 0:
        return run_traced_plan(args, cfg)
    from dlscale.perf.plan.layout_cost import TrainingSettings
    from dlscale.perf.plan.layouts import model_shape_of, plan

    shape = model_shape_of(cfg)
    settings = TrainingSettings.from_run_config(cfg)
    result = plan(
        shape,
        settings,
        args.gpus,
        args.gpu_memory_gb,
        requested_tp=cfg.parallel.tensor_parallel,
        requested_cp=cfg.parallel.context_parallel,
    )
    for line in plan_report(result, shape, settings, f"config {cfg.name!r} ({cfg.source})"):
        print(line)
    if args.json is not None:
        document = plan_document(result, shape, settings, cfg.name, cfg.source)
        write_text_atomically(args.json, to_json(document))
        print(f"JSON {args.json}")
    return 0


def run_traced_plan(args: argparse.Namespace, cfg: RunConfig) -> int:
    """The data-parallel plan of a workload without an analytic cost model, from a trace of its step."""
    from dlscale.perf.plan.traced_report import TracedPlanContext, traced_plan_document, traced_plan_report
    from dlscale.run.config_plan import traced_plan_of

    planned = traced_plan_of(cfg, args.gpus, args.gpu_memory_gb)
    result, workload = planned.plan, planned.workload
    if cfg.train.loss == "crps":
        result.notes.append(
            f"train.loss crps: each sample runs as {cfg.train.ensemble_members} members in one batch, so the "
            f"trace is of {cfg.train.ensemble_members} x the local batch (the activations grow with the members; "
            "the parameters, gradients and optimizer state do not)"
        )
    if cfg.train.max_rollout_steps > 1:
        result.notes.append(
            f"train.rollout_steps {cfg.train.max_rollout_steps}: the trace is of one model step; a "
            f"{cfg.train.max_rollout_steps}-step rollout saves about {cfg.train.max_rollout_steps} times its "
            "activations (with rollout_checkpointing: each step's input and loss, plus one step's activations)"
        )
    context = TracedPlanContext(
        config=cfg.name,
        source=str(cfg.source),
        workload=cfg.workload,
        sample=planned.sample,
        global_batch=planned.global_batch,
        amp_mode=cfg.train.amp_mode,
        optimizer=planned.optimizer,
        model_parallel=model_parallel_line(workload, cfg),
    )
    for line in traced_plan_report(result, context):
        print(line)
    if args.json is not None:
        write_text_atomically(args.json, to_json(traced_plan_document(result, context)))
        print(f"JSON {args.json}")
    return 0


def run_layout_check(args: argparse.Namespace, cfg: RunConfig) -> int:
    """Build one rank of the config's layout on --gpus fake ranks; print it, and optionally its JSON."""
    from dlscale.perf.plan.layout_check_report import layout_check_document, layout_check_report
    from dlscale.run.config_plan import layout_check_of

    check = layout_check_of(cfg, args.gpus, args.rank)
    for line in layout_check_report(check, f"config {cfg.name!r} ({cfg.source})"):
        print(line)
    if args.json is not None:
        write_text_atomically(args.json, to_json(layout_check_document(check, cfg.name, str(cfg.source))))
        print(f"JSON {args.json}")
    return 0


def model_parallel_line(workload: Workload, cfg: RunConfig) -> str:
    """Why the traced plan lists no tensor/context-parallel layouts."""
    mixer = getattr(cfg.model, "mixer", "attention")
    if mixer != "attention":
        return f"tp/cp layouts are not listed: model.mixer {mixer!r} has no tensor/context-parallel form."
    noise = getattr(cfg.model, "noise_channels", 0)
    if noise:
        return (
            f"tp/cp layouts are not listed: a model with noise inputs (model.noise_channels {noise}) trains with "
            "data parallelism only (the ranks of one sample would draw different noise)."
        )
    declared = getattr(type(workload), "parallelize", Workload.parallelize) is not Workload.parallelize
    start = f"tp/cp layouts are not listed: workload {cfg.workload!r} declares"
    line = (
        f"{start} a tensor/context-parallel form, but dlscale plan has a cost model of one only for the ViT."
        if declared
        else f"{start} no tensor/context-parallel plan."
    )
    tp, cp = cfg.parallel.tensor_parallel, cfg.parallel.context_parallel
    if tp * cp > 1 and not declared:
        line += f" The config's tp={tp} cp={cp} cannot train: set both to 1."
    return line


def _gb(value: int) -> str:
    from dlscale.perf.plan.layout_cost import GIB

    return f"{value / GIB:.2f}"


def caveat() -> str:
    """What the estimate leaves out, with how far below the tutorial's measurements it comes out."""
    from dlscale.perf.plan.layouts import tutorial_comparisons

    runs = ", ".join(
        f"{c.estimated_gb:.2f} GB where the GPU showed {c.measured_gb:g} GB at tp={c.tp}"
        for c in tutorial_comparisons()
    )
    return (
        "Not estimated: the caching allocator's reserve and fragmentation, and the temporaries of the "
        "backward pass and of the collectives. For the NERSC tutorial's mp runs (local batch 16) this "
        f"estimate gives {runs} (see dlscale.perf.plan.layouts): treat a layout whose use is near 100% as not "
        "fitting."
    )


def table_row(position: int, row: LayoutEstimate) -> str:
    """One layout as a line of the table; a layout that cannot run has no numbers."""
    layout = row.layout
    start = f"  {position:>4}  {layout.dp:>2} {layout.tp:>2} {layout.cp:>2}"
    if row.memory is None or row.comm is None or row.parameters is None:
        return start
    memory, comm = row.memory, row.comm
    return (
        f"{start}  {row.local_batch:>5}  {row.parameters.local:>11,}  {_gb(memory.model_states):>6}  "
        f"{_gb(memory.activations):>6}  {_gb(memory.batch):>5}  {_gb(memory.autocast_weight_copies):>6}  "
        f"{_gb(memory.cuda_allowance):>4}  {_gb(memory.total):>6}  "
        f"{memory.total / row.gpu_memory_bytes:>4.0%}  "
        f"| {_gb(comm.tensor_parallel):>7}  "
        f"{_gb(comm.context_parallel):>7}  {_gb(comm.data_parallel):>7}  {_gb(comm.total):>6}"
    )


def describe_requested(result: Plan) -> str:
    """The sentence about the layout the config asks for."""
    tp, cp = result.requested_tp, result.requested_cp
    asked = f"The config asks for tp={tp} cp={cp}"
    row = result.requested
    if row is None:
        return (
            f"{asked}: tp x cp = {tp * cp} does not divide {result.gpus} GPU(s), so it cannot run on them; "
            "change parallel.tensor_parallel / parallel.context_parallel or the GPU count"
        )
    position = f"rank {result.position(row)} of {len(result.rows)}"
    where = f"{asked}, i.e. {row.layout} on {result.gpus} GPU(s) ({position})"
    if not row.valid:
        return f"{where}: cannot run: {row.reason}."
    if row.fits:
        return f"{where}: fits ({_gb(row.memory.total)} of {_gb(result.gpu_memory_bytes)} GB)."
    return f"{where}: does not fit: {row.reason}."


def rollout_text(settings: TrainingSettings) -> str:
    """The multi-step part of the training line: what the estimate counts K times."""
    if settings.rollout_steps == 1:
        return ""
    recompute = ", activations recomputed per step" if settings.rollout_checkpointing else ""
    return f", {settings.rollout_steps}-step rollouts per sample{recompute}"


def plan_report(result: Plan, shape: ModelShape, settings: TrainingSettings, source: str) -> list[str]:
    """The printed plan: the model, the three groups of layouts, the requested layout, the legend."""
    from dlscale.perf.plan.layout_cost import Layout, count_parameters_per_gpu

    parameters = count_parameters_per_gpu(shape, settings, Layout(1, 1, 1)).local
    height, width = shape.img_size
    lines = [
        f"dlscale plan: {source}, {result.gpus} GPU(s) with {_gb(result.gpu_memory_bytes)} GB each",
        f"  model: ViT embed_dim {shape.embed_dim}, depth {shape.depth}, {shape.num_heads} heads, MLP "
        f"{shape.mlp_hidden_dim}, {parameters:,} parameters",
        f"  data: {height}x{width} images, {shape.in_channels} -> {shape.out_channels} channels, patch "
        f"{shape.patch_size} -> {shape.num_tokens:,} tokens",
        f"  training: global batch {settings.global_batch_size}"
        + (f" (local {settings.local_batch_size} per replica)" if settings.local_batch_size else "")
        + f", amp {settings.amp_mode}, {settings.optimizer}, data_parallel {settings.data_parallel}"
        + rollout_text(settings),
    ]
    groups = (
        (
            "Layouts that fit (least traffic per step first, then least memory):",
            [r for r in result.rows if r.fits],
        ),
        ("Layouts that do not fit (least memory first):", [r for r in result.rows if r.valid and not r.fits]),
        ("Layouts the model cannot be split into:", [r for r in result.rows if not r.valid]),
    )
    for title, rows in groups:
        lines += ["", title]
        if not rows:
            lines.append("  (none)")
            continue
        if rows[0].valid:
            lines.append(COLUMNS)
        for row in rows:
            if row.valid:
                lines.append(table_row(result.position(row), row))
                if not row.fits:
                    lines.append(f"{'':>8}-> {row.reason}")
            else:
                text = f"  {result.position(row):>4}  {row.layout}: {row.reason}"
                lines += textwrap.wrap(text, REPORT_WIDTH, subsequent_indent=" " * 8)
    lines.append("")
    paragraphs = (describe_requested(result), LEGEND, caveat(), *(f"note: {n}" for n in result.notes))
    for paragraph in paragraphs:
        lines += textwrap.wrap(paragraph, REPORT_WIDTH, subsequent_indent="  ")
    return lines


def plan_document(
    result: Plan, shape: ModelShape, settings: TrainingSettings, config_name: str, source: str
) -> dict[str, Any]:
    """The plan as JSON: inputs, every row in ranked order (with its rank), the requested layout."""
    from dlscale.perf.plan.layout_cost import GIB

    requested = result.requested
    return {
        "config": config_name,
        "source": source,
        "gpus": result.gpus,
        "gpu_memory_gb": round(result.gpu_memory_bytes / GIB, 2),
        "gb_bytes": GIB,
        "model": {**vars(shape), "img_size": list(shape.img_size), "num_tokens": shape.num_tokens},
        "settings": vars(settings),
        "requested": {
            "tp": result.requested_tp,
            "cp": result.requested_cp,
            "rank": None if requested is None else result.position(requested),
            "fits": requested is not None and requested.fits,
            "summary": describe_requested(result),
        },
        "rows": [{"rank": result.position(row), **row.to_dict()} for row in result.rows],
        "notes": result.notes,
    }
