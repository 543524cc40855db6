"""The run's guards on 2 gloo ranks: every rank agrees on a divergence, skips the same steps, and learns that
the run directory is held by another run (rank 0 holds the lock; nobody waits for a run that never starts)."""

from __future__ import annotations

import shutil
from functools import partial
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from forked_ranks import run_ranks
from run_configs import tiny_run_config

from dlscale.checkpoint.files import load_checkpoint
from dlscale.errors import DlscaleError
from dlscale.run.training import train
from dlscale.runtime.device import Device
from dlscale.runtime.distributed import start_process_group, stop_process_group
from dlscale.runtime.launch import detect_process
from dlscale.runtime.run_lock import RunDirectoryLock
from dlscale.training.divergence.nonfinite import NonFiniteWatch
from dlscale.training.observer import Observer

CONFIG_FILE = Path(__file__).resolve().parents[2] / "configs" / "vit_era5.yaml"


tiny = partial(tiny_run_config, CONFIG_FILE)  # tiny(data, expdir, *overrides, name="tiny", **flags)


@pytest.fixture(scope="module")
def nan_era5(tmp_path_factory, tiny_era5: Path) -> Path:
    root = tmp_path_factory.mktemp("nan_data") / "era5"
    shutil.copytree(tiny_era5, root)
    with h5py.File(sorted((root / "train").glob("*.h5"))[0], "r+") as f:
        f["fields"][3, 0, 0, 0] = float("nan")
    return root


class KeepWeights(Observer):
    weights: dict[str, np.ndarray] = {}

    def on_train_end(self, trainer, outcome: str) -> None:
        KeepWeights.weights = {
            k: v.detach().cpu().numpy() for k, v in trainer.setup.model.state_dict().items()
        }


def train_rank(rank: int, data: Path, expdir: Path, overrides: tuple[str, ...]):
    """(exit status, message, final weights) of this rank's run."""
    try:
        status, message = train(tiny(data, expdir, *overrides), extra_observers=[KeepWeights()]), ""
    except DlscaleError as exc:
        status, message = exc.exit_code, str(exc)
    return status, message, KeepWeights.weights


def test_every_rank_stops_at_the_same_divergence(nan_era5, tmp_path):
    results = run_ranks(2, train_rank, nan_era5, tmp_path, ())
    (status0, message0, _), (status1, message1, _) = results
    assert status0 == status1 == 3
    step = message0.split("at step ")[1].split(":")[0]
    assert f"at step {step}:" in message1
    assert not list((tmp_path / "tiny" / "00" / "checkpoints").glob("*.pt"))


@pytest.mark.slow
def test_two_ranks_skip_the_steps_one_rank_skips_and_end_alike(nan_era5, tmp_path):
    overrides = ("train.on_nonfinite=skip", "train.num_epochs=1")
    train_rank(0, nan_era5, tmp_path / "one", overrides)
    one = load_checkpoint(tmp_path / "one" / "tiny" / "00" / "checkpoints" / "ckpt_latest.pt")
    results = run_ranks(2, train_rank, nan_era5, tmp_path / "two", overrides)
    two = load_checkpoint(tmp_path / "two" / "tiny" / "00" / "checkpoints" / "ckpt_latest.pt")
    assert [r[0] for r in results] == [0, 0]
    assert two["progress"]["skipped_steps"] == one["progress"]["skipped_steps"] > 0
    for key, value in one["model"].items():
        np.testing.assert_allclose(
            two["model"][key].numpy(), value.numpy(), rtol=1e-4, atol=2e-6, err_msg=key
        )
        np.testing.assert_array_equal(
            results[0][2][key], results[1][2][key], err_msg=f"replicas differ: {key}"
        )


def test_a_held_run_directory_stops_every_rank_at_once(tiny_era5, tmp_path):
    cfg = tiny(tiny_era5, tmp_path)
    holder = RunDirectoryLock(Path(cfg.log.expdir) / "tiny" / "00", environ={})
    holder.acquire()
    try:
        results = run_ranks(2, train_rank, tiny_era5, tmp_path, (), timeout_s=60)
    finally:
        holder.release()
    (status0, message0, _), (status1, message1, _) = results
    assert status0 == status1 == 75
    assert "is in use by another run" in message0 and "is in use by another run" in message1
    assert message1.startswith("rank 1: ")


def watch_rank(rank: int, bad_step_on_rank1: int) -> tuple[int, float | None] | None:
    """Record 4 steps, with a NaN loss at ``bad_step_on_rank1`` on rank 1 only; return what poll agrees on."""
    process = detect_process()
    device = Device("cpu")
    start_process_group(process, device, 60)
    try:
        watch = NonFiniteWatch(device.torch, check_every=4)
        for step in range(4):
            bad = rank == 1 and step >= bad_step_on_rank1
            watch.record(torch.tensor(float("nan") if bad else 1.0), None, step)
        found = watch.poll()
        return None if found is None else (found[0], found[1])
    finally:
        stop_process_group()


def test_the_non_finite_record_is_agreed_by_all_ranks():
    results = run_ranks(2, watch_rank, 2, timeout_s=60)
    assert results[0] == (2, None)  # rank 0 saw nothing itself, but learns the step
    assert results[1][0] == 2 and np.isnan(results[1][1])
