"""The batch sources: the gpu pipeline (threads, ring, device normalization), the device prefetcher, the
transfer helpers and ``build_batch_source``. CPU tests run everywhere; ``gpu`` tests need a CUDA device."""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset

from dlscale.data.era5.dataset import ERA5Dataset
from dlscale.data.loading.batch_reads import BatchesAsItems
from dlscale.data.loading.gpu_pipeline import READER_THREAD_PREFIX, GpuPipeline
from dlscale.data.loading.loader_config import LoaderConfig
from dlscale.data.loading.pipeline import build_batch_source
from dlscale.data.loading.prefetch import DevicePrefetcher
from dlscale.data.loading.sampler import EvaluationSampler, TrainingSampler
from dlscale.data.values.normalization import ChannelNormalizer, SupportsDeviceNormalization
from dlscale.errors import DataError
from dlscale.runtime.device import Device
from dlscale.runtime.transfer import CopyStream, host_buffer

CPU = Device("cpu")
SEED = 1234

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def reader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(READER_THREAD_PREFIX)]


def pytorch_batches(dataset: Dataset, sampler, batch_size: int) -> list[tuple[torch.Tensor, ...]]:
    """The reference: the pytorch pipeline's batches on the CPU."""
    source = build_batch_source(dataset, LoaderConfig(), batch_size, sampler, CPU, SEED)
    assert isinstance(source, DataLoader)
    return [tuple(batch) for batch in source]


def assert_same_batches(expected, actual) -> None:
    assert len(actual) == len(expected)
    for number, (want, got) in enumerate(zip(expected, actual, strict=True)):
        assert len(got) == len(want) == 2
        for w, g in zip(want, got, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape, f"batch {number}"
            assert torch.equal(g.cpu(), w), f"batch {number} differs"


@pytest.fixture
def data_cfg(tiny_config):
    return tiny_config().data


@pytest.fixture
def valid_set(data_cfg) -> ERA5Dataset:
    return ERA5Dataset(data_cfg, "valid")  # 23 samples: batches of 4 end with a short one


@pytest.fixture
def train_set(data_cfg) -> ERA5Dataset:
    return ERA5Dataset(data_cfg, "train")  # 46 samples


class PlainDataset(Dataset):
    """A data set without the device-normalization protocol, optionally slow or failing at one index."""

    def __init__(self, base: Dataset, delay_s: float = 0.0, fail_at: int | None = None):
        self.base = base
        self.delay_s = delay_s
        self.fail_at = fail_at
        self.reads: list[int] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int):
        with self._lock:
            self.reads.append(index)
        if self.delay_s:
            time.sleep(self.delay_s)
        if index == self.fail_at:
            raise DataError(f"/data/1990.h5: cannot read 'fields' at time index {index}")
        return self.base[index]


# --- the gpu pipeline yields exactly the pytorch loader's batches ---------------------------------------------


@pytest.mark.parametrize("prefetch_depth", [1, 3])
@pytest.mark.parametrize("workers", [0, 1, 3])
def test_gpu_pipeline_matches_pytorch_loader_over_an_epoch(valid_set, workers, prefetch_depth):
    sampler = EvaluationSampler(len(valid_set))
    expected = pytorch_batches(valid_set, sampler, 4)
    assert [len(batch[0]) for batch in expected] == [4, 4, 4, 4, 4, 3]

    cfg = LoaderConfig(data_loader_config="gpu", num_data_workers=workers, prefetch_depth=prefetch_depth)
    pipeline = build_batch_source(valid_set, cfg, 4, sampler, CPU, SEED)
    assert isinstance(pipeline, GpuPipeline)
    assert pipeline.normalizes_on_device and pipeline.num_threads == max(1, workers)
    assert len(pipeline) == len(expected)
    assert_same_batches(expected, list(pipeline))
    # A second pass (the next epoch) reuses the ring and is just as exact.
    assert_same_batches(expected, list(pipeline))
    assert reader_threads() == []


# --- data sets that read whole batches (ERA5) ------------------------------------------------------------------


class BatchReadSpy(PlainDataset):
    """A PlainDataset that also reads whole batches (through the ERA5 data set) and records those calls."""

    def __init__(self, base: ERA5Dataset):
        super().__init__(base)
        self.batch_reads: list[tuple[list[int], bool]] = []  # (indices, whether tensors to fill were given)

    def read_batch(self, indices, out=None):
        with self._lock:
            self.batch_reads.append((list(indices), out is not None))
        return self.base.read_batch(indices, out=out)


def per_sample_batches(dataset: Dataset, sampler, batch_size: int) -> list[tuple[torch.Tensor, ...]]:
    """The reference for batch reads: torch's DataLoader reading sample by sample and stacking."""
    return [
        tuple(batch) for batch in DataLoader(PlainDataset(dataset), batch_size=batch_size, sampler=sampler)
    ]


@pytest.mark.parametrize("workers", [0, 2])
def test_pytorch_loader_reads_whole_batches_with_the_values_of_sample_reads(train_set, workers):
    sampler = TrainingSampler(len(train_set), 10, num_shards=2, shard_id=1, shuffle=True, seed=SEED)
    expected = per_sample_batches(train_set, sampler, 5)
    assert [len(batch[0]) for batch in expected] == [5, 5, 5, 5]
    source = build_batch_source(train_set, LoaderConfig(num_data_workers=workers), 5, sampler, CPU, SEED)
    assert isinstance(source, DataLoader) and isinstance(source.dataset, BatchesAsItems)
    assert len(source) == len(expected)
    assert_same_batches(expected, [tuple(batch) for batch in source])


def test_pytorch_loader_asks_for_each_batch_once(valid_set):
    spy = BatchReadSpy(valid_set)
    sampler = EvaluationSampler(len(valid_set))
    batches = [tuple(batch) for batch in build_batch_source(spy, LoaderConfig(), 4, sampler, CPU, SEED)]
    assert [indices for indices, _ in spy.batch_reads] == [list(b) for b in BatchSampler(sampler, 4, False)]
    assert spy.reads == []  # never sample by sample
    assert_same_batches(per_sample_batches(valid_set, sampler, 4), batches)


def test_gpu_pipeline_reads_each_batch_with_one_call_into_its_ring(valid_set):
    spy = BatchReadSpy(valid_set)
    sampler = EvaluationSampler(len(valid_set))
    pipeline = GpuPipeline(spy, sampler, 4, CPU, num_threads=2, prefetch_depth=2)
    assert_same_batches(per_sample_batches(valid_set, sampler, 4), list(pipeline))
    expected_calls = [list(b) for b in BatchSampler(sampler, 4, False)]
    assert sorted(indices for indices, _ in spy.batch_reads) == sorted(expected_calls)
    assert all(into_ring for _, into_ring in spy.batch_reads)
    assert spy.reads == [0]  # only the sample that shapes the ring
    # Inputs and targets of one shape share a buffer per slot, so ERA5 reads both states with one HDF5 call.
    slot = pipeline._slots[0]
    assert slot.targets.data_ptr() == slot.inputs.data_ptr() + slot.inputs.nbytes


def test_a_first_pass_under_inference_mode_does_not_break_later_passes(valid_set):
    """Validation reads inside torch.inference_mode; the ring it creates must stay writable outside it."""
    sampler = EvaluationSampler(len(valid_set))
    expected = pytorch_batches(valid_set, sampler, 4)
    pipeline = build_batch_source(valid_set, LoaderConfig(data_loader_config="gpu"), 4, sampler, CPU, SEED)
    with torch.inference_mode():
        assert_same_batches(expected, list(pipeline))
    assert_same_batches(expected, list(pipeline))


@pytest.mark.parametrize("prefetch_depth", [1, 3])
@pytest.mark.parametrize("workers", [0, 3])
def test_gpu_pipeline_matches_pytorch_loader_after_a_mid_epoch_resume(train_set, workers, prefetch_depth):
    # Rank 1 of 2, global batch 10: 4 steps per epoch of 5 local samples.
    sampler = TrainingSampler(len(train_set), 10, num_shards=2, shard_id=1, shuffle=True, seed=SEED)
    cfg = LoaderConfig(data_loader_config="gpu", num_data_workers=workers, prefetch_depth=prefetch_depth)
    pipeline = build_batch_source(train_set, cfg, 5, sampler, CPU, SEED)

    sampler.set_epoch(2, start_step=0)
    whole_epoch = pytorch_batches(train_set, sampler, 5)
    assert_same_batches(whole_epoch, list(pipeline))

    sampler.set_epoch(2, start_step=3)
    resumed = pytorch_batches(train_set, sampler, 5)
    assert len(pipeline) == len(resumed) == 1
    got = list(pipeline)
    assert_same_batches(resumed, got)
    assert_same_batches(whole_epoch[3:], got)  # it starts at the right batch

    sampler.set_epoch(3, start_step=1)
    assert_same_batches(pytorch_batches(train_set, sampler, 5), list(pipeline))


def test_device_normalization_protocol_of_era5(valid_set):
    assert isinstance(valid_set, SupportsDeviceNormalization)
    raw, normalizer = valid_set.device_normalization()
    assert raw is not valid_set and not raw.normalize and valid_set.normalize
    assert raw._handles is not valid_set._handles  # the view opens its own files
    inputs, targets = (torch.stack(items) for items in zip(raw[3], raw[4], strict=True))
    expected_inputs, expected_targets = (
        torch.stack(items) for items in zip(valid_set[3], valid_set[4], strict=True)
    )
    assert not torch.equal(inputs, expected_inputs)  # raw samples really are unnormalized
    inputs, targets = normalizer(inputs, targets)
    assert torch.equal(inputs, expected_inputs) and torch.equal(targets, expected_targets)

    unnormalized = ERA5Dataset(valid_set.cfg, "valid", normalize=False)
    assert unnormalized.device_normalization() == (unnormalized, None)


def test_channel_normalizer_is_bitwise_numpy_float32():
    rng = np.random.default_rng(0)
    values = (rng.standard_normal((3, 5, 7, 9)) * 1e4).astype(np.float32)
    means = (rng.standard_normal(5) * 300).astype(np.float32)
    stds = (rng.uniform(0.1, 900, 5)).astype(np.float32)
    expected = (values - means[:, None, None]) / stds[:, None, None]
    inputs, targets = ChannelNormalizer(means, stds, means[:2], stds[:2])(
        torch.from_numpy(values.copy()), torch.from_numpy(values[:, :2].copy())
    )
    assert inputs.dtype == torch.float32
    assert np.array_equal(inputs.numpy(), expected)
    assert np.array_equal(targets.numpy(), expected[:, :2])


def test_dataset_without_the_protocol_is_read_normalized_by_the_threads(valid_set):
    plain = PlainDataset(valid_set)
    assert not isinstance(plain, SupportsDeviceNormalization)
    sampler = EvaluationSampler(len(valid_set))
    pipeline = GpuPipeline(plain, sampler, 4, CPU, num_threads=2, prefetch_depth=2)
    assert not pipeline.normalizes_on_device
    assert_same_batches(pytorch_batches(valid_set, sampler, 4), list(pipeline))


def test_batches_stay_valid_after_their_ring_slot_is_refilled(valid_set):
    # With one slot, every batch's host buffer is overwritten by the next ones while the consumer keeps them.
    sampler = EvaluationSampler(len(valid_set))
    pipeline = GpuPipeline(valid_set, sampler, 2, CPU, num_threads=3, prefetch_depth=1)
    kept = list(pipeline)
    assert len(kept) == 12
    assert_same_batches(pytorch_batches(valid_set, sampler, 2), kept)


@pytest.mark.parametrize("prefetch_depth", [1, 3])
def test_readers_stay_at_most_prefetch_depth_batches_ahead(valid_set, prefetch_depth):
    plain = PlainDataset(valid_set)
    pipeline = GpuPipeline(
        plain, EvaluationSampler(len(valid_set)), 2, CPU, num_threads=4, prefetch_depth=prefetch_depth
    )
    batches = iter(pipeline)
    next(batches)
    # Batch 0 was delivered and batch 1 may be copied already; the ring holds prefetch_depth more batches.
    # (+1: the pipeline reads one sample first to shape its ring.)
    fewest, most = (prefetch_depth + 1) * 2 + 1, (prefetch_depth + 2) * 2 + 1
    deadline = time.monotonic() + 10
    while len(plain.reads) < fewest and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # time enough for readers that ignored the ring to read on through all 23 samples
    assert fewest <= len(plain.reads) <= most
    pipeline.close()


def test_samples_of_another_shape_are_refused(valid_set):
    class Ragged(PlainDataset):
        def __getitem__(self, index):
            inputs, targets = super().__getitem__(index)
            return (inputs[:, :-1] if index == 5 else inputs), targets

    pipeline = GpuPipeline(Ragged(valid_set), EvaluationSampler(len(valid_set)), 4, CPU)
    with pytest.raises(ValueError, match="sample 5: inputs has shape"):
        list(pipeline)


# --- threads stop, errors surface ------------------------------------------------------------------------------


def test_stopping_early_stops_the_threads_and_the_next_pass_is_whole(valid_set):
    plain = PlainDataset(valid_set, delay_s=0.002)
    sampler = EvaluationSampler(len(valid_set))
    expected = pytorch_batches(valid_set, sampler, 4)
    pipeline = GpuPipeline(plain, sampler, 4, CPU, num_threads=3, prefetch_depth=2)

    for number, _ in enumerate(pipeline):
        assert len(reader_threads()) == 3  # threads, not processes, one per worker
        if number == 1:
            break  # as the trainer does on a stop signal: dropping the iterator stops its readers
    assert reader_threads() == []
    assert_same_batches(expected, list(pipeline))

    batches = iter(pipeline)
    next(batches)
    pipeline.close()
    assert reader_threads() == []
    with pytest.raises(StopIteration):
        next(batches)


def test_a_new_pass_stops_the_previous_one(valid_set):
    sampler = EvaluationSampler(len(valid_set))
    pipeline = GpuPipeline(PlainDataset(valid_set, delay_s=0.001), sampler, 4, CPU, num_threads=2)
    first = iter(pipeline)
    next(first)
    second = iter(pipeline)
    with pytest.raises(StopIteration):
        next(first)
    assert_same_batches(pytorch_batches(valid_set, sampler, 4), list(second))
    assert reader_threads() == []


def test_a_read_error_reaches_the_consumer_as_raised(valid_set):
    sampler = EvaluationSampler(len(valid_set))
    plain = PlainDataset(valid_set, fail_at=9)  # in batch 2
    pipeline = GpuPipeline(plain, sampler, 4, CPU, num_threads=3, prefetch_depth=3)
    delivered = []
    with pytest.raises(DataError, match="1990.h5") as caught:
        for batch in pipeline:
            delivered.append(batch)
    assert len(delivered) == 2  # the batches before the failing one arrive, in order
    assert "cannot read 'fields' at time index 9" in str(caught.value)
    assert any(entry.name == "__getitem__" for entry in caught.traceback)  # raised in the reader, unwrapped
    assert reader_threads() == []
    plain.fail_at = None  # the pipeline is still usable once the cause is gone
    assert_same_batches(pytorch_batches(valid_set, sampler, 4), list(pipeline))


def test_a_truncated_file_raises_a_data_error_naming_it(tiny_era5, tiny_config, tmp_path):
    root = tmp_path / "era5"
    shutil.copytree(tiny_era5, root)
    dataset = ERA5Dataset(tiny_config(f"data.root={root}").data, "train")
    broken = dataset.files[1]
    with broken.open("r+b") as handle:  # after the checks at construction, as if the disk changed
        handle.truncate(broken.stat().st_size // 3)
    cfg = LoaderConfig(data_loader_config="gpu", num_data_workers=2)
    pipeline = build_batch_source(dataset, cfg, 4, EvaluationSampler(len(dataset)), CPU, SEED)
    delivered = 0
    with pytest.raises(DataError, match=broken.name):
        for _ in pipeline:
            delivered += 1
    assert delivered == dataset.samples_per_file[0] // 4  # every batch read from the intact first file
    assert reader_threads() == []


def test_interpreter_exit_with_a_pass_in_progress_is_clean(valid_set, tmp_path):
    config_file = tmp_path / "data_cfg.pickle"
    config_file.write_bytes(pickle.dumps(valid_set.cfg))
    script = textwrap.dedent(
        f"""
        import pickle, time
        from dlscale.data.era5.dataset import ERA5Dataset
        from dlscale.data.loading.gpu_pipeline import GpuPipeline
        from dlscale.data.loading.sampler import EvaluationSampler
        from dlscale.runtime.device import Device

        class SlowERA5(ERA5Dataset):
            def read_batch(self, indices, out=None):  # the pipeline's reads (whole batches for ERA5)
                time.sleep(0.01 * len(indices))
                return super().read_batch(indices, out=out)

        with open({str(config_file)!r}, "rb") as handle:
            dataset = SlowERA5(pickle.load(handle), "valid")
        pipeline = GpuPipeline(dataset, EvaluationSampler(len(dataset)), 2, Device("cpu"), num_threads=3)
        batches = iter(pipeline)  # still referenced, with reads queued, when the interpreter exits
        next(batches)
        print("read one batch", flush=True)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3] / "src")}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "read one batch"
    assert "Traceback" not in done.stderr and "Exception" not in done.stderr, done.stderr
    assert time.perf_counter() - started < 30


# --- device prefetcher, transfer helpers, the entry point --------------------------------------------------------


def test_device_prefetcher_passes_batches_through_on_cpu(valid_set):
    batches = [(torch.ones(2, 3), torch.zeros(2, 1)), (torch.ones(1, 3), torch.zeros(1, 1))]
    prefetcher = DevicePrefetcher(batches, CPU)
    assert len(prefetcher) == 2
    for _ in range(2):  # one fresh pass per iter()
        passed = list(prefetcher)
        assert len(passed) == 2
        for original, got in zip(batches, passed, strict=True):
            assert all(a is b for a, b in zip(original, got, strict=True))  # the very same tensors

    sampler = EvaluationSampler(len(valid_set))
    loader = build_batch_source(valid_set, LoaderConfig(num_data_workers=0), 4, sampler, CPU, SEED)
    wrapped = DevicePrefetcher(loader, CPU)
    assert len(wrapped) == len(loader) == 6
    assert_same_batches(pytorch_batches(valid_set, sampler, 4), [tuple(b) for b in wrapped])


def test_transfer_helpers_are_plain_on_cpu():
    buffer = host_buffer((2, 3), torch.float32, CPU, pin=True)
    assert buffer.shape == (2, 3) and buffer.dtype == torch.float32 and not buffer.is_pinned()
    stream = CopyStream(CPU)
    source = torch.arange(6.0).reshape(2, 3)

    kept = stream.to_device((source,))
    assert kept.ready()[0] is source  # already on the device: no copy
    kept.fence.wait()
    assert kept.fence.done()

    reused = stream.to_device((source,), host_memory_reused=True)
    (copy,) = reused.ready()
    source.zero_()  # the host buffer is refilled...
    assert torch.equal(copy, torch.arange(6.0).reshape(2, 3))  # ...and the delivered tensor is its own

    with stream.on_side_stream():
        doubled = stream.to_device((source + 1,), finish=lambda t: (t.mul_(2),))
    assert torch.equal(doubled.ready()[0], torch.full((2, 3), 2.0))


def test_build_batch_source_picks_the_pipeline(valid_set, caplog):
    sampler = EvaluationSampler(len(valid_set))
    assert isinstance(build_batch_source(valid_set, LoaderConfig(), 4, sampler, CPU, SEED), DataLoader)
    # On the CPU there is nothing to prefetch to: the DataLoader comes back bare.
    bare = build_batch_source(valid_set, LoaderConfig(device_prefetch=True), 4, sampler, CPU, SEED)
    assert isinstance(bare, DataLoader) and not bare.pin_memory

    with caplog.at_level(logging.INFO, logger="dlscale.data"):
        gpu = build_batch_source(valid_set, LoaderConfig(data_loader_config="gpu"), 4, sampler, CPU, SEED)
    assert isinstance(gpu, GpuPipeline) and "DALI" not in caplog.text

    with caplog.at_level(logging.INFO, logger="dlscale.data"):
        dali = build_batch_source(
            valid_set, LoaderConfig(data_loader_config="dali", prefetch_depth=3), 4, sampler, CPU, SEED
        )
    assert isinstance(dali, GpuPipeline) and dali.prefetch_depth == 3 and dali.num_threads == 1
    records = [r for r in caplog.records if r.name == "dlscale.data" and "DALI" in r.getMessage()]
    assert len(records) == 1 and records[0].levelno == logging.INFO
    assert "gpu pipeline plays DALI's role" in records[0].getMessage()
    assert_same_batches(pytorch_batches(valid_set, sampler, 4), list(dali))


# --- on a GPU --------------------------------------------------------------------------------------------------


@pytest.fixture
def gpu() -> Device:
    return Device("cuda:0")


@pytest.mark.parametrize("workers", [0, 3])
@pytest.mark.parametrize("pin_memory", [None, False])
@pytest.mark.gpu
@requires_cuda
def test_gpu_pipeline_on_gpu_matches_host_normalization_bitwise(valid_set, gpu, workers, pin_memory):
    sampler = EvaluationSampler(len(valid_set))
    cfg = LoaderConfig(
        data_loader_config="gpu", num_data_workers=workers, prefetch_depth=2, pin_memory=pin_memory
    )
    pipeline = build_batch_source(valid_set, cfg, 4, sampler, gpu, SEED)
    batches = list(pipeline)
    assert pipeline.pinned is (pin_memory is None)
    assert all(t.device.type == "cuda" for batch in batches for t in batch)
    assert_same_batches(pytorch_batches(valid_set, sampler, 4), batches)
    assert reader_threads() == []


@pytest.mark.gpu
@requires_cuda
def test_channel_normalizer_on_gpu_is_bitwise_numpy_float32(gpu):
    rng = np.random.default_rng(1)
    values = (rng.standard_normal((4, 6, 8, 8)) * 1e4).astype(np.float32)
    means = (rng.standard_normal(6) * 300).astype(np.float32)
    stds = rng.uniform(0.1, 900, 6).astype(np.float32)
    expected = (values - means[:, None, None]) / stds[:, None, None]
    normalizer = ChannelNormalizer(means, stds, means, stds).to(gpu.torch)
    inputs, _ = normalizer(torch.from_numpy(values).to(gpu.torch), torch.from_numpy(values).to(gpu.torch))
    assert np.array_equal(inputs.cpu().numpy(), expected)


@pytest.mark.gpu
@requires_cuda
def test_copies_run_on_the_side_stream_while_compute_runs(gpu):
    host = host_buffer((64, 1024, 1024), torch.float32, gpu)  # 256 MiB
    assert host.is_pinned()
    host.fill_(1.5)
    copy_stream = CopyStream(gpu)
    # Warm-up: the measured copy then reuses a cached device block instead of calling cudaMalloc.
    copy_stream.to_device((host,)).fence.wait()
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # about a second of "compute" on the current stream
    compute_done = torch.cuda.Event()
    compute_done.record()
    transfer = copy_stream.to_device((host,), host_memory_reused=True)
    transfer.fence.wait()  # the copy finished...
    assert not compute_done.query()  # ...while the compute stream was still busy: they overlapped
    (device_copy,) = transfer.ready()
    assert torch.equal(device_copy[:2].cpu(), torch.full((2, 1024, 1024), 1.5))
    torch.cuda.synchronize()


@pytest.mark.gpu
@requires_cuda
def test_compute_stream_waits_for_a_delayed_copy(gpu):
    host = host_buffer((1024, 1024), torch.float32, gpu)
    host.fill_(3.0)
    copy_stream = CopyStream(gpu)
    torch.cuda.synchronize()
    with copy_stream.on_side_stream():
        torch.cuda._sleep(500_000_000)  # delay the side stream: a consumer that did not wait reads garbage
    transfer = copy_stream.to_device((host,), finish=lambda t: (t.mul_(2),))
    (device_tensor,) = transfer.ready()
    total = device_tensor.sum()  # queued on the compute stream
    assert total.item() == 6.0 * 1024 * 1024
    del device_tensor
    torch.cuda.synchronize()


@pytest.mark.gpu
@requires_cuda
def test_device_prefetcher_on_gpu(valid_set, gpu):
    sampler = EvaluationSampler(len(valid_set))
    source = build_batch_source(valid_set, LoaderConfig(num_data_workers=0), 4, sampler, gpu, SEED)
    assert isinstance(source, DevicePrefetcher) and source.loader.pin_memory
    expected = pytorch_batches(valid_set, sampler, 4)
    assert len(source) == len(expected)
    for _ in range(2):
        batches = list(source)
        assert all(t.device.type == "cuda" for batch in batches for t in batch)
        assert_same_batches(expected, batches)
    no_prefetch = LoaderConfig(num_data_workers=0, device_prefetch=False)
    assert isinstance(build_batch_source(valid_set, no_prefetch, 4, sampler, gpu, SEED), DataLoader)


@pytest.mark.gpu
@requires_cuda
def test_ring_slots_are_not_refilled_while_their_copy_is_in_flight(valid_set, gpu):
    # One slot and slow steps: every refill must wait for the copy of the slot's previous batch.
    sampler = EvaluationSampler(len(valid_set))
    pipeline = GpuPipeline(valid_set, sampler, 2, gpu, num_threads=4, prefetch_depth=1)
    expected = pytorch_batches(valid_set, sampler, 2)
    for number, (inputs, targets) in enumerate(pipeline):
        torch.cuda._sleep(20_000_000)  # a slow step on the compute stream
        assert torch.equal(inputs.cpu(), expected[number][0]), f"batch {number}"
        assert torch.equal(targets.cpu(), expected[number][1]), f"batch {number}"
