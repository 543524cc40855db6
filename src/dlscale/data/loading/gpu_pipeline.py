"""The ``gpu`` data pipeline (``loader.data_loader_config: gpu``, or ``dali``, the role it plays).

Reader threads, not processes, fill a ring of ``prefetch_depth`` page-locked host batches in sampler order;
each batch is copied to the device on a side stream while the previous step computes, and normalized there.

Threads and streams:

* The batches of sample indices come from ``BatchSampler(sampler, batch_size, drop_last=False)``, taken when a
  pass starts, so order, sharding, mid-epoch resume (``set_epoch(epoch, start_step)``) and the short last batch
  are exactly those of the pytorch loader over the same sampler.
* Batch k is read into ring slot ``k % prefetch_depth``; every sample is one task for a pool of reader threads,
  so the samples of one batch are read in parallel, and up to ``prefetch_depth`` batches are read ahead. A data
  set that reads whole batches (``SupportsBatchReads``, e.g. ERA5) gets one task per batch, filling the slot
  directly.
* The consumer's thread waits for batch k to be complete, queues its copy to the device and its normalization
  (or another device transform of the data set's, which may also get the batch's sample keys) on the side
  stream, then hands slot k's reads of batch ``k + prefetch_depth`` to the readers. Those first wait on the
  copy's event: a slot is never overwritten while its copy is in flight.
* When batch k+1 is already read, its copy is queued before batch k is returned, so it overlaps the compute of
  batch k even when the training loop synchronizes every step. The compute stream (not the host) waits for a
  batch's copy when the consumer receives it.
* A pass's threads stop at the end of the pass, when the consumer stops early (the iterator is closed or
  dropped), when the next pass starts, and at interpreter exit. A reader's exception is raised, unchanged,
  in the consumer when it reaches the batch that failed.

On the CPU the same code runs with plain buffers, clones for copies and no waits, and yields batches that are
bitwise equal to the pytorch loader's.

HDF5 reads hold h5py's global lock, so threads overlap the reads with the copies into the ring, conversion and
compute rather than with each other; for read-bound runs the pytorch loader's worker processes scale further.
"""

from __future__ import annotations

import functools
import queue
import threading
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import BatchSampler, Dataset, Sampler

from dlscale.data.loading.batch_reads import SupportsBatchReads
from dlscale.data.values.normalization import BatchNormalizer, SupportsDeviceNormalization
from dlscale.runtime.device import Device
from dlscale.runtime.transfer import CopyStream, HostFence, Transfer, bind_thread_to, host_buffer

READER_THREAD_PREFIX = "dlscale-reader"

# How often a consumer waiting for a batch checks that its readers are still alive (seconds).
_LIVENESS_CHECK_S = 1.0


class _Slot:
    """One batch-sized pair of host buffers of the ring, and the fence of the last copy that read them."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor):
        self.inputs = inputs
        self.targets = targets
        self.last_copy = HostFence()

    def write(self, position: int, index: int, sample: Sequence[Any]) -> None:
        """Store sample ``index`` at row ``position``, refusing samples unlike the first one."""
        if len(sample) != 2:
            raise ValueError(f"sample {index} has {len(sample)} items, expected (inputs, targets)")
        for name, buffer, value in (("inputs", self.inputs, sample[0]), ("targets", self.targets, sample[1])):
            value = torch.as_tensor(value)
            if value.shape != buffer.shape[1:] or value.dtype != buffer.dtype:
                raise ValueError(
                    f"sample {index}: {name} has shape {tuple(value.shape)} and dtype {value.dtype}, but "
                    f"the first sample had {tuple(buffer.shape[1:])} and {buffer.dtype}; "
                    "the gpu pipeline needs samples of one shape and dtype"
                )
            buffer[position].copy_(value)


@dataclass(frozen=True)
class _ReadTask:
    """Read samples ``indices`` into rows ``position``, ``position + 1``, ... of ``slot``."""

    batch_number: int
    position: int
    indices: Sequence[Any]
    slot: _Slot
    slot_free: HostFence


class _Readers:
    """The reader threads of one pass and what they report: which batches are complete, and failures.

    Deliberately knows nothing of the pass iterator: the threads reference this object only, so dropping the
    iterator can garbage-collect it and run its finalizer, which stops them.
    """

    def __init__(self, dataset: Dataset, num_threads: int, device: Device):
        self._dataset = dataset
        # A data set that reads whole batches is given one task per batch (it reads them faster than sample by
        # sample, and its reads hold h5py's lock anyway); others one task per sample, read in parallel.
        self._batch_reads = isinstance(dataset, SupportsBatchReads)
        self._device = device
        self._tasks: queue.SimpleQueue[_ReadTask | None] = queue.SimpleQueue()
        self._condition = threading.Condition()
        self._remaining: dict[int, int] = {}  # batch number -> read tasks not yet done
        self._failures: dict[int, BaseException] = {}
        self._stopping = threading.Event()
        self._threads = [
            threading.Thread(target=self._work, name=f"{READER_THREAD_PREFIX}-{i}", daemon=True)
            for i in range(num_threads)
        ]
        for thread in self._threads:
            thread.start()

    def read_batch(
        self, batch_number: int, indices: Sequence[int], slot: _Slot, slot_free: HostFence
    ) -> None:
        """Queue the reads of one batch into ``slot``, to start once ``slot_free`` says its last copy is done."""
        if self._batch_reads:
            tasks = [_ReadTask(batch_number, 0, indices, slot, slot_free)]
        else:
            tasks = [
                _ReadTask(batch_number, row, [index], slot, slot_free) for row, index in enumerate(indices)
            ]
        with self._condition:
            self._remaining[batch_number] = len(tasks)
        for task in tasks:
            self._tasks.put(task)

    def is_ready(self, batch_number: int) -> bool:
        """Whether the batch is completely read (False if a read of it failed)."""
        with self._condition:
            return self._remaining.get(batch_number) == 0 and batch_number not in self._failures

    def wait_for(self, batch_number: int) -> None:
        """Block until the batch is read; raise the exception of a failed read of it as it was raised."""
        with self._condition:
            while True:
                failure = self._failures.get(batch_number)
                if failure is not None:
                    raise failure
                if batch_number not in self._remaining:
                    # A bug in the pass, not in the data: fail loudly rather than wait forever.
                    raise RuntimeError(f"batch {batch_number} was never queued for reading")
                if self._remaining.get(batch_number) == 0:
                    del self._remaining[batch_number]
                    return
                if not self._condition.wait(_LIVENESS_CHECK_S) and not self.alive:
                    raise RuntimeError(f"the reader threads stopped before batch {batch_number} was read")

    @property
    def alive(self) -> bool:
        return any(thread.is_alive() for thread in self._threads)

    def shutdown(self) -> None:
        """Stop the threads: queued reads are skipped, a read in progress finishes first. Idempotent."""
        self._stopping.set()
        for _ in self._threads:
            self._tasks.put(None)
        current = threading.current_thread()
        for thread in self._threads:
            # A reader can end up here itself if the garbage collector runs the finalizer on its thread.
            if thread is not current:
                thread.join()

    def _read(self, task: _ReadTask) -> None:
        slot, first = task.slot, task.position
        if self._batch_reads:
            rows = slice(first, first + len(task.indices))
            self._dataset.read_batch(task.indices, out=(slot.inputs[rows], slot.targets[rows]))
            return
        for row, index in enumerate(task.indices, start=first):
            slot.write(row, index, self._dataset[index])

    def _work(self) -> None:
        bind_thread_to(self._device)  # its event waits then use this rank's GPU, not GPU 0
        while True:
            task = self._tasks.get()
            if task is None:
                return
            if self._stopping.is_set():
                continue
            try:
                task.slot_free.wait()
                self._read(task)
            except BaseException as exc:  # every failure must reach the consumer, not end the thread
                with self._condition:
                    self._failures.setdefault(task.batch_number, exc)
                    self._condition.notify_all()
                continue
            with self._condition:
                self._remaining[task.batch_number] -= 1
                if self._remaining[task.batch_number] == 0:
                    self._condition.notify_all()


class _Pass(Iterator[tuple[torch.Tensor, torch.Tensor]]):
    """One pass over the batches: owns the reader threads and stops them when closed or dropped."""

    def __init__(
        self,
        batches: list[list[int]],
        slots: list[_Slot],
        readers: _Readers,
        copy_stream: CopyStream,
        normalizer: BatchNormalizer | None,
    ):
        self._batches = batches
        self._slots = slots
        self._readers = readers
        self._copy_stream = copy_stream
        self._normalizer = normalizer
        self._next_batch = 0
        self._staged: tuple[int, Transfer] | None = None
        # Runs readers.shutdown once: on close(), when this iterator is garbage-collected, or at exit.
        self._finalizer = weakref.finalize(self, readers.shutdown)
        for batch_number in range(min(len(slots), len(batches))):
            slot = slots[batch_number]
            readers.read_batch(batch_number, batches[batch_number], slot, slot.last_copy)

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        batch_number = self._next_batch
        if batch_number >= len(self._batches) or not self._finalizer.alive:
            self.close()
            raise StopIteration
        try:
            if self._staged is not None and self._staged[0] == batch_number:
                transfer = self._staged[1]
            else:
                transfer = self._stage(batch_number)
            self._staged = None
            following = batch_number + 1
            if following < len(self._batches) and self._readers.is_ready(following):
                self._staged = (following, self._stage(following))
            self._next_batch = following
            inputs, targets = transfer.ready()
        except BaseException:
            self.close()
            raise
        return inputs, targets

    def _stage(self, batch_number: int) -> Transfer:
        """Wait for a batch's reads, queue its copy and normalization, and hand its slot to a later batch."""
        self._readers.wait_for(batch_number)
        slot = self._slots[batch_number % len(self._slots)]
        size = len(self._batches[batch_number])
        finish = self._normalizer
        if finish is not None and getattr(finish, "needs_sample_keys", False):
            finish = functools.partial(finish, keys=self._batches[batch_number])  # per-sample device work
        transfer = self._copy_stream.to_device(
            (slot.inputs[:size], slot.targets[:size]), finish=finish, host_memory_reused=True
        )
        slot.last_copy = transfer.fence
        later = batch_number + len(self._slots)
        if later < len(self._batches):
            self._readers.read_batch(later, self._batches[later], slot, transfer.fence)
        return transfer

    def close(self) -> None:
        """Stop this pass's reader threads (waiting for reads in progress); later ``next()`` calls stop."""
        self._staged = None
        self._finalizer()


class GpuPipeline:
    """Batches of ``dataset`` in ``sampler`` order, read by threads and delivered on ``device``.

    Args:
        dataset: a map-style data set of (inputs, targets) samples of fixed shapes; if it implements
            :class:`SupportsDeviceNormalization`, raw samples are read and normalized on the device.
        sampler: the indices of one pass, e.g. a TrainingSampler (its ``set_epoch`` applies to the next pass).
        batch_size: samples per batch; the last batch of a pass may be shorter.
        device: where batches are delivered (and normalized).
        num_threads: reader threads; ``num_data_workers: 0`` maps to 1, because reading in the consumer's
            thread would serialize reading with the training step, and a thread costs nothing to start.
        prefetch_depth: host batches in the ring, i.e. batches read ahead of the one being copied.
        pin_memory: page-locked ring buffers (None = when the device is a GPU).

    Iterating starts a pass from the sampler's current state (and stops a previous pass still running).
    """

    def __init__(
        self,
        dataset: Dataset,
        sampler: Sampler[int],
        batch_size: int,
        device: Device,
        num_threads: int = 1,
        prefetch_depth: int = 2,
        pin_memory: bool | None = None,
    ):
        if batch_size < 1 or num_threads < 1 or prefetch_depth < 1:
            raise ValueError(
                f"need batch_size, num_threads and prefetch_depth >= 1, got {batch_size}, {num_threads}, "
                f"{prefetch_depth}"
            )
        self.dataset = dataset
        self.sampler = sampler
        self.batch_size = batch_size
        self.device = device
        self.num_threads = num_threads
        self.prefetch_depth = prefetch_depth
        self.pin_memory = pin_memory
        if isinstance(dataset, SupportsDeviceNormalization):
            self._source, host_normalizer = dataset.device_normalization()
        else:
            self._source, host_normalizer = dataset, None
        self._host_normalizer = host_normalizer
        # Made on first iteration, so that building the pipeline reads nothing and touches no GPU.
        self._copy_stream: CopyStream | None = None
        self._normalizer: BatchNormalizer | None = None
        self._slots: list[_Slot] = []
        self._active: weakref.ref[_Pass] | None = None

    @property
    def normalizes_on_device(self) -> bool:
        """Whether normalization runs on the device (the data set implements the protocol)."""
        return self._host_normalizer is not None

    @property
    def pinned(self) -> bool | None:
        """Whether the ring's host buffers are page-locked (None before the first pass allocates them)."""
        return self._slots[0].inputs.is_pinned() if self._slots else None

    def __len__(self) -> int:
        return len(BatchSampler(self.sampler, self.batch_size, drop_last=False))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.close()  # two passes would fill the same ring
        batches = list(BatchSampler(self.sampler, self.batch_size, drop_last=False))
        if not batches:
            return iter(())
        self._prepare(batches[0][0])
        assert self._copy_stream is not None
        readers = _Readers(self._source, self.num_threads, self.device)
        active = _Pass(batches, self._slots, readers, self._copy_stream, self._normalizer)
        self._active = weakref.ref(active)
        return active

    def close(self) -> None:
        """Stop the pass in progress, if any, and its threads. The pipeline can be iterated again."""
        active = self._active() if self._active is not None else None
        if active is not None:
            active.close()
        self._active = None

    def _prepare(self, first_index: int) -> None:
        """Create the copy stream, the device normalizer and the ring, the latter shaped like one sample.

        They outlive this pass, and the first pass may run inside ``torch.inference_mode`` (validation):
        tensors made there could never again be written outside it (by the reader threads, which do not
        inherit the mode, or by a training pass), so they are made in normal mode.
        """
        with torch.inference_mode(False):
            self._prepare_persistent_state(first_index)

    def _prepare_persistent_state(self, first_index: int) -> None:
        if self._copy_stream is None:
            self._copy_stream = CopyStream(self.device)
            if self._host_normalizer is not None:
                # On the side stream: the copies that use the statistics are then ordered after their move.
                with self._copy_stream.on_side_stream():
                    self._normalizer = self._host_normalizer.to(self.device.torch)
        if self._slots:
            return
        sample = self._source[first_index]
        if len(sample) != 2:
            raise ValueError(f"sample {first_index} has {len(sample)} items, expected (inputs, targets)")
        inputs, targets = (torch.as_tensor(item) for item in sample)
        self._slots = [self._new_slot(inputs, targets) for _ in range(self.prefetch_depth)]

    def _new_slot(self, inputs: torch.Tensor, targets: torch.Tensor) -> _Slot:
        """A ring slot for batches of samples like (inputs, targets): the halves of one buffer when they have
        the same shape and dtype (a data set reading batches may then fill both with one read per sample)."""
        if inputs.shape == targets.shape and inputs.dtype == targets.dtype:
            both = host_buffer(
                (2, self.batch_size, *inputs.shape), inputs.dtype, self.device, self.pin_memory
            )
            return _Slot(both[0], both[1])
        return _Slot(
            host_buffer((self.batch_size, *inputs.shape), inputs.dtype, self.device, self.pin_memory),
            host_buffer((self.batch_size, *targets.shape), targets.dtype, self.device, self.pin_memory),
        )

    def __repr__(self) -> str:
        return (
            f"GpuPipeline({len(self)} batches of {self.batch_size}, device={self.device.torch}, "
            f"threads={self.num_threads}, prefetch_depth={self.prefetch_depth}, "
            f"normalize_on_device={self.normalizes_on_device})"
        )
