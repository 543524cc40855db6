"""The mistakes every new workload makes, each made once in a tiny workload of a user's own (a module in
tmp_path) and trained with ``dlscale train`` in this process: one ``dlscale: error:`` line naming the workload
member and the user's file:line, exit 2, before the first training step. Exceptions raised in the user's code
get the same one line, with the whole traceback in the run's out.log (and with ``--debug``); dlscale's own bugs
keep their tracebacks. ``--dry_run`` checks and times one step and writes nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dlscale.cli import main

# A workload that trains: (1, 8) samples, target = 2 x input, a one-channel Conv1d. Each test replaces one of the
# marked lines (or adds code) to make one mistake.
WORKLOAD_MODULE = """
from dataclasses import dataclass

import numpy as np
import torch

from dlscale.scoring.evaluator import EvalSummary
from dlscale.workloads import Workload


@dataclass
class PairsData:
    pairs_samples: int = 16


@dataclass
class PairsModel:
    pairs_kernel: int = 3


class Pairs(torch.utils.data.Dataset):
    def __init__(self, samples, seed):
        self.x = np.random.default_rng(seed).standard_normal((samples, 1, 8)).astype(np.float32)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        x = torch.from_numpy(self.x[index])
        return x, 2 * x  # SAMPLE


class Net(torch.nn.Module):
    def __init__(self, kernel):
        super().__init__()
        self.conv = torch.nn.Conv1d(1, 1, kernel, padding=kernel // 2)

    def forward(self, x):
        return self.conv(x)  # FORWARD


class Rmse:
    def reset(self):
        self.sum, self.count = 0.0, 0

    def update(self, inputs, targets, predictions):
        self.sum += float(((predictions - targets) ** 2).sum())
        self.count += targets.numel()

    def reduce_across_ranks(self, sum_, device):
        pass

    def summary(self):
        rmse = (self.sum / max(self.count, 1)) ** 0.5
        return EvalSummary(loss=rmse**2, scalars={"rmse": rmse}, headline="rmse")  # HEADLINE


class Mine(Workload):
    name = "mine"
    data_config = PairsData
    model_config = PairsModel

    def build_datasets(self, data_cfg):
        return {"train": Pairs(data_cfg.pairs_samples, 0), "valid": Pairs(8, 1)}  # SPLITS

    def build_model(self, model_cfg, data_cfg):
        return Net(model_cfg.pairs_kernel)  # MODEL

    def loss(self, prediction, target):
        return torch.nn.functional.mse_loss(prediction, target)

    def evaluator(self, valid_dataset, image_channel=None):
        return Rmse()

    training_loss = None  # TRAINING_LOSS


WORKLOAD = Mine()
"""

CONFIG = """
base:
  workload: {module}:WORKLOAD
  optim: {{optimizer: Adam, lr: 0.01, lr_schedule: constant, warmup: 0, enable_fused: false}}
  train: {{global_batch_size: 4, num_epochs: 1, num_iters: null, amp_mode: none, enable_jit: false}}
  loader: {{num_data_workers: 0, data_loader_config: pytorch}}
  log: {{progress: none, tensorboard: false}}
"""


def write_workload(tmp_path: Path, monkeypatch, module: str, **replacements: str) -> Path:
    """The workload module ``module`` with the lines marked ``# KEY`` replaced (``prepend``: code at its top),
    on sys.path; the config file that names it."""
    text = WORKLOAD_MODULE
    for marker, line in replacements.items():
        if marker == "prepend":
            text = line + "\n" + text
            continue
        pattern = re.compile(rf"^( *).*# {marker}$", re.M)
        assert pattern.search(text), marker
        text = pattern.sub(lambda m, line=line, marker=marker: f"{m.group(1)}{line}  # {marker}", text)
    (tmp_path / f"{module}.py").write_text(text)
    (tmp_path / f"{module}.yaml").write_text(CONFIG.format(module=module))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path / f"{module}.yaml"


def train(config: Path, tmp_path: Path, *more: str) -> int:
    return main(
        ["train", "--yaml_config", str(config), "--config", "base", "--expdir", str(tmp_path / "runs"), *more]
    )


def line_of(path: Path, text: str) -> int:
    """The number of the line of ``path`` that holds ``text``."""
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("dlscale: error: "), err
    assert "Traceback" not in err
    return lines[0]


MISTAKES = [
    pytest.param(
        {"FORWARD": "return self.conv(x)[:, 0]"},
        [
            "the model's prediction has shape (B, 8) and the target (B, 1, 8)",
            "must be equal",
            "Net.forward at",
        ],
        "def forward",
        id="prediction-B-8-vs-target-B-1-8",
    ),
    pytest.param(
        {"FORWARD": "return self.conv(x)[..., :-1]"},
        ["the model's prediction has shape (B, 1, 7) and the target (B, 1, 8)", "Net.forward at"],
        "def forward",
        id="prediction-B-1-7-vs-target-B-1-8",
    ),
    pytest.param(
        {"HEADLINE": 'return EvalSummary(loss=rmse**2, scalars={"rmse": rmse}, headline="RMSE")'},
        ["the evaluator's headline 'RMSE' is not one of its scalars ('rmse')", "Rmse.summary at"],
        "def summary",
        id="headline-not-in-scalars",
    ),
    pytest.param(
        {"SAMPLE": "return x.double(), 2 * x.double()"},
        ["the samples' inputs are float64 and the model's parameters float32", "Pairs.__getitem__ at"],
        "def __getitem__",
        id="float64-samples",
    ),
    pytest.param(
        {"SAMPLE": "return self.x[index], 2 * self.x[index]"},
        [
            "a 'train' sample is (numpy.ndarray, numpy.ndarray)",
            "pair of torch tensors",
            "Pairs.__getitem__ at",
        ],
        "def __getitem__",
        id="numpy-samples",
    ),
    pytest.param(
        {"SPLITS": 'return {"train": Pairs(data_cfg.pairs_samples, 0), "val": Pairs(8, 1)}'},
        ["build_datasets returned the splits 'train', 'val', without 'valid' (did you mean 'val'?)"],
        "def build_datasets",
        id="split-named-val",
    ),
    pytest.param(
        {"prepend": "raise RuntimeError('MINE_DATA is not set')"},
        ["importing module", "raised RuntimeError: MINE_DATA is not set", "in <module>"],
        "raise RuntimeError",
        id="module-raises-on-import",
    ),
    pytest.param(
        {
            "TRAINING_LOSS": "def training_loss(self, model, batch, step): return (model(batch[0]) - batch[1]) ** 2"
        },
        ["training_loss returned a tensor of shape (2, 1, 8); it must return a scalar", "(training_loss at "],
        "def training_loss",
        id="training-loss-not-a-scalar",
    ),
    pytest.param(
        {"MODEL": "return Net(model_cfg.pairs_kernal)"},
        ["build_model raised AttributeError", "pairs_kernal", "in Mine.build_model"],
        "# MODEL",
        id="build-model-raises",
    ),
]


@pytest.mark.parametrize(("replacements", "words", "line_text"), MISTAKES)
def test_a_mistake_in_the_workload_is_one_line_naming_its_file_and_line_and_exit_2(
    tmp_path, monkeypatch, capsys, request, replacements, words, line_text
):
    module = "mine_" + re.sub(r"\W", "_", request.node.callspec.id)
    config = write_workload(tmp_path, monkeypatch, module, **replacements)
    monkeypatch.chdir(tmp_path)  # the user's project directory: messages show their files relative to it
    assert train(config, tmp_path) == 2
    message = one_error_line(capsys)
    for word in words:
        assert word in message, message
    module_file = tmp_path / f"{module}.py"
    assert f" {module_file.name}:{line_of(module_file, line_text)}" in message, message
    assert not list((tmp_path / "runs").rglob("*.pt")), "no checkpoint before the check passed"
    assert not list((tmp_path / "runs").rglob("summary.json"))


def test_an_exception_in_the_users_code_has_its_traceback_in_out_log_and_with_debug(
    tmp_path, monkeypatch, capsys
):
    config = write_workload(
        tmp_path, monkeypatch, "mine_raises", SAMPLE="raise IndexError(f'sample {index} is missing')"
    )
    assert train(config, tmp_path) == 2
    message = one_error_line(capsys)
    log_file = tmp_path / "runs" / "base" / "00" / "out.log"
    assert "the 'train' data set's __getitem__ raised IndexError: sample 0 is missing" in message
    assert f"the traceback is in {log_file}" in message
    log = log_file.read_text()
    assert "Traceback (most recent call last)" in log and "IndexError: sample 0 is missing" in log

    assert train(config, tmp_path, "--debug", "--run_num", "01") == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and err.rstrip().splitlines()[-1].startswith(
        "dlscale: error:"
    )


def test_a_bug_of_dlscales_keeps_its_traceback(tmp_path, monkeypatch):
    """The innermost frame of the user's or dlscale's code decides: here dlscale's (a helper the workload
    calls), so the exception is not dressed as the user's mistake."""
    config = write_workload(
        tmp_path,
        monkeypatch,
        "mine_dlscale_bug",
        MODEL="from dlscale.runtime.strict_json import to_json; to_json(object()); return Net(3)",
    )
    with pytest.raises(TypeError):
        train(config, tmp_path)


def test_the_check_passes_a_good_workload_which_trains_and_logs_its_data_sets_by_class_and_length(
    tmp_path, monkeypatch
):
    config = write_workload(tmp_path, monkeypatch, "mine_good")
    assert train(config, tmp_path) == 0
    log = (tmp_path / "runs" / "base" / "00" / "out.log").read_text()
    assert "Pre-flight check passed in" in log
    assert "input (B, 1, 8) float32 -> prediction (B, 1, 8), target (B, 1, 8)" in log
    assert "evaluator headline 'rmse'" in log
    assert "Data: train Pairs of 16 samples" in log and "valid Pairs of 8 samples" in log


def test_dry_run_checks_and_times_one_step_and_writes_nothing(tmp_path, monkeypatch, capsys):
    config = write_workload(tmp_path, monkeypatch, "mine_dry")
    assert train(config, tmp_path, "--dry_run") == 0
    out = capsys.readouterr().out
    assert "Pre-flight check passed in" in out
    assert re.search(r"Dry run: one training step of 4 samples per rank takes [0-9.e-]+ s", out), out
    assert "peak memory: host_rss" in out and "Nothing was written" in out
    assert not (tmp_path / "runs").exists()

    bad = write_workload(tmp_path, monkeypatch, "mine_dry_bad", FORWARD="return self.conv(x)[:, 0]")
    assert train(bad, tmp_path, "--dry_run") == 2
    assert "the model's prediction has shape (B, 8)" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
