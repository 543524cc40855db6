"""The Markdown table and the figure of benchmarks/plan_vs_measured_workloads.py's result."""

from __future__ import annotations

from typing import Any

from allocation_trace import CATEGORIES
from benchmark_text import mib, percent_range
from matplotlib.figure import Figure

MODEL_STATES = CATEGORIES[:3]  # parameters, gradients, optimizer state
PROMISED = (0.68, 1.11)  # the ViT's analytic planner's range on the CPU (benchmarks/plan_vs_measured.py)


def reading(result: dict[str, Any]) -> str:
    """What the numbers say, worded from them."""
    cases = result["cases"]
    ratios = [c["ratio_estimate_over_measured"] for c in cases]
    workloads = sorted({c["workload"] for c in cases})
    per_workload = ", ".join(
        f"{name} {percent_range([c['ratio_estimate_over_measured'] for c in cases if c['workload'] == name])}"
        for name in workloads
    )
    phases = sorted({c["peak_phase"] for c in cases})
    other = [c["at_peak"]["other"] / c["measured_peak_bytes"] for c in cases]
    over = [c for c in cases if c["ratio_estimate_over_measured"] > 1]
    no_gradients = [c for c in over if c["at_peak"]["gradients"] == 0]
    sentences = [
        f"The estimate is {percent_range(ratios)} of the measured peak ({per_workload}), below it in "
        f"{sum(r < 1 for r in ratios)} of {len(cases)} cases; the peaks fall in the {' or '.join(phases)}.",
        f"What it does not model is the 'other' at the peak ({percent_range(other)} of it): the gradients "
        "flowing back through the layers (largest for the U-Net's full-resolution output and the CNN's "
        "feature maps), the loss's and the collectives' temporaries, FSDP2's unsharded parameters and "
        "gradients (which the estimate counts among the states).",
    ]
    if over:
        sentences.append(
            f"Where it lands above the peak ({', '.join(c['case'] for c in over)}), it counts parts at their "
            "largest that never all live at once: every gradient, though at the peak of "
            f"{len(no_gradients)} of these none exists (zero_grad(set_to_none=True) freed them, and FSDP2's "
            "forward comes before any), and FSDP2's whole unsharded working set."
        )
    sentences.append(
        "On a GPU the caching allocator's rounding and fragmentation and the libraries' workspaces come on top "
        "of these tensor bytes."
    )
    return " ".join(sentences)


def markdown(result: dict[str, Any]) -> str:
    """The result as a Markdown report: what was run where, one row per case, and the reading."""
    check = result["self_check"]
    cases = result["cases"]
    mismatch = max(c["classified_minus_measured_bytes"] for c in cases)
    lines = [
        "# dlscale plan's traced estimate vs the measured peak of a training step, per workload (CPU)",
        "",
        f"- date: {result['date']}",
        f"- command: `{result['command']}`",
        f"- device: {result['device']}; torch {result['torch_version']}, dlscale {result['dlscale_version']}",
        f"- estimate: {result['estimate']}",
        f"- measured: {result['measurement']}: zero_grad, forward, the workload's loss, backward, the config's "
        "optimizer, after a warm-up step; tensor bytes as requested (no allocator rounding); the busiest rank",
        f"- self-check: a known sequence of tensors peaks at {check['peak_bytes']} bytes (expected "
        f"{check['expected_peak_bytes']}); the step with saved-tensor hooks that splits the peak differs from "
        f"the measured step by {mismatch} bytes at most",
        "- configs: " + "; ".join(sorted({f"{c['workload']}: `{c['config']}`" for c in cases})),
        "- MiB = 2^20 bytes",
        "",
        "| case | optimizer | local batch | estimated MiB | measured peak MiB | estimate / measured | peak in "
        "| estimate: states / activ. / batch / copies MiB | at the peak: states / saved / batch / other MiB |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for case in cases:
        estimate, at_peak = case["estimate_bytes"], case["at_peak"]
        lines.append(
            f"| {case['case']} | {estimate['optimizer']} | {case['local_batch']} | {mib(estimate['total'])} "
            f"| {mib(case['measured_peak_bytes'])} | {case['ratio_estimate_over_measured']:.2f} "
            f"| {case['peak_phase']} "
            f"| {mib(estimate['model_states'])} / {mib(estimate['activations'])} / {mib(estimate['batch'])} "
            f"/ {mib(estimate['autocast_weight_copies'])} "
            f"| {mib(sum(at_peak[k] for k in MODEL_STATES))} / {mib(at_peak['saved for backward'])} "
            f"/ {mib(at_peak['batch'])} / {mib(at_peak['other'])} |"
        )
    refused = result.get("refused", [])
    if refused:
        lines += ["", "Layouts the plan refuses, tried anyway:", ""]
        for case in refused:
            lines.append(
                f"- {case['case']}: the plan: {case['skipped']}; training: `{case['training_says']}`"
            )
    return "\n".join([*lines, "", reading(result), ""])


def figure(result: dict[str, Any]) -> Figure:
    """Per case, the estimate (left bar) and the measured peak (right bar) as shares of the measured peak, each
    split into its parts, with the peak in MiB above; the band the plan promises is shaded."""
    cases = result["cases"]
    fig = Figure(figsize=(max(9.0, 0.62 * len(cases) + 3), 6.2), layout="constrained")
    axes = fig.subplots()
    peaks = [c["measured_peak_bytes"] for c in cases]
    estimated = {
        "estimate: model states": [c["estimate_bytes"]["model_states"] for c in cases],
        "estimate: saved activations": [c["estimate_bytes"]["activations"] for c in cases],
        "estimate: batch and weight copies": [
            c["estimate_bytes"]["batch"] + c["estimate_bytes"]["autocast_weight_copies"] for c in cases
        ],
    }
    measured = {
        "peak: model states": [sum(c["at_peak"][k] for k in MODEL_STATES) for c in cases],
        "peak: saved for backward": [c["at_peak"]["saved for backward"] for c in cases],
        "peak: batch": [c["at_peak"]["batch"] for c in cases],
        "peak: other (gradients flowing back, temporaries)": [c["at_peak"]["other"] for c in cases],
    }
    palette = {
        "estimate": ["#4c72b0", "#dd8452", "#8c8c8c"],
        "peak": ["#a6bddb", "#f3c49b", "#cccccc", "#c44e52"],
    }
    low, high = PROMISED
    axes.axhspan(
        100 * low, 100 * high, color="#55a868", alpha=0.12, label=f"{low:.0%}-{high:.0%} of the peak"
    )
    for offset, parts, colors in ((-0.21, estimated, palette["estimate"]), (0.21, measured, palette["peak"])):
        bottom = [0.0] * len(cases)
        for (label, values), color in zip(parts.items(), colors, strict=True):
            heights = [100 * value / peak for value, peak in zip(values, peaks, strict=True)]
            positions = [index + offset for index in range(len(cases))]
            axes.bar(
                positions, heights, 0.4, bottom=bottom, label=label, color=color, edgecolor="white", lw=0.4
            )
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    for index, case in enumerate(cases):
        ratio = case["ratio_estimate_over_measured"]
        axes.text(index - 0.21, 100 * ratio + 1.5, f"{ratio:.2f}", ha="center", va="bottom", fontsize=7)
        axes.text(index + 0.21, 101.5, f"{mib(case['measured_peak_bytes'])}", ha="center", va="bottom",
                  fontsize=6, rotation=90, color="#555555")  # fmt: skip
    axes.axhline(100, color="gray", ls="--", lw=0.8)
    axes.set_ylim(0, 150)
    axes.set_ylabel("% of the measured peak (busiest rank)")
    axes.set_title(
        "dlscale plan's traced estimate (left bar, ratio on top) vs the measured step peak (right bar, MiB on "
        f"top), CPU, {result['date'][:10]}",
        fontsize=9,
    )
    axes.legend(fontsize=7, ncols=3, loc="upper center")
    axes.set_xticks(range(len(cases)), [c["case"] for c in cases], rotation=55, ha="right", fontsize=7)
    axes.set_xlim(-0.6, len(cases) - 0.4)
    return fig
