"""A user's own workload: found by import path or entry point, checked member by member, its config sections
read like the built-in ones, the optional members defaulted, and trained through the Python API."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dlscale
from dlscale.checkpoint.files import load_checkpoint
from dlscale.config import config_reference, load_run_config
from dlscale.errors import ConfigError
from dlscale.scoring.loss_evaluator import LossEvaluator
from dlscale.workloads import get_workload, use_workload, workload_names
from dlscale.workloads.protocol import Workload
from dlscale.workloads.references import OPTIONAL_MEMBERS, REQUIRED_MEMBERS, as_workload

REPO = Path(__file__).resolve().parents[2]

# A workload that does not subclass Workload: the five required members only. y = 3 x + 1 with noise-free data.
TOY_MODULE = """
from dataclasses import dataclass
from typing import Literal

import torch


@dataclass
class LineData:
    toy_samples: int = 64
    toy_slope: float = 3.0


@dataclass
class LineModel:
    toy_hidden: int = 8
    toy_activation: Literal["tanh", "relu"] = "tanh"

    def __post_init__(self):
        from dlscale.errors import InvalidValue

        if self.toy_hidden < 1:
            raise InvalidValue("toy_hidden", f"must be >= 1, got {self.toy_hidden}")


class Line:
    data_config = LineData
    model_config = LineModel

    def build_datasets(self, data_cfg):
        x = torch.linspace(-1, 1, data_cfg.toy_samples).reshape(-1, 1)
        pairs = list(zip(x, data_cfg.toy_slope * x + 1.0))
        return {"train": pairs, "valid": pairs[::4]}

    def build_model(self, model_cfg, data_cfg):
        activation = torch.nn.Tanh() if model_cfg.toy_activation == "tanh" else torch.nn.ReLU()
        return torch.nn.Sequential(
            torch.nn.Linear(1, model_cfg.toy_hidden), activation, torch.nn.Linear(model_cfg.toy_hidden, 1)
        )

    def loss(self, prediction, target):
        return torch.nn.functional.mse_loss(prediction, target)


WORKLOAD = Line()


class NoLoss:
    data_config = LineData
    model_config = LineModel

    def build_datasets(self, data_cfg):
        return {}

    def build_model(self, model_cfg, data_cfg):
        return torch.nn.Linear(1, 1)


class NotADataclass(Line):
    data_config = dict


class NeedsArguments(Line):
    def __init__(self, size):
        self.size = size


@dataclass
class LrData:
    lr: float = 0.1


class ClashingKey(Line):
    data_config = LrData


@dataclass
class SetData:
    toy_names: set = None


class UnreadableType(Line):
    data_config = SetData
"""

TOY_CONFIG = """
base:
  workload: toy_line:WORKLOAD
  data: {toy_samples: 32}
  model: {toy_hidden: 4}
  optim: {optimizer: Adam, lr: 0.05, lr_schedule: constant, warmup: 0, enable_fused: false}
  train: {global_batch_size: 8, num_epochs: 3, num_iters: null, amp_mode: none, enable_jit: false}
  loader: {num_data_workers: 0, data_loader_config: pytorch}
  log: {progress: none, tensorboard: false}
flat:
  extends: base
  toy_slope: -2.0
  lr: 0.01
"""


@pytest.fixture
def toy(tmp_path, monkeypatch) -> Path:
    """The toy workload's module on sys.path and its config file; the path of the config file."""
    (tmp_path / "toy_line.py").write_text(TOY_MODULE)
    (tmp_path / "toy.yaml").write_text(TOY_CONFIG)
    (tmp_path / "toy_line_needs.py").write_text("import not_installed_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path / "toy.yaml"


def test_an_import_path_names_a_workload_whose_dataclasses_are_the_data_and_model_sections(toy):
    cfg = load_run_config(toy, "flat", ["model.toy_activation=relu", "toy_hidden=6"])
    assert cfg.workload == "toy_line:WORKLOAD"
    assert (cfg.data.toy_samples, cfg.data.toy_slope) == (32, -2.0)  # nested in base, flat in flat
    assert (cfg.model.toy_hidden, cfg.model.toy_activation) == (6, "relu")
    assert cfg.optim.lr == 0.01
    assert cfg.to_dict()["data"] == {"toy_samples": 32, "toy_slope": -2.0}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.toy_sample=3", "unknown key data.toy_sample (did you mean 'toy_samples'?)"),
        ("toy_hiden=3", "unknown key 'toy_hiden' (did you mean 'toy_hidden'?)"),
        ("model.toy_activation=gelu", "'gelu' is not one of tanh, relu"),
        ("model.toy_hidden=0", "model.toy_hidden: must be >= 1, got 0"),
        ("data.toy_samples=many", "expected an integer, got 'many'"),
    ],
)
def test_a_users_sections_are_validated_like_the_built_in_ones(toy, override, message):
    with pytest.raises(ConfigError, match=re_escape(message)):
        load_run_config(toy, "base", [override])


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


@pytest.mark.parametrize(
    ("reference", "words"),
    [
        (
            "toy_line:NoLoss",
            ["toy_line:NoLoss", "toy_line.NoLoss", "has no loss", "loss(prediction, target)"],
        ),
        ("toy_line:NotADataclass", ["data_config", "not a dataclass"]),
        ("toy_line:NeedsArguments", ["NeedsArguments cannot be instantiated without arguments"]),
        ("toy_line:Missing", ["toy_line:Missing has no attribute 'Missing'"]),
        ("no_such_package.module:W", ["cannot import module 'no_such_package.module'", "PYTHONPATH"]),
        (
            "toy_line_needs:WORKLOAD",
            ["module 'toy_line_needs' imports 'not_installed_dependency'", "install it"],
        ),
        ("toy_line:WORK LOAD", ["not an import path of the form package.module:OBJECT"]),
        ("toy_line:ClashingKey", ["data.lr", "optim.lr", "rename it"]),
        ("toy_line:UnreadableType", ["data.toy_names", "cannot be read as"]),
        ("era5vit", ["unknown workload 'era5vit'", "did you mean 'era5_vit'", "dlscale.workloads"]),
    ],
)
def test_a_workload_that_is_not_one_gets_an_error_naming_what_is_wrong(toy, reference, words):
    with pytest.raises(ConfigError) as error:
        load_run_config(toy, "base", workload=reference)
    message = str(error.value)
    assert str(toy) in message  # the file and config it came from
    for word in words:
        assert word in message


def test_an_object_that_does_not_subclass_workload_gets_the_optional_members_defaults(toy):
    workload = get_workload("toy_line:WORKLOAD")
    assert isinstance(workload, Workload)
    assert workload.name == "toy_line:WORKLOAD"
    model = workload.build_model(workload.model_config(), workload.data_config())
    assert workload.describe_model(model) == "Sequential with 25 parameters"
    assert workload.forward_flops_per_sample(None, None) is None and workload.fsdp_units(model) == ()
    assert workload.configured(None, None) is workload
    assert isinstance(workload.evaluator([]), LossEvaluator)
    assert workload.training_loss is None  # the training loss is loss(model(inputs), targets)


def test_a_training_loss_of_an_object_that_does_not_subclass_workload_is_kept(toy):
    inner = get_workload("toy_line:WORKLOAD").inner

    class WithHook:  # the toy's members, plus the optional hook
        def __getattr__(self, member):
            return getattr(inner, member)

        def training_loss(self, model, batch, step):
            return step

    workload = as_workload(WithHook(), "with_hook")
    assert workload.training_loss(None, None, 7) == 7


def test_every_optional_member_of_the_protocol_is_kept_on_an_object_that_does_not_subclass_it():
    """A member the Workload protocol defines with a default must be in OPTIONAL_MEMBERS, or the wrapper of an
    object that does not subclass Workload hides the object's own member behind the default."""
    defined = {
        name
        for name, value in vars(Workload).items()
        if not name.startswith("_") and (callable(value) or name == "training_loss")
    }
    assert defined - set(REQUIRED_MEMBERS) == set(OPTIONAL_MEMBERS) - {"name"}


def test_an_entry_point_registers_a_workload_by_name(toy, monkeypatch):
    """An installed package's entry point: a dist-info directory on sys.path, as pip writes it."""
    dist_info = toy.parent / "toy_line-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-line\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text("[dlscale.workloads]\ntoy = toy_line:WORKLOAD\n")
    assert "toy" in workload_names()
    cfg = load_run_config(toy, "base", workload="toy")
    assert cfg.workload == "toy" and cfg.data.toy_samples == 32
    assert get_workload("toy").inner is get_workload("toy_line:WORKLOAD").inner  # the same object
    assert "toy_line:WORKLOAD" not in workload_names()


@pytest.mark.slow
def test_config_keys_lists_a_users_sections(toy):
    text = config_reference("toy_line:WORKLOAD")
    assert "data:  (LineData)" in text and "  toy_slope: a number (default 3.0)" in text
    assert "  toy_activation: one of tanh, relu (default 'tanh')" in text
    assert "optim:  (OptimConfig)" in text
    done = subprocess.run(
        [sys.executable, "-m", "dlscale", "config", "--keys", "--yaml_config", str(toy), "--config", "base"],
        cwd=toy.parent,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": f"{toy.parent}:{REPO / 'src'}", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert "toy_hidden: an integer (default 8)" in done.stdout


def test_the_default_evaluator_reports_the_mean_loss_per_sample():
    def loss(prediction, target):
        return ((prediction - target) ** 2).mean()

    evaluator = LossEvaluator(loss)
    batches = [torch.arange(3.0).reshape(3, 1), torch.tensor([[10.0]])]  # uneven batches: 3 and 1 samples
    for batch in batches:
        evaluator.update(batch, torch.zeros_like(batch), batch)
    per_sample = [0.0, 1.0, 4.0, 100.0]
    summary = evaluator.summary()
    assert summary.loss == pytest.approx(sum(per_sample[:3]) / 3 * 3 / 4 + 100 / 4)
    assert summary.samples == 4 and summary.headline == "loss" and summary.example is None

    doubled = []
    evaluator.reduce_across_ranks(
        lambda tensor: (tensor.mul_(2), doubled.append(tensor)), torch.device("cpu")
    )
    assert evaluator.summary().samples == 8 and doubled  # a rank's sums, summed with another equal rank's


def test_the_default_evaluator_keeps_an_image_of_gridded_outputs_and_checks_the_channel():
    fields = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)
    evaluator = LossEvaluator(torch.nn.functional.mse_loss, image_channel="2")
    evaluator.update(fields, fields, fields + 1)
    assert evaluator.example.channel == "channel 2"
    assert (evaluator.example.prediction == fields[0, 2].numpy() + 1).all()
    with pytest.raises(ConfigError, match="log.image_channel: 'u10' is not a channel index"):
        LossEvaluator(torch.nn.functional.mse_loss, image_channel="u10")
    with pytest.raises(ConfigError, match="log.image_channel: 5 is not a channel of the output"):
        LossEvaluator(torch.nn.functional.mse_loss, image_channel="5").update(fields, fields, fields)


def test_the_python_api_trains_a_workload_object_and_returns_the_summary(toy, tmp_path):
    module = __import__("toy_line")
    summary = dlscale.train(module.Line(), toy, "base", ["optim.lr=0.05"], expdir=str(tmp_path / "runs"))
    final = summary["final"]
    assert summary["workload"] == "Line" and final["headline"] == "loss"
    run_dir = tmp_path / "runs" / "base" / "00"
    assert json.loads((run_dir / "summary.json").read_text())["final"] == final
    # the validation loss is the model's mean squared error on the validation samples, recomputed here
    checkpoint = load_checkpoint(run_dir / "checkpoints" / "ckpt_latest.pt")
    workload = get_workload("Line")
    cfg = load_run_config(toy, "base", workload="Line")
    model = workload.build_model(cfg.model, cfg.data)
    model.load_state_dict(checkpoint["model"])
    x, y = (torch.stack(column) for column in zip(*workload.build_datasets(cfg.data)["valid"], strict=True))
    with torch.no_grad():
        assert final["val_loss"] == pytest.approx(torch.nn.functional.mse_loss(model(x), y).item(), rel=1e-5)
    assert final["val_loss"] < 0.5 * float(((y - y.mean()) ** 2).mean())  # it learned something

    again = dlscale.train("Line", toy, "base", expdir=str(tmp_path / "runs"))  # finished: nothing to train
    assert again["final"] == final


def test_a_workload_object_may_not_take_a_built_in_name():
    from dlscale.workloads.cnn_mnist import CNNMnist

    impostor = CNNMnist()
    impostor.name = "era5_vit"
    with pytest.raises(ConfigError, match="a built-in workload has this name"):
        use_workload(impostor)
    assert use_workload(get_workload("era5_vit")) == "era5_vit"


def test_a_wrapped_workload_binds_its_config_through_its_own_configured(toy):
    module = __import__("toy_line")

    class Scaled(module.Line):
        def __init__(self, factor=1.0):
            self.factor = factor

        def configured(self, model_cfg, data_cfg):
            return Scaled(data_cfg.toy_slope)

    bound = as_workload(Scaled(), "scaled").configured(None, module.LineData(toy_slope=5.0))
    assert isinstance(bound, Workload) and bound.inner.factor == 5.0 and bound.name == "scaled"
