"""What ``dlscale plan`` prints and writes for a traced plan (:mod:`dlscale.perf.plan.traced_plan`): the table of
data-parallel layouts, the sentence about the config's own, the legend and what the estimate leaves out."""

from __future__ import annotations

import textwrap
from dataclasses import asdict, dataclass
from typing import Any

from dlscale.perf.plan.layout_cost import GIB
from dlscale.perf.plan.traced_layouts import OptimizerMemory
from dlscale.perf.plan.traced_memory import TensorSpec
from dlscale.perf.plan.traced_plan import MEASURED_RATIO_RANGE, MEASURED_RESULT, TracedPlan, TracedRow

COLUMNS = (
    f"  {'layout':<12}  {'batch':>5}  {'params/GPU':>11}  {'states':>6}  {'activ.':>6}  {'inputs':>6}  "
    f"{'copies':>6}  {'CUDA':>4}  {'total':>6}  {'use':>4}"
)
LEGEND = (
    "GB per GPU (GB = 2^30 bytes): states = parameters + gradients + optimizer state (+ FSDP2's unsharded "
    "working set or DDP's separate buckets); activ. = tensors saved for backward, traced at the local batch; "
    "inputs = the batch's inputs and targets where autograd does not already keep them; copies = autocast's "
    "half-precision weights; CUDA = allowance for the CUDA context and libraries; use = total / GPU memory."
)
REPORT_WIDTH = 110


@dataclass(frozen=True)
class TracedPlanContext:
    """What the plan was made of, for its header and its JSON."""

    config: str
    source: str
    workload: str
    sample: tuple[TensorSpec, TensorSpec]
    global_batch: int
    amp_mode: str
    optimizer: OptimizerMemory
    model_parallel: str  # why tp/cp layouts are not listed


def format_gb(value: float) -> str:
    """Bytes as GB for the table: two decimals, or a small model's few MB in scientific notation ("2.9e-3"),
    which two decimals would print as 0.00 in every column (6 characters at most either way)."""
    gb = value / GIB
    if gb == 0 or gb >= 0.01:
        return f"{gb:.2f}"
    mantissa, _, exponent = f"{gb:.1e}".partition("e")
    return f"{mantissa}e{int(exponent)}"


def table_row(row: TracedRow) -> str:
    """One layout as a line of the table (a layout that cannot run has no numbers)."""
    start = f"  {str(row.layout):<12}"
    memory = row.memory
    if memory is None:
        return start.rstrip()
    return (
        f"{start}  {row.local_batch:>5}  {row.stored_parameters:>11,}  "
        f"{format_gb(memory.model_states):>6}  {format_gb(memory.activations):>6}  {format_gb(memory.batch):>6}  "
        f"{format_gb(memory.autocast_weight_copies):>6}  {format_gb(memory.cuda_allowance):>4}  "
        f"{format_gb(memory.total):>6}  {memory.total / row.gpu_memory_bytes:>4.0%}"
    )


def describe_requested(result: TracedPlan) -> str:
    """The sentence about the layout the config asks for."""
    row = result.requested_row
    where = (
        f"The config asks for data_parallel {result.requested!r}, i.e. {row.layout} on {result.gpus} GPU(s)"
    )
    if row.layout.dp == 1:
        where = "The config on one GPU (no data parallelism)"
    if not row.valid:
        return f"{where}: cannot run: {row.reason}."
    if row.fits:
        return f"{where}: fits ({format_gb(row.memory.total)} of {format_gb(result.gpu_memory_bytes)} GB)."
    return f"{where}: does not fit: {row.reason}."


def caveat() -> str:
    """What the estimate leaves out, and how close it came to measured peaks."""
    low, high = MEASURED_RATIO_RANGE
    return (
        "Not estimated: the gradients flowing back through the layers, the temporaries of the loss, the "
        "collectives and the optimizer, the caching allocator's reserve and fragmentation. On the CPU this "
        f"estimate came to {low:.0%}-{high:.0%} of the measured peak of a training step (U-Net, CNN, ResNet, the heat2d example; "
        f"{MEASURED_RESULT}): treat a layout whose use is near 100% as not fitting."
    )


def traced_plan_report(result: TracedPlan, context: TracedPlanContext) -> list[str]:
    """The printed plan: the model, the layouts, the requested one, the legend and the caveat."""
    step = result.step
    inputs, targets = context.sample
    model = f"workload {context.workload}"
    if step is not None:
        model += f", {step.parameter_count:,} trained parameters" + (
            f" in {step.units} FSDP unit(s) and the root" if step.units else ""
        )
    header = (
        f"dlscale plan: config {context.config!r} ({context.source}), {result.gpus} GPU(s) with "
        f"{format_gb(result.gpu_memory_bytes)} GB each",
        f"  model: {model} (traced on fake tensors: one forward and loss, nothing allocated)",
        f"  data: one sample is input {inputs}, target {targets}",
        f"  training: global batch {context.global_batch}, amp {context.amp_mode}, {context.optimizer.name}, data_parallel "
        f"{result.requested}",
    )
    lines = [
        wrapped for line in header for wrapped in textwrap.wrap(line, REPORT_WIDTH, subsequent_indent="    ")
    ]
    lines += ["", "Data-parallel layouts:", COLUMNS]
    for row in result.rows:
        lines.append(table_row(row))
        if row.reason:
            lines += textwrap.wrap(
                f"-> {'cannot run' if not row.valid else 'does not fit'}: {row.reason}",
                REPORT_WIDTH,
                initial_indent=" " * 8,
                subsequent_indent=" " * 11,
            )
    lines.append("")
    paragraphs = (
        describe_requested(result),
        context.model_parallel,
        LEGEND,
        caveat(),
        *(f"note: {note}" for note in result.notes),
    )
    for paragraph in paragraphs:
        lines += textwrap.wrap(paragraph, REPORT_WIDTH, subsequent_indent="  ")
    return lines


def traced_plan_document(result: TracedPlan, context: TracedPlanContext) -> dict[str, Any]:
    """The plan as JSON: inputs, the trace, every row, the requested layout."""
    step = result.step
    row = result.requested_row
    return {
        "config": context.config,
        "source": context.source,
        "estimator": "traced",
        "workload": context.workload,
        "gpus": result.gpus,
        "gpu_memory_gb": round(result.gpu_memory_bytes / GIB, 2),
        "gb_bytes": GIB,
        "sample": {
            name: {"shape": list(spec.shape), "dtype": str(spec.dtype).removeprefix("torch.")}
            for name, spec in zip(("input", "target"), context.sample, strict=True)
        },
        "settings": {
            "global_batch_size": context.global_batch,
            "amp_mode": context.amp_mode,
            "optimizer": asdict(context.optimizer),
            "data_parallel": result.requested,
        },
        "trace": None
        if step is None
        else {
            "parameters": step.parameter_count,
            "parameter_bytes": step.parameter_bytes,
            "fsdp_units": step.units,
            "local_batch": step.local_batch,
            "saved_activations": step.saved_activations,
            "autocast_weight_copies": step.autocast_weight_copies,
            "unsaved_batch": step.unsaved_batch,
        },
        "requested": {"layout": str(row.layout), "fits": row.fits, "summary": describe_requested(result)},
        "rows": [r.to_dict() for r in result.rows],
        "model_parallel": context.model_parallel,
        "notes": result.notes,
    }
