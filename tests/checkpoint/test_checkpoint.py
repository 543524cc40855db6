"""Checkpoints: atomic save, safe load with clear errors, strict model-state loading, RNG capture/restore."""

from __future__ import annotations

import logging
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from dlscale.checkpoint import directory as directory_module
from dlscale.checkpoint import files as ckpt_module
from dlscale.checkpoint.directory import CheckpointDir
from dlscale.checkpoint.files import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_VERSION,
    load_checkpoint,
    load_model_state,
    save_checkpoint,
)
from dlscale.errors import CheckpointError, StorageError
from dlscale.runtime import rng as rng_module
from dlscale.runtime.rng import capture_rng_state, restore_rng_state, seed_everything


class TinyNet(torch.nn.Module):
    def __init__(self, hidden: int = 4):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, hidden, 3)
        self.norm = torch.nn.BatchNorm2d(hidden)
        self.head = torch.nn.Linear(hidden, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.conv(x)).mean(dim=(2, 3)))


class NotPlain:
    """A custom class: the safe loader must refuse to unpickle it."""

    def __init__(self) -> None:
        self.value = 3


def make_payload(global_step: int = 7, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    model = TinyNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(2):  # populate Adam's exp_avg / exp_avg_sq / step
        optimizer.zero_grad()
        model(torch.randn(2, 2, 5, 5)).square().mean().backward()
        optimizer.step()
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": {"last_epoch": 3, "base_lrs": [1e-3]},
        "grad_scaler": None,
        "rng": capture_rng_state(),
        "progress": {"epoch": 1, "step_in_epoch": 2, "global_step": global_step, "best_val": 0.25},
        "config": {"model": {"hidden": 4, "layers": [1, 2]}, "name": "tiny", "amp": False, "x": None},
        "meta": {"dlscale_version": "0.1.0", "torch_version": str(torch.__version__), "world_size": 1},
    }


def assert_same(a, b, where: str = "payload") -> None:
    """Deep equality; tensors must match in dtype, shape and every bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def temp_files(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if ".tmp-" in p.name]


# ----------------------------------------------------------------------------------------------- round trip


def test_save_load_round_trip(tmp_path):
    payload = make_payload()
    path = tmp_path / "run" / "sub" / "ckpt.pt"  # parent directories do not exist yet
    assert save_checkpoint(payload, path) == path
    loaded = load_checkpoint(path)
    assert loaded["format"] == CHECKPOINT_FORMAT
    assert loaded["version"] == CHECKPOINT_VERSION
    assert_same({k: v for k, v in loaded.items() if k not in ("format", "version")}, payload)
    assert "format" not in payload  # the caller's dict is not modified
    assert temp_files(path.parent) == []


def test_loaded_state_restores_model_and_optimizer(tmp_path):
    payload = make_payload()
    save_checkpoint(payload, tmp_path / "c.pt")
    loaded = load_checkpoint(tmp_path / "c.pt")
    model = TinyNet()
    load_model_state(model, loaded["model"], "c.pt")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    optimizer.load_state_dict(loaded["optimizer"])
    assert_same(model.state_dict(), payload["model"])
    assert_same(optimizer.state_dict(), payload["optimizer"])


def test_save_refuses_what_the_safe_loader_could_not_read_back(tmp_path):
    path = tmp_path / "c.pt"
    payload = make_payload()
    payload["rng"]["oops"] = np.zeros(3)
    with pytest.raises(CheckpointError) as err:
        save_checkpoint(payload, path)
    message = str(err.value)
    assert str(path) in message and "payload['rng']['oops']" in message and "numpy.ndarray" in message
    assert not path.exists()

    # numpy scalars are float subclasses but pickle as numpy objects
    with pytest.raises(CheckpointError, match=r"payload\['progress'\]\['loss'\]"):
        save_checkpoint({"progress": {"loss": np.float64(1.5)}}, path)
    # torch.__version__ is a str subclass that the safe loader refuses: str() it
    with pytest.raises(CheckpointError, match="TorchVersion"):
        save_checkpoint({"meta": {"torch_version": torch.__version__}}, path)
    assert not path.exists()


# ----------------------------------------------------------------------------------------------- atomicity


def test_failed_write_leaves_previous_checkpoint_and_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    old = make_payload(global_step=1, seed=1)
    save_checkpoint(old, path)
    old_bytes = path.read_bytes()

    real_save = torch.save

    def save_half_then_fail(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        f.seek(f.tell() // 2)
        f.truncate()
        raise RuntimeError("simulated crash mid-write")

    monkeypatch.setattr(ckpt_module.torch, "save", save_half_then_fail)
    with pytest.raises(RuntimeError, match="simulated crash"):
        save_checkpoint(make_payload(global_step=2, seed=2), path)

    assert path.read_bytes() == old_bytes
    assert_same(load_checkpoint(path)["model"], old["model"])
    assert temp_files(tmp_path) == []


def test_interrupt_mid_write_cleans_up(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"

    def interrupted(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt_module.torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint({"a": 1}, path)
    assert not path.exists()
    assert temp_files(tmp_path) == []


def test_a_full_disk_during_a_write_becomes_a_storage_error_and_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    save_checkpoint({"a": 1}, path)

    def disk_full(obj, f, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt_module.torch, "save", disk_full)
    with pytest.raises(StorageError, match=r"No space left on device \(ENOSPC\); the disk is full") as err:
        save_checkpoint({"a": 2}, path)
    assert str(path) in str(err.value)
    assert load_checkpoint(path)["a"] == 1
    assert temp_files(tmp_path) == []


def test_write_goes_through_a_temp_file_in_the_same_directory(tmp_path, monkeypatch):
    # The final name must never hold a partial file: at the moment torch.save runs, `path` must not be the
    # file being written.
    path = tmp_path / "ckpt.pt"
    seen = {}
    real_save = torch.save

    def spy(obj, f, *args, **kwargs):
        seen["name"] = Path(f.name)
        seen["path_exists_during_write"] = path.exists()
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(ckpt_module.torch, "save", spy)
    save_checkpoint({"a": 1}, path)
    assert seen["name"].parent == tmp_path
    assert seen["name"] != path and seen["name"].name.startswith(".ckpt.pt.tmp-")
    assert seen["path_exists_during_write"] is False
    assert temp_files(tmp_path) == []


# ------------------------------------------------------------------------------------------ loading errors


def test_missing_file(tmp_path):
    path = tmp_path / "nope.pt"
    with pytest.raises(CheckpointError, match="no such checkpoint") as err:
        load_checkpoint(path)
    assert str(path) in str(err.value)


# Fixed bytes (a seeded generator, not os.urandom): every pytest-xdist worker must collect the same parameters.
NOISE = random.Random(0).randbytes(4096)


@pytest.mark.parametrize(
    "content", [b"", NOISE, b"PK\x03\x04" + NOISE], ids=["empty", "noise", "zip-header-then-noise"]
)
def test_corrupt_bytes(tmp_path, content):
    path = tmp_path / "garbage.pt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match="corrupt") as err:
        load_checkpoint(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.99])
def test_truncated_file(tmp_path, fraction):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(make_payload(), path)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(CheckpointError, match="truncated") as err:
        load_checkpoint(path)
    assert str(path) in str(err.value)


def test_custom_object_is_refused_by_the_safe_loader(tmp_path):
    path = tmp_path / "evil.pt"
    # Bypass save_checkpoint (which would refuse it) to write what a foreign tool could have written.
    torch.save({"format": CHECKPOINT_FORMAT, "version": 1, "thing": NotPlain()}, path)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    message = str(err.value)
    assert str(path) in message
    assert "other than tensors and plain" in message and "NotPlain" in message
    assert "will not unpickle arbitrary code" in message


def test_a_pickle_the_safe_loader_cannot_read_never_suggests_loading_it_unsafely(tmp_path):
    import zipfile

    good, path = tmp_path / "good.pt", tmp_path / "odd.pt"
    torch.save({"format": CHECKPOINT_FORMAT, "version": 1}, good)
    with zipfile.ZipFile(good) as source, zipfile.ZipFile(path, "w") as target:
        for info in source.infolist():
            data = source.read(info.filename)
            # An INST opcode (os.system): torch's safe unpickler refuses it as an unsupported operand.
            target.writestr(info, b"\x80\x02(ios\nsystem\n." if info.filename.endswith("data.pkl") else data)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    message = str(err.value)
    assert message.startswith(f"{path}: is corrupt (its pickled data cannot be read: Unsupported operand")
    assert "weights_only=True" in message and "weights_only` set to `False" not in message
    assert "False" not in message and "trusted source" not in message


def test_not_a_dlscale_checkpoint(tmp_path):
    bare = tmp_path / "bare.pt"
    torch.save(TinyNet().state_dict(), bare)
    with pytest.raises(CheckpointError, match="not a dlscale checkpoint") as err:
        load_checkpoint(bare)
    assert str(bare) in str(err.value) and "no 'format' key" in str(err.value)
    assert "bare model state_dict" in str(err.value)

    other = tmp_path / "other.pt"
    torch.save({"format": "someone-else", "version": 1}, other)
    with pytest.raises(CheckpointError, match="'someone-else'") as err:
        load_checkpoint(other)
    assert str(other) in str(err.value)

    a_list = tmp_path / "list.pt"
    torch.save([1, 2], a_list)
    with pytest.raises(CheckpointError, match="not a dlscale checkpoint") as err:
        load_checkpoint(a_list)
    assert str(a_list) in str(err.value)


def test_future_version(tmp_path):
    path = tmp_path / "future.pt"
    torch.save({"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION + 1}, path)
    with pytest.raises(CheckpointError, match="newer dlscale") as err:
        load_checkpoint(path)
    assert str(path) in str(err.value)
    assert f"version {CHECKPOINT_VERSION + 1}" in str(err.value)


def test_invalid_version(tmp_path):
    path = tmp_path / "bad.pt"
    torch.save({"format": CHECKPOINT_FORMAT, "version": "1"}, path)
    with pytest.raises(CheckpointError, match="invalid checkpoint version") as err:
        load_checkpoint(path)
    assert str(path) in str(err.value)


# -------------------------------------------------------------------------------------------- model state


def test_shape_mismatch_lists_key_and_both_shapes():
    state = TinyNet(hidden=6).state_dict()
    with pytest.raises(CheckpointError) as err:
        load_model_state(TinyNet(hidden=4), state, "runs/a/ckpt_latest.pt")
    message = str(err.value)
    assert message.startswith("runs/a/ckpt_latest.pt")
    assert "conv.weight: checkpoint (6, 2, 3, 3) vs model (4, 2, 3, 3)" in message
    assert "head.weight: checkpoint (3, 6) vs model (3, 4)" in message
    assert "different model configuration" in message and "`model:`" in message


def test_missing_and_unexpected_keys_are_listed_with_a_count():
    state = TinyNet().state_dict()
    del state["head.bias"]
    for i in range(11):
        state[f"extra.layer{i}.weight"] = torch.zeros(1)
    model = TinyNet()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError) as err:
        load_model_state(model, state, "src.pt")
    message = str(err.value)
    assert "missing from the checkpoint (1):" in message and "head.bias" in message
    assert "unexpected in the checkpoint (11):" in message
    assert "extra.layer0.weight" in message and "extra.layer7.weight" in message
    assert "extra.layer8.weight" not in message and "... and 3 more" in message
    assert_same(model.state_dict(), before)  # nothing was loaded


@pytest.mark.parametrize("prefix", ["_orig_mod.", "module.", "module._orig_mod.", "_orig_mod.module."])
def test_wrapper_prefixes_are_stripped(prefix):
    source = TinyNet()
    with torch.no_grad():
        for p in source.parameters():
            p.add_(1.0)
    state = {prefix + k: v for k, v in source.state_dict().items()}
    target = TinyNet()
    load_model_state(target, state, "wrapped.pt")
    assert_same(target.state_dict(), source.state_dict())


def test_bare_checkpoint_loads_into_a_wrapped_model():
    source = TinyNet()
    wrapper = torch.nn.Module()
    wrapper.module = TinyNet()  # what DDP looks like from the outside
    load_model_state(wrapper, source.state_dict(), "bare.pt")
    assert_same(wrapper.module.state_dict(), source.state_dict())


def test_model_state_must_be_a_mapping():
    with pytest.raises(CheckpointError, match="src.pt"):
        load_model_state(TinyNet(), [1, 2], "src.pt")


# -------------------------------------------------------------------------------------------------- rng


def draw_all() -> tuple:
    return (
        [random.random() for _ in range(5)],
        random.gauss(0.0, 1.0),  # leaves a cached gaussian in Python's state
        np.random.rand(5).tolist(),
        np.random.standard_normal(),  # and in numpy's
        torch.rand(5),
        torch.randn(3),
    )


def assert_draws_equal(a: tuple, b: tuple) -> None:
    assert a[0] == b[0] and a[1] == b[1] and a[2] == b[2] and a[3] == b[3]
    assert torch.equal(a[4], b[4]) and torch.equal(a[5], b[5])


def test_rng_round_trip_in_memory():
    seed_everything(123)
    draw_all()  # move every generator (incl. the cached gaussians) off its seeded state
    state = capture_rng_state()
    first = draw_all()
    restore_rng_state(state)
    assert_draws_equal(draw_all(), first)


def test_rng_round_trip_through_a_safe_load(tmp_path):
    seed_everything(7)
    random.gauss(0, 1)
    np.random.standard_normal()
    path = tmp_path / "rng.pt"
    torch.save(capture_rng_state(), path)
    first = draw_all()
    draw_all()  # wander off
    restore_rng_state(torch.load(path, weights_only=True))
    assert_draws_equal(draw_all(), first)


def test_rng_round_trip_through_a_checkpoint(tmp_path):
    seed_everything(9)
    save_checkpoint({"rng": capture_rng_state()}, tmp_path / "c.pt")
    first = draw_all()
    restore_rng_state(load_checkpoint(tmp_path / "c.pt")["rng"])
    assert_draws_equal(draw_all(), first)


def test_seed_everything_is_reproducible():
    seed_everything(5)
    a = draw_all()
    seed_everything(5)
    assert_draws_equal(draw_all(), a)
    seed_everything(6)
    assert draw_all()[0] != a[0]


@pytest.mark.parametrize("seed", [-1, 2**32, 1.5, True])
def test_seed_everything_refuses_bad_seeds(seed):
    with pytest.raises(Exception, match="seed"):
        seed_everything(seed)


def test_restoring_cuda_state_without_cuda_warns_once(caplog, monkeypatch):
    monkeypatch.setattr(rng_module.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(rng_module, "_warned_missing_cuda", False)
    seed_everything(3)
    state = capture_rng_state()
    state["cuda"] = [torch.zeros(16, dtype=torch.uint8)]
    first = draw_all()
    with caplog.at_level(logging.WARNING, logger=rng_module.__name__):
        restore_rng_state(state)
        assert_draws_equal(draw_all(), first)  # CPU generators still restored
        restore_rng_state(state)
    warnings = [r for r in caplog.records if "CUDA" in r.getMessage()]
    assert len(warnings) == 1


def malformed_states():
    def mutate(fn):
        state = capture_rng_state()
        fn(state)
        return state

    return {
        "not a dict": [1, 2],
        "no torch": mutate(lambda s: s.pop("torch")),
        "torch wrong dtype": mutate(lambda s: s.__setitem__("torch", s["torch"].float())),
        "torch wrong size": mutate(lambda s: s.__setitem__("torch", s["torch"][:10])),
        "python short": mutate(lambda s: s["python"].__setitem__("state", s["python"]["state"][:100])),
        "python bad pos": mutate(lambda s: s["python"]["state"].__setitem__(-1, 10_000)),
        "numpy name": mutate(lambda s: s["numpy"].__setitem__("bit_generator", "PCG64")),
        "numpy keys as numpy": mutate(lambda s: s["numpy"].__setitem__("keys", s["numpy"]["keys"].numpy())),
        "numpy key overflow": mutate(lambda s: s["numpy"]["keys"].__setitem__(0, 2**40)),
        "numpy pos type": mutate(lambda s: s["numpy"].__setitem__("pos", "3")),
        "cuda not a list": mutate(lambda s: s.__setitem__("cuda", torch.zeros(16, dtype=torch.uint8))),
    }


@pytest.mark.parametrize("name", list(malformed_states()))
def test_malformed_rng_state_is_refused_and_changes_nothing(name):
    bad = malformed_states()[name]
    seed_everything(11)
    before = capture_rng_state()
    with pytest.raises(CheckpointError, match="rng state"):
        restore_rng_state(bad)
    after = capture_rng_state()
    assert_same(after, before)


# ------------------------------------------------------------------------------------ checkpoint directory


def test_checkpoint_dir_latest_and_best(tmp_path):
    run = CheckpointDir(tmp_path / "ckpts")
    assert run.latest_path == tmp_path / "ckpts" / "ckpt_latest.pt"
    assert run.best_path == tmp_path / "ckpts" / "ckpt_best.pt"
    assert not run.has_checkpoint()
    with pytest.raises(CheckpointError, match="ckpt_latest.pt"):
        run.load_latest()

    first = make_payload(global_step=1, seed=1)
    run.save(first, is_best=True)
    second = make_payload(global_step=2, seed=2)
    run.save(second, is_best=False)
    assert run.has_checkpoint()

    assert_same(run.load_latest()["model"], second["model"])
    assert load_checkpoint(run.best_path)["progress"]["global_step"] == 1
    assert_same(load_checkpoint(run.best_path)["model"], first["model"])

    third = make_payload(global_step=3, seed=3)
    run.save(third, is_best=True)
    assert run.best_path.read_bytes() == run.latest_path.read_bytes()
    assert run.numbered_paths() == []  # keep_last=0: no numbered copies
    assert temp_files(run.directory) == []


def test_numbered_checkpoints_are_pruned(tmp_path):
    run = CheckpointDir(tmp_path, keep_last=2)
    for step in (10, 20, 30, 40):
        run.save({"progress": {"global_step": step}, "x": torch.tensor(step)})
    names = [p.name for p in run.numbered_paths()]
    assert names == ["ckpt_step00000030.pt", "ckpt_step00000040.pt"]
    assert load_checkpoint(tmp_path / "ckpt_step00000030.pt")["x"].item() == 30
    assert run.load_latest()["x"].item() == 40
    # Copies are independent of later saves (latest is replaced, never modified in place).
    run.save({"progress": {"global_step": 50}, "x": torch.tensor(50)})
    assert load_checkpoint(tmp_path / "ckpt_step00000040.pt")["x"].item() == 40
    assert temp_files(tmp_path) == []


def test_pruning_waits_for_the_new_numbered_copy(tmp_path, monkeypatch):
    run = CheckpointDir(tmp_path, keep_last=1)
    run.save({"progress": {"global_step": 1}})

    def failing_copy(source, target):
        raise CheckpointError(f"{target}: simulated failure")

    monkeypatch.setattr(directory_module, "_publish_copy", failing_copy)
    with pytest.raises(CheckpointError, match="simulated"):
        run.save({"progress": {"global_step": 2}})
    assert [p.name for p in run.numbered_paths()] == ["ckpt_step00000001.pt"]


def test_numbered_copies_without_hard_links(tmp_path, monkeypatch):
    def no_links(*args, **kwargs):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(directory_module.os, "link", no_links)
    run = CheckpointDir(tmp_path, keep_last=1)
    run.save({"progress": {"global_step": 1}, "x": torch.arange(3)}, is_best=True)
    assert run.best_path.read_bytes() == run.latest_path.read_bytes()
    assert load_checkpoint(run.numbered_path(1))["x"].tolist() == [0, 1, 2]
    assert temp_files(tmp_path) == []


def test_numbered_copies_need_a_global_step(tmp_path):
    run = CheckpointDir(tmp_path, keep_last=3)
    with pytest.raises(CheckpointError, match="global_step"):
        run.save({"progress": {}})
    assert not run.has_checkpoint()


def test_numbered_name_pattern():
    assert re.fullmatch(r"ckpt_step\d{8}\.pt", CheckpointDir("x").numbered_path(42).name)
    assert CheckpointDir("x").numbered_path(42).name == "ckpt_step00000042.pt"


# --------------------------------------------------------------------------------------- resume end to end


def _train(model, optimizer, steps: range, ckpt: CheckpointDir | None = None, stop_after: int | None = None):
    """A tiny loop that draws from every generator (dropout, torch/numpy/python sampling)."""
    net = torch.nn.Sequential(model, torch.nn.Dropout(0.3))
    for step in steps:
        order = list(range(4))
        random.shuffle(order)
        x = torch.randn(4, 2, 5, 5)[order] + float(np.random.rand())
        optimizer.zero_grad()
        net(x).square().mean().backward()
        optimizer.step()
        if ckpt is not None and step + 1 == stop_after:
            payload = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "rng": capture_rng_state(),
                "progress": {"global_step": step + 1},
            }
            ckpt.save(payload, is_best=False)
            return


def test_interrupted_and_resumed_run_matches_an_uninterrupted_one_bitwise(tmp_path):
    total, stop = 8, 3

    seed_everything(21)
    reference = TinyNet()
    opt = torch.optim.Adam(reference.parameters(), lr=1e-2)
    _train(reference, opt, range(total))

    run = CheckpointDir(tmp_path)
    seed_everything(21)
    first = TinyNet()
    opt = torch.optim.Adam(first.parameters(), lr=1e-2)
    _train(first, opt, range(total), ckpt=run, stop_after=stop)

    seed_everything(999)  # a fresh process starts from some other state
    resumed = TinyNet()
    opt = torch.optim.Adam(resumed.parameters(), lr=1e-2)
    state = run.load_latest()
    load_model_state(resumed, state["model"], str(run.latest_path))
    opt.load_state_dict(state["optimizer"])
    restore_rng_state(state["rng"])
    _train(resumed, opt, range(state["progress"]["global_step"], total))

    assert_same(resumed.state_dict(), reference.state_dict())
