"""Data parallelism on CPU with gloo: 2 ranks train exactly like 1 rank with the whole batch, validation sums
over ranks, a stop reaches every rank, and a 2-rank checkpoint continues on 1 rank."""

from __future__ import annotations

import json
import re
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from forked_ranks import run_ranks
from run_configs import tiny_run_config

from dlscale.checkpoint.directory import CheckpointDir
from dlscale.checkpoint.files import load_checkpoint
from dlscale.errors import ConfigError
from dlscale.parallel.data_parallel import wrap_data_parallel
from dlscale.perf.flops import Utilization, peak_tflops
from dlscale.run.training import train
from dlscale.runtime.device import Device
from dlscale.runtime.launch import ProcessInfo
from dlscale.training.observer import Observer

CONFIG_FILE = Path(__file__).resolve().parents[2] / "configs" / "vit_era5.yaml"


tiny = partial(tiny_run_config, CONFIG_FILE)  # tiny(data, expdir, *overrides, name="tiny", **flags)


class KeepWeights(Observer):
    """Keeps this rank's final weights (only rank 0 writes checkpoints)."""

    weights: dict[str, np.ndarray] = {}

    def on_train_end(self, trainer, outcome: str) -> None:
        KeepWeights.weights = {
            k: v.detach().cpu().numpy() for k, v in trainer.setup.model.state_dict().items()
        }


class StopAtStep(Observer):
    """A signal after step ``step`` that reaches only rank ``rank`` (every rank when None)."""

    def __init__(self, step: int, rank: int | None = None):
        self.step, self.rank = step, rank

    def on_step_end(self, trainer, loss) -> None:
        on_this_rank = self.rank is None or trainer.setup.process.rank == self.rank
        if on_this_rank and trainer.progress.global_step == self.step:
            trainer.stop.request("SIGTERM")


def train_rank(rank: int, data: Path, expdir: Path, overrides: tuple[str, ...], stop_step: int | None = None):
    observers = [KeepWeights()] + ([StopAtStep(stop_step, rank=1)] if stop_step is not None else [])
    status = train(tiny(data, expdir, *overrides), extra_observers=observers)
    return status, KeepWeights.weights


def checkpoint(expdir: Path) -> dict:
    # ckpt_latest.pt, or the ckpt_latest directory of a sharded checkpoint (tp and FSDP2 runs write those)
    return load_checkpoint(CheckpointDir(expdir / "tiny" / "00" / "checkpoints").latest_path)


def assert_close_weights(expected: dict, actual: dict, what: str) -> None:
    assert expected.keys() == actual.keys()
    for key in expected:
        np.testing.assert_allclose(
            np.asarray(actual[key]), np.asarray(expected[key]), rtol=1e-4, atol=2e-6, err_msg=f"{what}: {key}"
        )


@pytest.mark.parametrize(
    "knobs",
    [
        pytest.param((), id="defaults"),
        pytest.param(
            (
                "parallel.bucket_cap_mb=0.01",
                "parallel.disable_broadcast_buffers=true",
                "parallel.gradient_as_bucket_view=false",
            ),
            id="small-buckets-no-broadcast",
        ),
    ],
)
@pytest.mark.slow
def test_two_ranks_train_like_one_rank_with_the_whole_batch(tiny_era5, tmp_path, knobs):
    single = tiny(tiny_era5, tmp_path / "one", "train.num_epochs=1", *knobs)
    train(single)
    results = run_ranks(2, train_rank, tiny_era5, tmp_path / "two", ("train.num_epochs=1", *knobs))
    assert [status for status, _ in results] == [0, 0]
    expected, actual = checkpoint(tmp_path / "one"), checkpoint(tmp_path / "two")
    assert actual["meta"]["world_size"] == 2 and actual["meta"]["global_batch_size"] == 4
    weights = {k: v.numpy() for k, v in expected["model"].items()}
    assert_close_weights(weights, {k: v.numpy() for k, v in actual["model"].items()}, "checkpoint")
    assert_close_weights(results[0][1], results[1][1], "rank 1 vs rank 0")
    (one,), (two,) = expected["progress"]["history"], actual["progress"]["history"]
    assert two["train_loss"] == pytest.approx(one["train_loss"], rel=1e-5)  # the loss of the global batch
    assert two["val_loss"] == pytest.approx(one["val_loss"], rel=1e-5)  # validation summed over both ranks


def test_noddp_leaves_the_ranks_diverged(tiny_era5, tmp_path):
    results = run_ranks(2, train_rank, tiny_era5, tmp_path, ("train.num_epochs=1", "parallel.noddp=true"))
    first, second = results[0][1], results[1][1]
    assert any(not np.allclose(first[key], second[key]) for key in first)


@pytest.mark.slow
def test_a_signal_on_one_rank_stops_both_and_the_run_continues_on_one_rank(tiny_era5, tmp_path):
    expdir = tmp_path / "resumed"
    overrides = ("parallel.stop_check_every=2", "log.rank_logs=true")
    results = run_ranks(2, train_rank, tiny_era5, expdir, overrides, 3)
    assert [status for status, _ in results] == [0, 0]
    rank_log = (expdir / "tiny" / "00" / "ranks" / "rank1.log").read_text()
    assert "Joined the gloo process group" in rank_log and "rank 1 of 2" in rank_log
    assert not (expdir / "tiny" / "00" / "ranks" / "rank0.log").exists()  # rank 0 writes out.log
    saved = checkpoint(expdir)
    assert saved["progress"]["global_step"] == 4  # the next agreement point after the signal at step 3
    assert not saved["progress"]["completed"]

    train(tiny(tiny_era5, expdir))  # the same run, now on 1 process
    reference = tiny(tiny_era5, tmp_path / "reference")
    train(reference)
    expected, actual = checkpoint(tmp_path / "reference"), checkpoint(expdir)
    assert actual["progress"]["completed"]
    assert_close_weights(
        {k: v.numpy() for k, v in expected["model"].items()},
        {k: v.numpy() for k, v in actual["model"].items()},
        "resumed on 1 rank",
    )
    assert [r["val_loss"] for r in actual["progress"]["history"]] == pytest.approx(
        [r["val_loss"] for r in expected["progress"]["history"]], rel=1e-5
    )


@pytest.mark.slow
def test_dataparallel_mode_is_one_process_and_refuses_a_multi_process_launch(tiny_era5, tmp_path, caplog):
    plain = tiny(tiny_era5, tmp_path / "plain", "train.num_epochs=1")
    single = tiny(tiny_era5, tmp_path / "dp", "train.num_epochs=1", "parallel.data_parallel=dataparallel")
    train(plain)
    train(single)  # no GPUs to split over here: it trains exactly like the plain model
    for key, value in checkpoint(tmp_path / "plain")["model"].items():
        assert np.array_equal(value.numpy(), checkpoint(tmp_path / "dp")["model"][key].numpy()), key
    with pytest.raises(ConfigError, match="drives all GPUs from one process, but 2 processes"):
        wrap_data_parallel(
            torch.nn.Linear(2, 2), single.parallel, ProcessInfo(rank=0, world_size=2), Device("cpu")
        )


def future_warnings_of_wrapping(rank: int) -> list[str]:
    """The FutureWarnings that wrapping a model with buffers in DDP emits on this rank, both buffer modes."""
    import warnings

    import torch.distributed as dist

    from dlscale.parallel.parallel_config import ParallelConfig

    dist.init_process_group("gloo")
    try:
        process = ProcessInfo(rank=rank, world_size=dist.get_world_size())
        model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for disable in (False, True):
                cfg = ParallelConfig(disable_broadcast_buffers=disable)
                wrapped = wrap_data_parallel(model, cfg, process, Device("cpu"))
                assert isinstance(wrapped, torch.nn.parallel.DistributedDataParallel)
        return [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    finally:
        dist.destroy_process_group()


def test_wrapping_in_ddp_prints_no_future_warning():
    assert run_ranks(2, future_warnings_of_wrapping) == [[], []]


@pytest.mark.slow
def test_a_one_rank_checkpoint_continues_on_two_ranks(tiny_era5, tmp_path):
    expdir = tmp_path / "grown"
    train(tiny(tiny_era5, expdir), extra_observers=[StopAtStep(5)])  # mid-epoch, on one process
    assert checkpoint(expdir)["progress"]["global_step"] == 5
    results = run_ranks(2, train_rank, tiny_era5, expdir, ())
    assert [status for status, _ in results] == [0, 0]
    reference = tmp_path / "reference"
    train(tiny(tiny_era5, reference))
    expected, actual = checkpoint(reference), checkpoint(expdir)
    assert actual["progress"]["completed"] and actual["meta"]["world_size"] == 2
    assert_close_weights(
        {k: v.numpy() for k, v in expected["model"].items()},
        {k: v.numpy() for k, v in actual["model"].items()},
        "grown from 1 to 2 ranks",
    )
    assert [r["val_loss"] for r in actual["progress"]["history"]] == pytest.approx(
        [r["val_loss"] for r in expected["progress"]["history"]], rel=1e-5
    )


# A device name the peak table knows, so that a CPU run reports an MFU; fp32 is the precision of these runs.
KNOWN_GPU, KNOWN_PRECISION = "NVIDIA H100 80GB HBM3", "fp32"


class KnownPeakAndReports(Observer):
    """Gives the run a device of known peak (same FLOPs per sample) and keeps each epoch's report."""

    def __init__(self):
        self.flops_per_sample: float | None = None
        self.reports: list[dict] = []

    def on_train_start(self, trainer) -> None:
        self.flops_per_sample = trainer.setup.utilization.flops_per_sample
        trainer.setup.utilization = Utilization(self.flops_per_sample, KNOWN_GPU, KNOWN_PRECISION)

    def on_epoch_end(self, trainer, report) -> None:
        self.reports.append(
            {
                "steps": report.steps,
                "train_seconds": report.train_seconds,
                "samples_per_second": report.samples_per_second,
                "tflops_per_gpu": report.tflops_per_gpu,
                "mfu": report.mfu,
            }
        )


def train_rank_with_known_peak(rank: int, data: Path, expdir: Path) -> tuple[int, float | None, list[dict]]:
    observer = KnownPeakAndReports()
    status = train(tiny(data, expdir, "train.num_epochs=2"), extra_observers=[observer])
    return status, observer.flops_per_sample, observer.reports


def test_two_ranks_report_global_samples_per_second_and_per_gpu_tflops_and_mfu(tiny_era5, tmp_path):
    world_size = 2
    results = run_ranks(world_size, train_rank_with_known_peak, tiny_era5, tmp_path)
    assert [status for status, _, _ in results] == [0, 0]
    global_batch = tiny(tiny_era5, tmp_path).train.global_batch_size
    peak_flops = peak_tflops(KNOWN_GPU, KNOWN_PRECISION) * 1e12
    _, flops_per_sample, reports = results[0]
    assert len(reports) == 2
    run = tmp_path / "tiny" / "00"
    history = json.loads((run / "summary.json").read_text())["history"]
    steps_at_epoch_end = [0] + [row["global_step"] for row in history]
    for report, before, after in zip(reports, steps_at_epoch_end[:-1], steps_at_epoch_end[1:], strict=True):
        assert report["steps"] == after - before > 0 and report["train_seconds"] > 0
        # samples/s counts the global batch: every rank's samples, not only this rank's
        assert report["samples_per_second"] * report["train_seconds"] == pytest.approx(
            report["steps"] * global_batch, rel=1e-9
        )
        # TFLOP/s and MFU are those of ONE GPU: its share of the global throughput
        per_gpu = report["samples_per_second"] / world_size
        assert report["tflops_per_gpu"] == pytest.approx(per_gpu * flops_per_sample / 1e12, rel=1e-9)
        assert report["mfu"] == pytest.approx(report["tflops_per_gpu"] * 1e12 / peak_flops, rel=1e-9)

    keys = ("train_seconds", "samples_per_second", "tflops_per_gpu", "mfu")
    assert [{k: row[k] for k in keys} for row in history] == [{k: r[k] for k in keys} for r in reports]
    log = (run / "out.log").read_text()
    logged = [
        float(x) for x in re.findall(r"Time taken for epoch \d+ is \S+ sec, avg (\S+) samples/sec", log)
    ]
    assert logged == pytest.approx([r["samples_per_second"] for r in reports], abs=1e-6)  # printed with %f
    # The ranks are CPU processes (the known GPU peak is faked), and the line says so.
    performance = re.findall(r"Performance: (\S+) TFLOP/s per CPU process, MFU (\S+)%", log)
    assert performance == [(f"{r['tflops_per_gpu']:.4g}", f"{100 * r['mfu']:.1f}") for r in reports]
    assert "per GPU" not in log and "tf32" not in log
    # The efficiency report spreads what the ranks measured; GPU readings nobody took are not printed as NaN.
    assert "across ranks input_wait_s_per_step" in log and "across ranks mean_power_w" not in log
    assert not re.search(r"\bnan\b", log, flags=re.IGNORECASE)
