"""The Python API's names stay its functions whatever was imported before: importing a subpackage sets an
attribute of the same name on ``dlscale``, which would hide the lazily loaded function (``dlscale.tune`` was
once the ``tune`` package after ``dlscale.train`` had run). And ``dlscale.tune`` checks its arguments before it
writes anything."""

from __future__ import annotations

import pkgutil
from pathlib import Path

import pytest

import dlscale
from dlscale.errors import ConfigError, InvalidValue

REPO = Path(__file__).resolve().parents[2]

LINE_MODULE = """
import torch
from dataclasses import dataclass


@dataclass
class NoKeys:
    pass


class Line:
    data_config = NoKeys
    model_config = NoKeys

    def build_datasets(self, data_cfg):
        x = torch.linspace(-1, 1, 16).reshape(-1, 1)
        pairs = list(zip(x, 3 * x + 1))
        return {"train": pairs, "valid": pairs[::4]}

    def build_model(self, model_cfg, data_cfg):
        return torch.nn.Linear(1, 1)

    def loss(self, prediction, target):
        return torch.nn.functional.mse_loss(prediction, target)


WORKLOAD = Line()
"""

LINE_CONFIG = """
base:
  workload: api_names_line:WORKLOAD
  optim: {optimizer: Adam, lr: 0.05, lr_schedule: constant, warmup: 0, enable_fused: false}
  train: {global_batch_size: 4, num_epochs: 1, num_iters: null, amp_mode: none, enable_jit: false}
  loader: {num_data_workers: 0, data_loader_config: pytorch}
  log: {progress: none, tensorboard: false}
"""


def test_no_module_of_dlscale_is_named_like_a_function_of_its_api():
    modules = {module.name for module in pkgutil.iter_modules(dlscale.__path__)}
    assert not modules & set(dlscale._API), "rename the module: it would hide dlscale.<name>() once imported"


def test_tune_is_callable_after_train_in_one_process_and_checks_its_arguments_first(tmp_path, monkeypatch):
    (tmp_path / "api_names_line.py").write_text(LINE_MODULE)
    (tmp_path / "line.yaml").write_text(LINE_CONFIG)
    monkeypatch.syspath_prepend(str(tmp_path))
    summary = dlscale.train(tmp_path / "line.yaml", "base", expdir=str(tmp_path / "runs"))
    assert summary["final"]["val_loss"] is not None
    assert callable(dlscale.tune) and dlscale.tune.__module__ == "dlscale.api"

    out = tmp_path / "tuned" / "base_tuned.yaml"
    with pytest.raises(InvalidValue, match="budget_minutes: must be a number of minutes > 0, got -1"):
        dlscale.tune(tmp_path / "line.yaml", "base", out=out, budget_minutes=-1)
    with pytest.raises(ConfigError, match="unknown key"):
        dlscale.tune(tmp_path / "line.yaml", "base", ["optim.lrr=1"], out=out)
    # the workload argument is the config's workload: key, as for train and bench
    with pytest.raises(ConfigError, match="unknown workload 'no_such_workload'"):
        dlscale.tune(tmp_path / "line.yaml", "base", out=out, workload="no_such_workload")
    assert not (tmp_path / "tuned").exists(), "a wrong argument must leave no tune.log behind"
