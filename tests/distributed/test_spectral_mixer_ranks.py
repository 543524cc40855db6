"""The AFNO and SFNO mixers (``model.mixer``) in every training layout, in one fork of 2 gloo ranks: DDP trains
like one process with the whole batch, FSDP2 stopped mid-epoch continues from its sharded (DCP) checkpoint like
one process, and one process stopped and continued is the uninterrupted run bit for bit. Every run is multi-step
training: K = 1 at step 0 and 2 at step 1 (one epoch of 2 steps of 4 samples on the tiny ERA5 data)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from forked_ranks import free_port, run_ranks
from test_data_parallel import StopAtStep, assert_close_weights, tiny
from test_model_parallel import TOLERANCE

from dlscale.checkpoint.directory import CheckpointDir
from dlscale.checkpoint.files import load_checkpoint
from dlscale.report.summary import RunSummary
from dlscale.run.training import train

MIXERS = ("afno", "sfno")
SHORT = (
    "log.tensorboard=false",
    "data.limit_nsamples=8",
    "data.limit_nsamples_val=4",
    "train.num_epochs=1",
    "train.rollout_schedule=step 0=1, 1=2",
)
FSDP = ("parallel.data_parallel=fsdp", "parallel.stop_check_every=1")


def train_mixer(data: Path, expdir: Path, mixer: str, *overrides: str, stop_step: int | None = None) -> int:
    observers = [StopAtStep(stop_step)] if stop_step is not None else []
    cfg = tiny(data, expdir, *SHORT, *overrides, name=f"{mixer}_tiny")
    return train(cfg, extra_observers=observers)


def train_both_layouts(rank: int, data: Path, expdir: Path, ports: list[int]) -> list[int]:
    """On this rank, for each mixer: a DDP run, then an FSDP2 run stopped after step 1 and continued; each run
    starts its process group on a port of its own: after an FSDP2 run (of the attention ViT too), a new group on
    the same port waits forever."""
    runs = [
        (layout, mixer, overrides, stop_step)
        for mixer in MIXERS
        for layout, overrides, stop_step in (("ddp", (), None), ("fsdp", FSDP, 1), ("fsdp", FSDP, None))
    ]
    statuses = []
    for port, (layout, mixer, overrides, stop_step) in zip(ports, runs, strict=True):
        os.environ["MASTER_PORT"] = str(port)
        statuses.append(train_mixer(data, expdir / layout, mixer, *overrides, stop_step=stop_step))
    return statuses


def latest(expdir: Path, mixer: str) -> dict:
    return load_checkpoint(CheckpointDir(expdir / f"{mixer}_tiny" / "00" / "checkpoints").latest_path)


def state(checkpoint: dict) -> dict[str, np.ndarray]:
    return {name: value.numpy() for name, value in checkpoint["model"].items()}


def losses(checkpoint: dict) -> list[tuple[float, float]]:
    return [(row["train_loss"], row["val_loss"]) for row in checkpoint["progress"]["history"]]


@pytest.mark.slow
def test_both_mixers_train_alike_serially_under_ddp_and_fsdp2_and_resume_bitwise(
    tiny_era5, tmp_path, monkeypatch
):
    # The end-of-run figures are two thirds of a run this short and not under test here.
    monkeypatch.setattr(RunSummary, "_write_figures", lambda self, trainer: [])
    ports = [free_port() for _ in range(6)]
    assert run_ranks(2, train_both_layouts, tiny_era5, tmp_path, ports) == [[0] * 6] * 2
    for mixer in MIXERS:
        serial, stopped = tmp_path / "serial", tmp_path / "stopped"
        assert train_mixer(tiny_era5, serial, mixer) == 0
        expected = latest(serial, mixer)
        assert expected["progress"]["global_step"] == 2 and expected["progress"]["completed"]
        log_text = (serial / f"{mixer}_tiny" / "00" / "out.log").read_text()
        assert f"mixer {mixer}" in log_text and "2-step rollout loss" in log_text

        # One process stopped after step 1 (the curriculum's K = 2 starts there) and continued: bit for bit.
        train_mixer(tiny_era5, stopped, mixer, stop_step=1)
        assert latest(stopped, mixer)["progress"]["global_step"] == 1
        assert train_mixer(tiny_era5, stopped, mixer) == 0
        resumed = latest(stopped, mixer)
        assert resumed["progress"]["completed"] and losses(resumed) == losses(expected)
        weights, resumed_weights = state(expected), state(resumed)
        assert weights.keys() == resumed_weights.keys()
        for name, value in weights.items():
            assert np.array_equal(resumed_weights[name], value), f"{mixer}: {name} after the resume"

        # DDP on 2 ranks, and FSDP2 stopped and continued from its shards: the serial run, to rounding.
        fsdp_log = (tmp_path / "fsdp" / f"{mixer}_tiny" / "00" / "out.log").read_text()
        assert "FSDP2: parameters, gradients and optimizer state sharded over 2 rank(s)" in fsdp_log
        assert "ckpt_latest: epoch 1, step 1 of the epoch (global step 1 of 2)" in fsdp_log  # the resume
        for layout in ("ddp", "fsdp"):
            parallel = latest(tmp_path / layout, mixer)
            assert parallel["progress"]["completed"] and parallel["meta"]["layout"].startswith("dp=2 ")
            assert_close_weights(weights, state(parallel), f"{mixer} {layout} vs one process")
            for (train_loss, val_loss), (serial_train, serial_val) in zip(
                losses(parallel), losses(expected), strict=True
            ):
                assert train_loss == pytest.approx(serial_train, rel=TOLERANCE), f"{mixer} {layout}"
                assert val_loss == pytest.approx(serial_val, rel=TOLERANCE), f"{mixer} {layout}"
        shards = CheckpointDir(tmp_path / "fsdp" / f"{mixer}_tiny" / "00" / "checkpoints").latest_path
        assert shards.is_dir() and len(list(shards.glob("*.distcp"))) == 2  # FSDP2 writes sharded checkpoints
