"""The U-Net workload end to end on generated data: it learns, bench and DDP run on it, and bf16 and torch.compile
follow the eager fp32 losses."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from bench_records import only_bench_record
from follows_eager import Losses, assert_follows_eager, train_and_keep_losses
from run_configs import tiny_run_config
from test_training_run import StopAtStep

from dlscale.checkpoint.files import load_checkpoint
from dlscale.cli import main
from dlscale.data.cosmo.synth import generate
from dlscale.run.training import train
from dlscale.runtime.local_ranks import run_ranks
from dlscale.training.observer import Observer

CONFIG_FILE = Path(__file__).resolve().parents[2] / "configs" / "unet_cosmo.yaml"


@pytest.fixture(scope="session")
def tiny_cosmo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate(tmp_path_factory.mktemp("data") / "cosmo_tiny", "tiny")


tiny = partial(tiny_run_config, CONFIG_FILE)  # tiny(data, expdir, *overrides, name="tiny", **flags)


class KeepReports(Observer):
    """The epoch reports of the run in this process."""

    def __init__(self):
        self.reports = []

    def on_epoch_end(self, trainer, report) -> None:
        self.reports.append(report)


def train_and_report(cfg) -> list:
    keep = KeepReports()
    assert train(cfg, extra_observers=[keep]) == 0
    return keep.reports


@pytest.mark.slow
def test_the_unet_learns_far_better_than_predicting_zeros(tiny_cosmo, tmp_path):
    # 2 epochs of 256 random crops, 64 steps of 4, about 5 s.
    cfg = tiny(tiny_cosmo, tmp_path, "Nsamples=256", "Nsamples_val=16", "lr=4E-3", "warmup=8")
    reports = train_and_report(cfg)
    assert len(reports) == 2
    validation = reports[-1].validation
    zeros = validation.baseline_scalars["L1"]
    assert 0.2 < zeros < 0.3  # mean |target| of the synthetic gas fields
    assert validation.scalars["L1"] < 0.5 * zeros, validation.lines
    assert reports[-1].train_loss < reports[0].train_loss
    assert (Path(cfg.log.expdir) / "tiny" / "00" / "figures" / "prediction_vs_target.png").is_file()


def test_dlscale_bench_runs_on_the_unet(tiny_cosmo, tmp_path, capsys):
    command = ["bench", "--yaml_config", str(CONFIG_FILE), "--config", "tiny", "--set", f"data.root={tiny_cosmo}",
               "--set", f"log.expdir={tmp_path}", "--set", "log.tensorboard=false", "--progress", "none",
               "--nbatches", "2", "--ntrials", "1", "--nwarmup", "0", "--data_loader_config", "gpu"]  # fmt: skip
    assert main(command) == 0
    out = capsys.readouterr().out
    assert sum("BENCHY::SUMMARY::" in line for line in out.splitlines()) == 3
    assert only_bench_record(tmp_path / "tiny" / "00").is_file()


SMALL_EPOCH = ("Nsamples=8", "Nsamples_val=4", "num_epochs=1")  # 2 steps of 4
SWITCHES = {"bf16": {"train.amp_mode": "bf16"}, "compiled": {"train.enable_jit": True}}


@pytest.fixture(scope="module")
def eager_losses(tiny_cosmo, tmp_path_factory) -> Losses:
    """The small epoch eagerly in fp32: what the bf16 and the compiled run are compared with."""
    expdir = tmp_path_factory.mktemp("eager")
    return train_and_keep_losses(tiny(tiny_cosmo, expdir, *SMALL_EPOCH), expdir / "tiny" / "00")


@pytest.mark.slow
@pytest.mark.parametrize("switch", list(SWITCHES))
def test_bf16_and_compiled_epochs_follow_the_eager_losses(tiny_cosmo, tmp_path, eager_losses, switch):
    cfg = tiny(tiny_cosmo, tmp_path, *SMALL_EPOCH, **SWITCHES[switch])
    assert_follows_eager(train_and_keep_losses(cfg, tmp_path / "tiny" / "00"), eager_losses, switch)


@pytest.mark.slow
def test_a_run_stopped_mid_epoch_resumes_onto_the_same_crops(tiny_cosmo, tmp_path):
    # 2 epochs of 4 steps; stopped after step 6 (mid-epoch 2, whose crops differ from epoch 1's).
    resumed, straight = tiny(tiny_cosmo, tmp_path / "resumed"), tiny(tiny_cosmo, tmp_path / "straight")
    assert train(resumed, extra_observers=[StopAtStep(6)]) == 0
    assert train(resumed) == 0
    assert train(straight) == 0
    a, b = (
        load_checkpoint(Path(c.log.expdir) / "tiny" / "00" / "checkpoints" / "ckpt_latest.pt")
        for c in (resumed, straight)
    )
    assert a["progress"]["global_step"] == b["progress"]["global_step"] == 8
    for key, value in b["model"].items():
        assert torch.equal(a["model"][key], value), key


def train_rank(rank: int, data: Path, expdir: Path, overrides: tuple[str, ...]) -> int:
    return train(tiny(data, expdir, *overrides))


@pytest.mark.slow
def test_two_ranks_train_like_one_rank_with_the_whole_batch(tiny_cosmo, tmp_path):
    # gpu pipeline with device-side rotations, fresh crops per epoch, a density term in the loss
    overrides = ("num_epochs=1", "Nsamples=8", "data_loader_config=gpu", "lambda_rho=0.01")
    train(tiny(tiny_cosmo, tmp_path / "one", *overrides))
    assert run_ranks(2, train_rank, tiny_cosmo, tmp_path / "two", overrides) == [0, 0]
    one, two = (
        load_checkpoint(tmp_path / n / "tiny" / "00" / "checkpoints" / "ckpt_latest.pt")
        for n in ("one", "two")
    )
    assert two["meta"]["world_size"] == 2
    for key, value in one["model"].items():  # no BatchNorm: the same samples give the same gradients
        np.testing.assert_allclose(
            two["model"][key].numpy(), value.numpy(), rtol=1e-4, atol=1e-6, err_msg=key
        )
    (first,), (second,) = one["progress"]["history"], two["progress"]["history"]
    assert second["train_loss"] == pytest.approx(first["train_loss"], rel=1e-5)
    assert second["val_loss"] == pytest.approx(first["val_loss"], rel=1e-5)
