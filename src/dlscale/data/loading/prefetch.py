"""Device prefetching for any loader of host batches: the next batch's copy runs while this one computes."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sized
from typing import Any

from dlscale.runtime.device import Device
from dlscale.runtime.transfer import CopyStream, Transfer

Batch = tuple[Any, ...]


class DevicePrefetcher:
    """Wraps an iterable of host batches (tuples of tensors, e.g. a DataLoader's) and yields them on ``device``.

    On a GPU, before batch k is handed to the consumer, batch k+1 is taken from the loader and its copy is
    queued on a side stream, so the copy runs while the compute stream works on batch k (pinned host batches
    make the copies truly asynchronous). Batch k itself is waited for by the compute stream only, never by
    the host.

    On the CPU the batches pass through untouched: the very same tensor objects the loader yields.

    Each ``iter()`` is one fresh pass over the wrapped loader (the trainer starts one per epoch); stopping a
    pass early (``break``) simply drops the loader's iterator, as with the bare loader.
    """

    def __init__(self, loader: Iterable[Batch], device: Device):
        self.loader = loader
        self.device = device
        # Created on first use, so building a prefetcher never touches the GPU.
        self._copy_stream: CopyStream | None = None

    def __len__(self) -> int:
        if not isinstance(self.loader, Sized):
            raise TypeError(f"the wrapped loader {type(self.loader).__name__} has no length")
        return len(self.loader)

    def __iter__(self) -> Iterator[Batch]:
        if not self.device.is_gpu:
            return iter(self.loader)
        if self._copy_stream is None:
            self._copy_stream = CopyStream(self.device)
        return self._prefetching_pass(self._copy_stream)

    def _prefetching_pass(self, copy_stream: CopyStream) -> Iterator[Batch]:
        host_batches = iter(self.loader)
        staged = self._stage(copy_stream, next(host_batches, None))
        while staged is not None:
            # Queue the following copy first: it then overlaps the compute the consumer is about to issue.
            following = self._stage(copy_stream, next(host_batches, None))
            yield staged.ready()
            staged = following

    @staticmethod
    def _stage(copy_stream: CopyStream, batch: Batch | None) -> Transfer | None:
        if batch is None:
            return None
        return copy_stream.to_device(tuple(batch))

    def __repr__(self) -> str:
        return f"DevicePrefetcher({type(self.loader).__name__}, device={self.device.torch})"
