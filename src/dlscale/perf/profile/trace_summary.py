"""What a torch profiler trace says about a window of training steps, in numbers a reader can act on.

From the Chrome/Perfetto trace that :class:`~dlscale.perf.profile.profilers.TorchProfilerObserver` writes:

* **where the GPU's time went**: every kernel, copy and memset of the window in one of the categories below, each
  category's share of the GPU's busy time, and the share of the window in which the GPU ran nothing at all
  (*idle*: waiting for data, for the host to launch work, or for a host sync);
* **the top kernels** by total time;
* **host syncs per step**: the CUDA runtime calls on the training loop's thread that block the host until the
  GPU catches up (``cudaStreamSynchronize`` behind ``.item()``, ``.cpu()`` or ``bool(tensor)``, and
  ``cudaDeviceSynchronize`` / ``cudaEventSynchronize`` / a synchronous ``cudaMemcpy``). A step without any lets
  the host run ahead and queue the next step's kernels while the GPU works.

Categories are read from kernel names, which differ between libraries and versions, so they are a guide: a
kernel no rule knows counts as *elementwise* (element-wise, normalization, reduction and fused kernels, e.g.
Triton's). A trace without GPU activity (a CPU run) has no shares, and no host syncs to count.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

# Checked in this order: the first rule whose pattern is in the (lower-case) kernel name wins. Attention comes
# before matmul because attention kernels are built from GEMM libraries and carry their names (fmha_cutlass...).
KERNEL_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("communication", re.compile(r"nccl|all_?reduce|all_?gather|reduce_?scatter|sendrecv")),
    ("attention", re.compile(r"flash|fmha|attention|attn|sdpa|mha_")),
    ("optimizer", re.compile(r"adam|sgd|multi_tensor_apply|foreach")),
    (
        "matmul",
        re.compile(
            r"gemm|gemv|xmma|nvjet|cutlass|cublas|wgmma|matmul|triton_tem|(^|[^a-z])(add|b)?mm([^a-z]|$)"
        ),
    ),
)
CATEGORIES = ("matmul", "attention", "elementwise", "optimizer", "copy", "communication")
DEVICE_EVENT_KINDS = {"kernel": None, "gpu_memcpy": "copy", "gpu_memset": "copy"}
# CUDA runtime and driver calls that block the calling host thread until the GPU has finished queued work.
HOST_SYNC = re.compile(
    r"^(cuda(Stream|Device|Event)Synchronize|cudaMemcpy(_v\d+)?|cudaMemcpy[23]D(_v\d+)?|cu(Stream|Ctx|Event)"
    r"Synchronize)(_v\d+)?$"
)
STEP = re.compile(r"^ProfilerStep#(\d+)$")


def kernel_category(name: str) -> str:
    """The category of a kernel by its name (``elementwise`` when no rule matches)."""
    lowered = name.lower()
    for category, pattern in KERNEL_RULES:
        if pattern.search(lowered):
            return category
    return "elementwise"


def short_kernel_name(name: str, limit: int = 120) -> str:
    """A kernel's name without ``void``, its parameter list, anonymous namespaces, the namespaces inside its
    template arguments and their own template arguments; cut to ``limit`` characters."""
    text = name.removeprefix("void ").strip().replace("(anonymous namespace)::", "")
    depth, kept = 0, []
    for character in text:  # drop what is nested two or more template levels deep
        if character == "<":
            depth += 1
            if depth == 1:
                kept.append("<")
            continue
        if character == ">":
            depth -= 1
            if depth == 0:
                kept.append(">")
            continue
        if depth <= 1:
            kept.append(character)
    text = "".join(kept)
    if text.endswith(")") and "(" in text:  # the parameter list of a C++ signature
        text = text[: text.rfind("(")]
    if "<" in text:
        head, _, arguments = text.partition("<")
        text = head + "<" + re.sub(r"\b\w+::", "", arguments)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class StepSyncs:
    """Host syncs inside one recorded step (``ProfilerStep#<step>``)."""

    step: int
    host_syncs: int
    calls: dict[str, int] = field(default_factory=dict)  # runtime call name -> count


@dataclass
class TraceSummary:
    """Where the GPU time of a profiled window went, and the host syncs of each recorded step."""

    steps: int  # ProfilerStep ranges in the trace
    device_events: int  # kernels, copies and memsets
    window_ms: float  # first GPU activity to the last
    busy_ms: float  # time in which at least one kernel or copy ran
    idle_share: float | None  # 1 - busy / window (None without GPU activity)
    category_ms: dict[str, float]
    category_share: dict[str, float]  # of the summed kernel and copy time (overlapping streams count twice)
    top_kernels: list[dict[str, Any]]
    step_syncs: list[StepSyncs]
    # host syncs outside the loop thread's recorded steps (loader or checkpoint threads, or between steps)
    other_syncs: int

    @property
    def on_gpu(self) -> bool:
        return self.device_events > 0

    def host_syncs_per_step(self) -> list[int]:
        return [step.host_syncs for step in self.step_syncs]

    def to_json(self) -> dict[str, Any]:
        document = asdict(self)
        document["host_syncs_per_step"] = self.host_syncs_per_step()
        return document

    def lines(self) -> list[str]:
        """The summary for a log: shares, then host syncs per step."""
        if not self.on_gpu:
            return [
                f"No GPU activity in the trace ({self.steps} step(s)): no GPU time shares or host syncs to count"
            ]
        shares = ", ".join(
            f"{name} {100 * self.category_share[name]:.0f}%"
            for name in CATEGORIES
            if self.category_ms.get(name)
        )
        lines = [
            f"GPU time over {self.steps} profiled step(s) ({self.window_ms:.1f} ms, busy {self.busy_ms:.1f} ms): "
            f"{shares}; idle {100 * (self.idle_share or 0.0):.1f}% of the window",
        ]
        syncs = self.host_syncs_per_step()
        named = sorted({name for step in self.step_syncs for name in step.calls})
        lines.append(
            f"Host syncs per step (training thread): {', '.join(str(count) for count in syncs) or 'no steps'}"
            + (f" ({', '.join(named)})" if named else "")
            + (f"; {self.other_syncs} outside them (other threads)" if self.other_syncs else "")
        )
        return lines


def _union_ms(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length of the union of (start, end) intervals (microseconds in, milliseconds out)."""
    total, current_start, current_end = 0.0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total / 1000.0


def summarize_trace(trace: Mapping[str, Any], top: int = 15, first_step: int = 0) -> TraceSummary:
    """The :class:`TraceSummary` of a Chrome trace as ``torch.profiler`` exports it (``traceEvents``).

    Steps are numbered ``first_step + n`` for the trace's ``ProfilerStep#n`` (the profiler counts from 0 where
    it started; the observer passes the global step it started at)."""
    events = [e for e in trace.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"]
    steps = []  # (step number, start, end, thread)
    device, runtime = [], []
    for event in events:
        kind, name = event.get("cat"), str(event.get("name", ""))
        if kind in DEVICE_EVENT_KINDS:
            device.append(event)
        elif kind in ("cuda_runtime", "cuda_driver") and HOST_SYNC.match(name):
            runtime.append(event)
        elif kind != "gpu_user_annotation" and (found := STEP.match(name)):
            start = float(event["ts"])
            steps.append((int(found.group(1)), start, start + float(event.get("dur", 0.0)), event.get("tid")))
    steps.sort()

    category_us: dict[str, float] = defaultdict(float)
    kernels: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    intervals = []
    for event in device:
        start, duration = float(event["ts"]), float(event.get("dur", 0.0))
        intervals.append((start, start + duration))
        name = str(event.get("name", ""))
        category = DEVICE_EVENT_KINDS[event["cat"]] or kernel_category(name)
        category_us[category] += duration
        kernels[name][0] += 1
        kernels[name][1] += duration
    busy_total = sum(category_us.values())
    window_ms = (max(e for _, e in intervals) - min(s for s, _ in intervals)) / 1000.0 if intervals else 0.0
    busy_ms = _union_ms(intervals)
    ranked = sorted(kernels.items(), key=lambda item: -item[1][1])[:top]
    top_kernels = [
        {
            "name": short_kernel_name(name),
            "category": "copy" if name.startswith(("Memcpy", "Memset")) else kernel_category(name),
            "count": int(count),
            "ms": duration / 1000.0,
            "share": duration / busy_total if busy_total else 0.0,
        }
        for name, (count, duration) in ranked
    ]

    step_syncs = [StepSyncs(step=first_step + number, host_syncs=0) for number, *_ in steps]
    other = 0
    for event in runtime if device else []:
        start = float(event["ts"])
        owner = next(
            (
                index
                for index, (_, begin, end, thread) in enumerate(steps)
                if begin <= start <= end and event.get("tid") == thread
            ),
            None,
        )
        if owner is None:
            other += 1
            continue
        record = step_syncs[owner]
        record.host_syncs += 1
        name = str(event["name"])
        record.calls[name] = record.calls.get(name, 0) + 1
    return TraceSummary(
        steps=len(steps),
        device_events=len(device),
        window_ms=window_ms,
        busy_ms=busy_ms,
        idle_share=1.0 - busy_ms / window_ms if window_ms > 0 else None,
        category_ms={name: category_us[name] / 1000.0 for name in CATEGORIES},
        category_share={name: category_us[name] / busy_total if busy_total else 0.0 for name in CATEGORIES},
        top_kernels=top_kernels,
        step_syncs=step_syncs if device else [],
        other_syncs=other,
    )
