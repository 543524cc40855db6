"""Sharded checkpoints on one process: the directory, its header written last, what a damaged or interrupted one
says, the safe reading of DCP's metadata, rotation, and when a run writes them."""

from __future__ import annotations

import errno
import os
import pickle
import time
from pathlib import Path

import pytest
import torch

from dlscale.checkpoint.checkpoint_config import SHARDED_ABOVE_BYTES, CheckpointConfig
from dlscale.checkpoint.directory import CheckpointDir
from dlscale.checkpoint.distributed_state import in_serial_coordinates, load_model_shards, model_tensors
from dlscale.checkpoint.files import load_checkpoint, save_checkpoint
from dlscale.checkpoint.resume import load_for_resume
from dlscale.checkpoint.sharded_files import DCP_METADATA_NAME, HEADER_NAME, is_complete
from dlscale.checkpoint.sharded_writer import ShardedCheckpointWriter
from dlscale.errors import CheckpointError, InvalidValue, StorageError
from dlscale.parallel.shard_specs import ShardSpec
from dlscale.runtime.device import Device

CPU = Device("cpu")


def header(step: int) -> dict:
    return {
        "optimizer": {"state": {0: {"note": "kept"}}, "param_groups": [{"lr": 0.1, "params": [0]}]},
        "progress": {"global_step": step, "epoch": 1},
        "meta": {"workload": "era5_vit"},
        "sharded": {"writer": "torch.distributed.checkpoint", "tensors": 3},
    }


def tensors(step: int) -> dict[str, torch.Tensor]:
    return {
        "model.layer.weight": torch.full((3, 4), float(step)),
        "model.layer.bias": torch.arange(3.0) + step,
        "optimizer.0.exp_avg": torch.full((3, 4), -float(step)),
    }


def save(
    directory: Path, steps: list[int], keep_last: int = 0, asynchronous: bool = False, best=()
) -> CheckpointDir:
    checkpoints = CheckpointDir(directory, keep_last=keep_last)
    writer = ShardedCheckpointWriter(checkpoints, is_main=True, asynchronous=asynchronous, device=CPU)
    for step in steps:
        writer.save(tensors(step), header(step), step, is_best=step in best)
    writer.close()
    return checkpoints


def test_a_sharded_checkpoint_loads_as_the_single_file_format_holds_it(tmp_path):
    checkpoints = save(tmp_path, [4])
    payload = load_checkpoint(checkpoints.latest_path)
    assert checkpoints.latest_path == tmp_path / "ckpt_latest" and payload["progress"]["global_step"] == 4
    assert torch.equal(payload["model"]["layer.weight"], torch.full((3, 4), 4.0))
    state = payload["optimizer"]["state"][0]
    assert state["note"] == "kept" and torch.equal(state["exp_avg"], torch.full((3, 4), -4.0))
    assert payload["optimizer"]["param_groups"] == [{"lr": 0.1, "params": [0]}]
    without = load_checkpoint(checkpoints.latest_path, optimizer=False)
    assert "exp_avg" not in without["optimizer"]["state"][0] and "layer.bias" in without["model"]


def test_background_saves_are_published_in_order_and_rotated(tmp_path):
    checkpoints = save(tmp_path, [1, 2, 3, 4, 5], keep_last=2, asynchronous=True, best=(2,))
    assert [d.name for d in checkpoints.numbered_directories()] == [
        "ckpt_step00000002", "ckpt_step00000004", "ckpt_step00000005",
    ]  # fmt: skip
    assert checkpoints.latest_path.resolve().name == "ckpt_step00000005"
    assert checkpoints.best_path.resolve().name == "ckpt_step00000002"
    assert load_checkpoint(checkpoints.best_path)["progress"]["global_step"] == 2
    assert all(is_complete(d) for d in checkpoints.numbered_directories())


def test_an_interrupted_save_is_refused_and_the_loadable_ones_are_named(tmp_path):
    checkpoints = save(tmp_path, [1, 2], keep_last=2)
    latest = checkpoints.latest_path.resolve()
    (latest / HEADER_NAME).unlink()  # as if killed between the shards and the header
    with pytest.raises(CheckpointError, match=r"incomplete sharded checkpoint \(no dlscale_state.pt\)"):
        load_checkpoint(latest)
    with pytest.raises(CheckpointError) as refused:
        load_for_resume(checkpoints.latest_path, checkpoints)
    assert "ckpt_step00000001 (epoch 1, global step 1)" in str(refused.value)
    assert "--resume" in str(refused.value)


def test_damaged_shards_are_a_checkpoint_error_naming_the_directory(tmp_path):
    checkpoints = save(tmp_path, [3])
    shard = next(checkpoints.latest_path.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:40])
    with pytest.raises(CheckpointError, match="its shards cannot be read"):
        load_checkpoint(checkpoints.latest_path)


class RunsCode:
    """A pickle that would run code when unpickled (it would create the file ``marker``)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def through_an_allowed_module(marker: Path) -> bytes:
    """A pickle calling ``os.system`` reached as an attribute of DCP's filesystem module (which imports os)."""
    command = f"touch {marker}".encode()
    module, name = b"torch.distributed.checkpoint.filesystem", b"os.system"
    return (
        b"\x80\x04" + b"\x8c" + bytes([len(module)]) + module + b"\x8c" + bytes([len(name)]) + name + b"\x93"
        + b"\x8c" + bytes([len(command)]) + command + b"\x85R."
    )  # fmt: skip


@pytest.mark.parametrize("payload", [lambda m: pickle.dumps(RunsCode(m)), through_an_allowed_module])
def test_dcp_metadata_is_unpickled_with_its_own_classes_only(tmp_path, payload):
    checkpoints = save(tmp_path, [3])
    marker = tmp_path / "code-ran"
    (checkpoints.latest_path / DCP_METADATA_NAME).write_bytes(payload(marker))
    with pytest.raises(CheckpointError, match="accepts DCP's metadata classes only"):
        load_checkpoint(checkpoints.latest_path)
    assert not marker.exists()


def test_a_failed_write_names_the_directory_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    from torch.distributed.checkpoint import filesystem

    checkpoints = save(tmp_path, [1])

    def disk_full(self, plan, planner):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(filesystem.FileSystemWriter, "write_data", disk_full)
    writer = ShardedCheckpointWriter(checkpoints, is_main=True, asynchronous=False, device=CPU)
    with pytest.raises(StorageError, match="ckpt_step00000002.*stays the latest checkpoint"):
        writer.save(tensors(2), header(2), 2, is_best=False)
    assert load_checkpoint(checkpoints.latest_path)["progress"]["global_step"] == 1


class KilledBeforeTheHeader(BaseException):
    """A kill -9 between the shards and the header, raised where the header would be written."""


def test_a_kill_before_the_header_leaves_the_pointers_on_the_previous_complete_checkpoint(
    tmp_path, monkeypatch
):
    from dlscale.checkpoint import sharded_writer

    checkpoints = save(tmp_path, [1], best=(1,))

    def killed(directory, header):
        raise KilledBeforeTheHeader

    monkeypatch.setattr(sharded_writer, "write_header", killed)
    writer = ShardedCheckpointWriter(checkpoints, is_main=True, asynchronous=False, device=CPU)
    with pytest.raises(KilledBeforeTheHeader):
        writer.save(tensors(2), header(2), 2, is_best=True)
    interrupted = tmp_path / "ckpt_step00000002"
    assert (interrupted / DCP_METADATA_NAME).is_file() and not is_complete(interrupted)  # no header
    # Neither pointer moved to the incomplete directory: both still load step 1.
    assert (
        checkpoints.latest_path.resolve().name == checkpoints.best_path.resolve().name == "ckpt_step00000001"
    )
    assert load_checkpoint(checkpoints.latest_path)["progress"]["global_step"] == 1
    assert load_checkpoint(checkpoints.best_path)["progress"]["global_step"] == 1


def test_the_newer_of_a_file_and_a_sharded_latest_checkpoint_is_read(tmp_path):
    checkpoints = save(tmp_path, [2])
    assert checkpoints.latest_path.name == "ckpt_latest"
    time.sleep(0.01)
    save_checkpoint({"progress": {"global_step": 3}}, tmp_path / "ckpt_latest.pt")
    assert checkpoints.latest_path.name == "ckpt_latest.pt"
    os.utime(tmp_path / "ckpt_latest.pt", (1, 1))
    assert checkpoints.latest_path.name == "ckpt_latest"


def test_when_a_run_writes_sharded_checkpoints():
    auto = CheckpointConfig()
    assert not auto.sharded(model_sharded=False, processes=8, checkpoint_bytes=SHARDED_ABOVE_BYTES)
    assert auto.sharded(model_sharded=False, processes=2, checkpoint_bytes=SHARDED_ABOVE_BYTES + 1)
    assert not auto.sharded(model_sharded=False, processes=1, checkpoint_bytes=10 * SHARDED_ABOVE_BYTES)
    assert auto.sharded(model_sharded=True, processes=2, checkpoint_bytes=1)
    assert CheckpointConfig(async_save=True).sharded(False, 1, 1)
    assert not CheckpointConfig(format="file").sharded(True, 8, 10 * SHARDED_ABOVE_BYTES)
    assert CheckpointConfig(format="dcp").sharded(False, 1, 1)
    with pytest.raises(InvalidValue, match="async_save"):
        CheckpointConfig(format="file", async_save=True)
    with pytest.raises(InvalidValue, match="'auto', 'file' or 'dcp'"):
        CheckpointConfig(format="zip")


def test_uneven_tensor_parallel_shards_are_refused_with_the_way_out():
    spec = ShardSpec(dim=0, sizes=(3, 3, 2, 2), index=0, group=None)  # torch.chunk would cut 3, 3, 3, 1
    with pytest.raises(CheckpointError, match=r"sizes \[3, 3, 2, 2\].*checkpoint.format: file"):
        in_serial_coordinates(torch.zeros(3, 4), spec, "blocks.0.fc1.weight")


def test_a_step_saved_again_gets_a_directory_of_its_own(tmp_path):
    """A run continued from an earlier checkpoint of its own reaches the latest one's step again: the new save
    must not write into the directory that is still the latest checkpoint."""
    checkpoints = save(tmp_path, [5], best=(5,))
    save(tmp_path, [5])
    assert checkpoints.latest_path.resolve().name == "ckpt_step00000005-1"
    assert checkpoints.best_path.resolve().name == "ckpt_step00000005"
    assert [d.name for d in checkpoints.numbered_directories()] == [
        "ckpt_step00000005",
        "ckpt_step00000005-1",
    ]
    assert load_checkpoint(checkpoints.latest_path)["progress"]["global_step"] == 5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.gpu
def test_background_saves_of_gpu_tensors_stage_through_pinned_memory(tmp_path):
    checkpoints = CheckpointDir(tmp_path)
    writer = ShardedCheckpointWriter(checkpoints, is_main=True, asynchronous=True, device=Device("cuda"))
    on_gpu = {name: value.cuda() for name, value in tensors(7).items()}
    writer.save(on_gpu, header(7), 7, is_best=False)
    for value in on_gpu.values():
        value.add_(1.0)  # the loop goes on changing the weights: the staged copy must not see it
    writer.close()
    payload = load_checkpoint(checkpoints.latest_path)
    assert torch.equal(payload["model"]["layer.weight"], torch.full((3, 4), 7.0))
    assert payload["model"]["layer.weight"].device.type == "cpu"


def test_a_sharded_model_state_must_fit_the_model_as_strictly_as_a_file(tmp_path):
    two_layers = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 2))
    checkpoints = CheckpointDir(tmp_path)
    writer = ShardedCheckpointWriter(checkpoints, is_main=True, asynchronous=False, device=CPU)
    writer.save(model_tensors(two_layers), header(1), 1, is_best=False)
    one_layer = torch.nn.Sequential(torch.nn.Linear(3, 3))
    with pytest.raises(CheckpointError, match=r"unexpected in the checkpoint: 1.bias, 1.weight"):
        load_model_shards(one_layer, checkpoints.latest_path, "ckpt")
    three_layers = torch.nn.Sequential(*two_layers, torch.nn.Linear(2, 2))
    with pytest.raises(CheckpointError, match=r"missing from the checkpoint: 2.bias, 2.weight"):
        load_model_shards(three_layers, checkpoints.latest_path, "ckpt")
    wider = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    with pytest.raises(CheckpointError, match=r"model.0.weight is \(3, 3\) in the checkpoint and \(4, 3\)"):
        load_model_shards(wider, checkpoints.latest_path, "ckpt")
    fresh = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 2))
    load_model_shards(fresh, checkpoints.latest_path, "ckpt")
    loaded, saved = fresh.state_dict(), two_layers.state_dict()
    assert all(torch.equal(loaded[name], saved[name]) for name in saved)
