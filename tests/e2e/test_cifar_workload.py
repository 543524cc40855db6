"""The CIFAR-100 ResNet workload end to end on generated data: it learns, bench, bf16 and DDP on 2 CPU ranks run on
it, and bf16 follows the eager fp32 losses."""

from __future__ import annotations

import json
import math
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from bench_records import only_bench_record
from follows_eager import Losses, assert_follows_eager, train_and_keep_losses
from run_configs import tiny_run_config

from dlscale.checkpoint.files import load_checkpoint
from dlscale.cli import main
from dlscale.data.cifar.synth import PRESETS, write_synthetic_cifar
from dlscale.run.training import train
from dlscale.runtime.local_ranks import run_ranks
from dlscale.training.observer import Observer

CONFIG_FILE = Path(__file__).resolve().parents[2] / "configs" / "resnet_cifar.yaml"
CHANCE = 0.01  # 100 balanced classes


@pytest.fixture(scope="module")
def tiny_cifar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `tiny` preset: 2000 training and 500 test images, 20 and 5 per class."""
    return write_synthetic_cifar(
        tmp_path_factory.mktemp("data") / "cifar_tiny", PRESETS["tiny"], lambda _: None
    )


tiny = partial(tiny_run_config, CONFIG_FILE)  # tiny(data, expdir, *overrides, name="tiny", **flags)


def history(expdir: Path) -> list[dict]:
    return load_checkpoint(expdir / "tiny" / "00" / "checkpoints" / "ckpt_latest.pt")["progress"]["history"]


@pytest.mark.slow
def test_tiny_config_learns_far_above_chance_and_the_majority_class(tiny_cifar, tmp_path):
    assert train(tiny(tiny_cifar, tmp_path)) == 0
    first, last = history(tmp_path)
    assert last["headline"] == "accuracy" and last["baseline"] == "majority class"
    assert last["baseline_headline"] == pytest.approx(CHANCE)  # a balanced test split
    assert last["headline_value"] > 10 * CHANCE
    assert last["val_loss"] < first["val_loss"] < math.log(100)
    log = (tmp_path / "tiny" / "00" / "out.log").read_text()
    assert "Model: ResNet-18 with 183,212 parameters" in log
    assert "Val accuracy=" in log and "chance 1.00%" in log


def test_dlscale_bench_runs_on_the_workload(tiny_cifar, tmp_path, capsys):
    command = ["bench", "--yaml_config", str(CONFIG_FILE), "--config", "tiny", "--set", f"data.root={tiny_cifar}",
               "--set", f"log.expdir={tmp_path}", "--set", "log.tensorboard=false", "--progress", "none",
               "--nbatches", "2", "--ntrials", "1", "--nwarmup", "0"]  # fmt: skip
    assert main(command) == 0
    assert "BENCHY::SUMMARY::FULL average trial throughput" in capsys.readouterr().out
    record = json.loads(only_bench_record(tmp_path / "tiny" / "00").read_text())
    assert all(len(record[test]["trial_throughput"]) == 1 for test in ("IO", "SYNTHETIC", "FULL"))


# One small epoch (2 steps of 32, 32 validation images).
SMALL_EPOCH = ("train.num_epochs=1", "data.limit_nsamples=64", "data.limit_nsamples_val=32")
# bf16 only. torch.compile takes the same path in dlscale for every workload (run/assembly.py compiles the model
# after the pre-flight check, which runs on the plain model); the MNIST and U-Net e2e tests and
# tests/training/test_precision.py hold it. ResNet-18's train and eval graphs cost 50-80 s of C++ builds on
# a cold CI machine, the suite's most expensive test, for no path of dlscale's that the others miss.
SWITCHES = {"bf16": "train.amp_mode=bf16"}


@pytest.fixture(scope="module")
def eager_losses(tiny_cifar, tmp_path_factory) -> Losses:
    """The small epoch eagerly in fp32: what the bf16 run is compared with."""
    expdir = tmp_path_factory.mktemp("eager")
    return train_and_keep_losses(tiny(tiny_cifar, expdir, *SMALL_EPOCH), expdir / "tiny" / "00")


@pytest.mark.slow
@pytest.mark.parametrize("switch", list(SWITCHES))
def test_bf16_epochs_follow_the_eager_losses(tiny_cifar, tmp_path, eager_losses, switch):
    cfg = tiny(tiny_cifar, tmp_path, *SMALL_EPOCH, SWITCHES[switch])
    assert_follows_eager(train_and_keep_losses(cfg, tmp_path / "tiny" / "00"), eager_losses, switch)


# ---- DDP on 2 forked CPU ranks ------------------------------------------------------------------------------


class KeepState(Observer):
    """This rank's final parameters and buffers (only rank 0 writes checkpoints)."""

    state: dict[str, dict[str, np.ndarray]] = {}

    def on_train_end(self, trainer, outcome: str) -> None:
        model = trainer.setup.model
        KeepState.state = {
            "parameters": {k: v.detach().cpu().numpy() for k, v in model.named_parameters()},
            "buffers": {k: v.detach().cpu().numpy() for k, v in model.named_buffers()},
        }


def train_rank(rank: int, data: Path, expdir: Path) -> tuple[int, dict]:
    status = train(tiny(data, expdir), extra_observers=[KeepState()])
    return status, KeepState.state


@pytest.fixture(scope="module")
def two_ranks(tiny_cifar, tmp_path_factory) -> tuple[list, Path]:
    """Two DDP ranks training the tiny config (global batch 32 = 2 x 16), their final states, and the runs."""
    expdir = tmp_path_factory.mktemp("ddp")
    return run_ranks(2, train_rank, tiny_cifar, expdir), expdir


@pytest.mark.slow
def test_ddp_ranks_keep_identical_weights_and_the_run_learns(two_ranks):
    results, expdir = two_ranks
    assert [status for status, _ in results] == [0, 0]
    first, second = (state for _, state in results)
    for name, value in first["parameters"].items():
        assert np.array_equal(value, second["parameters"][name]), name  # averaged gradients: the same steps
    counts = [name for name in first["buffers"] if name.endswith("num_batches_tracked")]
    assert len(counts) == 20 and all(
        np.array_equal(first["buffers"][n], second["buffers"][n]) for n in counts
    )
    saved = load_checkpoint(expdir / "tiny" / "00" / "checkpoints" / "ckpt_latest.pt")
    assert saved["meta"]["world_size"] == 2 and saved["meta"]["global_batch_size"] == 32
    last = saved["progress"]["history"][-1]
    assert last["headline_value"] > 8 * CHANCE and last["val_loss"] < math.log(100)


def test_ddp_ranks_validate_with_the_same_batchnorm_statistics(two_ranks):
    results, _ = two_ranks
    first, second = (state for _, state in results)
    for name, value in first["buffers"].items():
        assert np.array_equal(value, second["buffers"][name]), name
