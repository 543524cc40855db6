"""Named ranges (NVTX, torch profiler) and CUDA profiler control, behind the device layer.

The training step and loop mark their parts (``step 12``, ``data``, ``forward``, ``backward``, ``optimizer``)
through a :class:`StepMarkers` object, so the code that marks never asks which device or profiler is in use:

- :data:`NO_MARKERS` (the default) returns one shared do-nothing context manager, so marking costs nothing;
- on a GPU, NVTX ranges show up in Nsight Systems timelines;
- with ``record_functions`` the same names become ``torch.profiler.record_function`` ranges, so they also show
  up in torch profiler traces, on any device.

On a CPU-only torch build ``torch.cuda.nvtx`` and ``torch.cuda.profiler`` raise, so every call to them is
guarded here and nowhere else.
"""

from __future__ import annotations

import contextlib
import logging
from contextlib import AbstractContextManager
from types import TracebackType

import torch

from dlscale.runtime.device import Device

log = logging.getLogger("dlscale.profile")

# One reusable instance: nullcontext keeps no state, so sharing it avoids an allocation per marked range.
_NOTHING: AbstractContextManager[None] = contextlib.nullcontext()


class _NamedRange:
    """One marked range: an NVTX push/pop and/or a torch profiler ``record_function``, entered as a pair."""

    __slots__ = ("name", "nvtx", "record_function", "_recorder")

    def __init__(self, name: str, nvtx: bool, record_function: bool):
        self.name = name
        self.nvtx = nvtx
        self.record_function = record_function
        self._recorder: torch.profiler.record_function | None = None

    def __enter__(self) -> None:
        if self.record_function:
            self._recorder = torch.profiler.record_function(self.name)
            self._recorder.__enter__()
        if self.nvtx:
            torch.cuda.nvtx.range_push(self.name)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # Closed in reverse order of opening, so the two kinds of range nest the same way in every tool.
        if self.nvtx:
            torch.cuda.nvtx.range_pop()
        if self._recorder is not None:
            self._recorder.__exit__(exc_type, exc, traceback)
            self._recorder = None


class StepMarkers:
    """Marks named ranges of the training step; ``range(name)`` is a context manager.

    ``nvtx`` and ``record_functions`` say what is really emitted (both false: nothing happens).
    """

    def __init__(self, nvtx: bool = False, record_functions: bool = False):
        self.nvtx = nvtx
        self.record_functions = record_functions

    @property
    def active(self) -> bool:
        """Whether a marked range emits anything at all."""
        return self.nvtx or self.record_functions

    def range(self, name: str) -> AbstractContextManager[None]:
        """A context manager marking ``name`` for as long as it is entered."""
        if not self.active:
            return _NOTHING
        return _NamedRange(name, self.nvtx, self.record_functions)

    def __repr__(self) -> str:
        return f"StepMarkers(nvtx={self.nvtx}, record_functions={self.record_functions})"


NO_MARKERS = StepMarkers()


def nvtx_available(device: Device) -> bool:
    """Whether NVTX ranges can be emitted: a GPU device and a torch build with NVTX.

    A CUDA build normally has NVTX; a probe push/pop catches one that does not (its stub raises
    RuntimeError), so a missing library costs a warning instead of a crash in the first step.
    """
    if not device.is_gpu:
        return False
    try:
        torch.cuda.nvtx.range_push("dlscale: nvtx check")
        torch.cuda.nvtx.range_pop()
    except RuntimeError as exc:
        log.warning("NVTX ranges are off: this torch build cannot emit them (%s)", exc)
        return False
    return True


def build_markers(device: Device, nvtx: bool, record_functions: bool) -> StepMarkers:
    """The markers for this run: NVTX ranges when asked for and possible (GPU only), torch profiler ranges
    when asked for (any device), :data:`NO_MARKERS` when neither is on."""
    emit_nvtx = nvtx and nvtx_available(device)
    if not emit_nvtx and not record_functions:
        return NO_MARKERS
    return StepMarkers(nvtx=emit_nvtx, record_functions=record_functions)


def cuda_profiler_start(device: Device) -> bool:
    """Start the CUDA profiler (what ``nsys profile -c cudaProfilerApi`` waits for); returns whether it did.

    On the CPU there is no CUDA profiler: nothing happens and the result is False. Queued GPU work is waited
    for first, so the capture starts at a clean boundary instead of in the middle of the previous step.
    """
    if not device.is_gpu:
        return False
    device.synchronize()
    torch.cuda.profiler.start()
    return True


def cuda_profiler_stop(device: Device) -> bool:
    """Stop the CUDA profiler; returns whether it did (False on the CPU, where nothing happens).

    Kernels launched inside the window run asynchronously; waiting for them before stopping keeps the last
    step's kernels inside the capture.
    """
    if not device.is_gpu:
        return False
    device.synchronize()
    torch.cuda.profiler.stop()
    return True
