"""Peak memory of a time range from torch.profiler's allocation events (CPU), for benchmarks/plan_vs_measured.py.

``torch.profiler`` with ``profile_memory=True`` records every allocation and free of torch's CPU allocator, with
its size and the allocator's running total; :class:`AllocationTrace` turns a profile into that ordered list plus
the time ranges of its ``record_function`` markers, and answers "what was the peak inside this range, and what
was live then". It counts tensor bytes as requested (no allocator rounding); what is not a torch tensor (gloo's
own buffers, oneDNN scratch space, Python objects) is not in it. :func:`verify_tracking` checks the method on a
known sequence. The profiler misses frees made on gloo's worker threads; :func:`missed_frees` puts them back.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
from collections.abc import Collection
from typing import Any

import torch
from torch._C._profiler import _EventType  # the profiler's event kinds: no public name for them yet
from torch.profiler import ProfilerActivity, profile, record_function

MEASURED_STEP = "measured_step"
PHASES = ("forward", "backward", "optimizer")  # TrainStep's markers
# What the bytes live at a peak are, in the order they are looked up ("other": none of these).
CATEGORIES = ("parameters", "gradients", "optimizer state", "saved for backward", "batch", "other")


@dataclasses.dataclass(frozen=True)
class Allocation:
    """One allocation (size > 0) or free (size < 0) of torch's CPU allocator."""

    time_ns: int
    address: int
    size: int
    live_bytes: int  # bytes allocated since the profile started and not yet freed, after this event


@dataclasses.dataclass(frozen=True)
class Peak:
    """The most bytes live at once in a time range, and when they were."""

    bytes: int
    time_ns: int


class AllocationTrace:
    """The allocations a profile recorded, in order, and the time ranges of its ``record_function`` markers."""

    def __init__(self, events: list[Allocation], ranges: dict[str, list[tuple[int, int]]]):
        self.events = events
        self.ranges = ranges
        self.times = [event.time_ns for event in events]
        self.missed_frees = self.missed_free_bytes = 0

    @classmethod
    def from_profile(cls, profiler: profile, persistent: Collection[int] = ()) -> AllocationTrace:
        """The allocations and frees of a profile, checked against the allocator's own running total, with the
        frees the profiler missed added (see :func:`missed_frees`; ``persistent``: addresses legitimately live
        at the end)."""
        nodes, stack = [], list(profiler.profiler.kineto_results.experimental_event_tree())
        while stack:
            node = stack.pop()
            nodes.append(node)
            stack.extend(node.children)
        ranges: dict[str, list[tuple[int, int]]] = {}
        for node in nodes:
            if node.typed[0] == _EventType.TorchOp:
                ranges.setdefault(node.name, []).append((node.start_time_ns, node.end_time_ns))
        allocations = sorted(
            (node for node in nodes if node.typed[0] == _EventType.Allocation), key=lambda n: n.start_time_ns
        )
        # The allocator's total counts from its first profiled allocation in this process: start from there.
        first = allocations[0].typed[1]
        offset = first.total_allocated - first.alloc_size
        recorded, live = [], 0
        for node in allocations:
            fields = node.typed[1]
            live += fields.alloc_size
            if live != fields.total_allocated - offset:
                raise RuntimeError("allocation events out of order: their sizes do not add up to the total")
            recorded.append((node.start_time_ns, fields.ptr, fields.alloc_size))
        missed = missed_frees(recorded, ranges, set(persistent))
        # A missed free comes before a recorded event of the same instant (the reuse of its address).
        ordered = sorted(
            [(time, 1, index, address, size) for index, (time, address, size) in enumerate(recorded)]
            + [(time, 0, index, address, size) for index, (time, address, size) in enumerate(missed)]
        )
        events, live = [], 0
        for time, _, _, address, size in ordered:
            live += size
            events.append(Allocation(time, address, size, live))
        trace = cls(events, ranges)
        trace.missed_frees = len(missed)
        trace.missed_free_bytes = -sum(size for _, _, size in missed)
        return trace

    def window(self, step: str, phase: str | None = None) -> tuple[int, int]:
        """Start and end (ns) of ``step``, or of its ``phase``."""
        start, end = self.ranges[step][0]
        if phase is None:
            return start, end
        return next((s, e) for s, e in self.ranges[phase] if start <= s and e <= end)

    def live_at(self, time_ns: int) -> int:
        """Bytes live at ``time_ns``."""
        index = bisect.bisect_right(self.times, time_ns)
        return self.events[index - 1].live_bytes if index else 0

    def peak(self, step: str, phase: str | None = None) -> Peak:
        """The most bytes live at once within ``step`` (or its ``phase``), and when."""
        start, end = self.window(step, phase)
        best = Peak(self.live_at(start), start)
        for event in self.events[
            bisect.bisect_left(self.times, start) : bisect.bisect_right(self.times, end)
        ]:
            if event.live_bytes > best.bytes:
                best = Peak(event.live_bytes, event.time_ns)
        return best

    def phase_at(self, step: str, time_ns: int) -> str:
        """The phase of ``step`` that ``time_ns`` falls in ("zero_grad" before the forward)."""
        for phase in PHASES:
            start, end = self.window(step, phase)
            if start <= time_ns <= end:
                return phase
        return "zero_grad"

    def live_allocations_at(self, time_ns: int) -> dict[int, tuple[int, int]]:
        """Address -> (index of its allocation event, bytes) of every allocation live at ``time_ns``."""
        live: dict[int, tuple[int, int]] = {}
        for index, event in enumerate(self.events[: bisect.bisect_right(self.times, time_ns)]):
            if event.size > 0:
                live[event.address] = (index, event.size)
            elif live.pop(event.address, None) is None:
                raise RuntimeError(
                    f"a free of {-event.size} bytes at an address not allocated in the profile"
                )
        return live


def missed_frees(
    recorded: list[tuple[int, int, int]], ranges: dict[str, list[tuple[int, int]]], persistent: set[int]
) -> list[tuple[int, int, int]]:
    """(time, address, -size) of the frees the profiler did not record.

    The profiler records a free only on a thread that profiles: when gloo's worker thread drops the last
    reference to a collective's tensors (its work object outlived the caller's), the free goes unrecorded
    and the tensor would seem to live on. Such a tensor shows by its address being allocated again while it
    is live, or by its outliving the run with nothing owning it (not in ``persistent``: the model's state and
    the batch; DDP's own bookkeeping tensors, a few hundred bytes, would be taken for such a tensor too). It
    was freed when its collective ended, so the free is put at the end of the first gloo collective that
    started after the allocation (never after the address was reused).
    """
    collectives = sorted(span for name, spans in ranges.items() if name.startswith("gloo:") for span in spans)
    collective_starts = [start for start, _ in collectives]
    live: dict[int, tuple[int, int, int]] = {}  # address -> (allocated at, address, size)
    orphans: list[tuple[int, int, int, int | None]] = []  # allocated at, address, size, reused at
    for time, address, size in recorded:
        if size < 0:
            live.pop(address, None)
            continue
        if address in live:
            orphans.append((*live[address], time))
        live[address] = (time, address, size)
    for allocated, address, size in live.values():
        if address not in persistent:
            orphans.append((allocated, address, size, None))
    frees = []
    for allocated, address, size, reused in orphans:
        index = bisect.bisect_left(collective_starts, allocated)
        ends = [collectives[index][1]] if index < len(collectives) else []
        ends += [reused] if reused is not None else []
        if ends:
            frees.append((min(ends), address, -size))
    return frees


def storage_address(tensor: torch.Tensor) -> int:
    """Where the allocation holding ``tensor`` starts (a view's base allocation)."""
    return tensor.untyped_storage().data_ptr()


def owner_addresses(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: list[torch.Tensor]
) -> dict[str, set[int]]:
    """The allocations of each kind of model state, and of the batch, as they are now."""
    parameters = list(model.parameters())
    state = [
        value for values in optimizer.state.values() for value in values.values() if torch.is_tensor(value)
    ]
    return {
        "parameters": {storage_address(p) for p in parameters},
        "gradients": {storage_address(p.grad) for p in parameters if p.grad is not None},
        "optimizer state": {storage_address(value) for value in state},
        "batch": {storage_address(tensor) for tensor in batch},
    }


def step_breakdown(
    trace: AllocationTrace, step: str, owners: dict[str, set[int]], saved: set[int]
) -> dict[str, Any]:
    """The peak of ``step``, when it falls, and the bytes live then by category.

    ``owners`` holds the allocations of each category at the step's end, ``saved`` those autograd saved in its
    forward. An allocation is known by its allocation event, not its address (freed addresses are reused), so
    each is looked up where it is certainly live: owners at the step's end, saved ones at the forward's end
    (autograd keeps them until backward).
    """
    at_end = trace.live_allocations_at(trace.window(step)[1])
    identities = {
        kind: {at_end[a][0] for a in addresses if a in at_end} for kind, addresses in owners.items()
    }
    after_forward = trace.live_allocations_at(trace.window(step, "forward")[1])
    identities["saved for backward"] = {after_forward[a][0] for a in saved if a in after_forward}
    peak = trace.peak(step)
    at_peak = dict.fromkeys(CATEGORIES, 0)
    for identity, size in trace.live_allocations_at(peak.time_ns).values():
        at_peak[next((k for k in CATEGORIES[:-1] if identity in identities.get(k, ())), "other")] += size
    return {
        "peak_bytes": peak.bytes,
        "peak_phase": trace.phase_at(step, peak.time_ns),
        "at_peak": at_peak,
    }


def verify_tracking(rank: int) -> dict[str, int]:
    """The trace of a known sequence: 4000 and 2000 bytes live at once (the peak), then 2042, then nothing."""
    cpu_profile = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with cpu_profile as profiler, record_function(MEASURED_STEP):
        first = torch.empty(1000, dtype=torch.float32)
        second = torch.empty(250, dtype=torch.float64)
        del first
        third = torch.ones(3, 7, dtype=torch.bfloat16)
        del second, third
    trace = AllocationTrace.from_profile(profiler)
    return {
        "peak_bytes": trace.peak(MEASURED_STEP).bytes,
        "expected_peak_bytes": 6000,
        "live_after_bytes": trace.events[-1].live_bytes,
        "expected_live_after_bytes": 0,
    }


class ProfilerMarkers:
    """TrainStep's forward/backward/optimizer phases as profiler ranges (to say where a peak falls)."""

    def range(self, name: str) -> contextlib.AbstractContextManager:
        """A profiler range named ``name``."""
        return record_function(name)
