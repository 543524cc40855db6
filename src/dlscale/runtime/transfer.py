"""Host-to-device copies that overlap compute: page-locked host buffers, a side copy stream, and the waits
that keep both the compute stream and the host from touching memory a copy still uses.

This is the only module of the data path that calls ``torch.cuda``. On the CPU every piece degrades to its
plain equivalent: host buffers are ordinary tensors, a "copy" is a clone (or nothing at all) and every wait
returns at once, so the same calling code runs, and is tested, on both.

A copy's life on a GPU::

    transfer = copy_stream.to_device((inputs, targets))  # queued on the side stream; returns at once
    ...                                                   # the compute stream keeps running the last step
    inputs, targets = transfer.ready()                    # compute stream waits for the copy (not the host)
    transfer.fence.wait()                                 # (another thread) host buffers are free again
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch

from dlscale.runtime.device import Device


def host_buffer(
    shape: Sequence[int], dtype: torch.dtype, device: Device, pin: bool | None = None
) -> torch.Tensor:
    """An uninitialised host tensor to stage batches in: page-locked when copying to a GPU.

    ``pin`` None follows ``device.pin_memory_default``. Pinning is ignored on a CPU device, where there is no
    copy to speed up (and a CPU-only torch cannot pin at all).
    """
    pinned = device.is_gpu and (device.pin_memory_default if pin is None else pin)
    return torch.empty(tuple(shape), dtype=dtype, pin_memory=pinned)


def bind_thread_to(device: Device) -> None:
    """Make ``device`` the current GPU of the calling thread (each thread has its own; a new thread starts on
    GPU 0, where its first CUDA call would otherwise create a context on every rank of a node)."""
    if device.is_gpu and device.torch.index is not None:
        torch.cuda.set_device(device.torch)


class HostFence:
    """Tells a host thread when a copy has finished reading its host tensors, so they may be overwritten."""

    __slots__ = ("_event",)

    def __init__(self, event: torch.cuda.Event | None = None):
        self._event = event

    def wait(self) -> None:
        """Block the calling thread until the copy has completed (returns at once on the CPU)."""
        if self._event is not None:
            self._event.synchronize()

    def done(self) -> bool:
        """Whether the copy has completed, without waiting."""
        return self._event is None or self._event.query()


class Transfer:
    """Device tensors whose copy (and any follow-up work) was queued on a side stream and may still run."""

    __slots__ = ("tensors", "fence", "_sources", "_event", "_device")

    def __init__(
        self,
        tensors: tuple[torch.Tensor, ...],
        sources: tuple[torch.Tensor, ...],
        event: torch.cuda.Event | None,
        device: torch.device,
    ):
        self.tensors = tensors
        self.fence = HostFence(event)
        # The host tensors stay referenced until the consumer takes the batch: the copy may still read them.
        self._sources = sources
        self._event = event
        self._device = device

    def ready(self) -> tuple[torch.Tensor, ...]:
        """The device tensors, safe to use on the calling thread's current (compute) stream.

        The compute stream waits for the side stream's work, the host does not. Each tensor is also recorded
        as used by the compute stream: it was allocated on the side stream, and without the record the caching
        allocator could hand its memory to the next copy as soon as Python drops it, while kernels queued on
        the compute stream still read it.
        """
        if self._event is not None:
            compute = torch.cuda.current_stream(self._device)
            compute.wait_event(self._event)
            for tensor in self.tensors:
                if tensor.device.type == "cuda":
                    tensor.record_stream(compute)
        self._sources = ()
        return self.tensors


class CopyStream:
    """Issues host-to-device copies on a stream of their own, so they run while the compute stream works."""

    def __init__(self, device: Device):
        self.device = device
        self._stream = torch.cuda.Stream(device=device.torch) if device.is_gpu else None

    @contextmanager
    def on_side_stream(self) -> Iterator[None]:
        """Make the side stream current for the block (nothing changes on the CPU).

        Device work that only copies use, such as moving normalization statistics, belongs here: it is then
        ordered before the copies without making the side stream wait for the compute stream.
        """
        if self._stream is None:
            yield
            return
        with torch.cuda.stream(self._stream):
            yield

    def to_device(
        self,
        host_tensors: Sequence[torch.Tensor],
        finish: Callable[..., Sequence[torch.Tensor]] | None = None,
        host_memory_reused: bool = False,
    ) -> Transfer:
        """Queue copies of ``host_tensors`` to the device, then ``finish(*device_tensors)`` on the same stream.

        Returns immediately on a GPU; the copies are asynchronous when the host tensors are pinned.
        ``finish`` (e.g. normalization) receives tensors this call owns and may modify them in place; it runs
        on the side stream, so its kernels overlap compute too.
        ``host_memory_reused``: the caller will overwrite the host tensors (a ring buffer), so on the CPU,
        where the "device" tensor would otherwise be the host tensor itself, it is cloned; on a GPU the caller
        must wait on ``transfer.fence`` before overwriting instead.
        """
        sources = tuple(host_tensors)
        # finish may write into its tensors and a reused host buffer changes under them: both need tensors
        # of their own even where no transfer happens (on the CPU, or a source already on the device).
        copy = host_memory_reused or finish is not None
        if self._stream is None:
            tensors = tuple(t.clone() if copy else t for t in sources)
            if finish is not None:
                tensors = tuple(finish(*tensors))
            return Transfer(tensors, sources, None, self.device.torch)
        compute = torch.cuda.current_stream(self.device.torch)
        if any(t.device == self.device.torch for t in sources):
            # A source already on the device may still be being written by the compute stream.
            self._stream.wait_stream(compute)
        with torch.cuda.stream(self._stream):
            tensors = tuple(t.to(self.device.torch, non_blocking=True, copy=copy) for t in sources)
            if finish is not None:
                tensors = tuple(finish(*tensors))
            # blocking: a reader thread waiting on it sleeps instead of spinning against the training thread
            event = torch.cuda.Event(blocking=True)
            event.record(self._stream)
        return Transfer(tensors, sources, event, self.device.torch)
