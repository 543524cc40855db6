"""The pre-flight check's batch (src/dlscale/run/preflight.py): two samples are read and compared, but no more go
through the model than the run's local batch holds, so the check never needs more memory than a step."""

from __future__ import annotations

import torch

from dlscale.run.preflight import SAMPLES_PER_BATCH, preflight_check
from dlscale.runtime.device import Device
from dlscale.scoring.loss_evaluator import LossEvaluator
from dlscale.training.precision import Precision
from dlscale.workloads.protocol import Workload


class Pairs(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int):
        return torch.full((3,), float(index)), torch.full((3,), float(index) + 1)


class CountingModel(torch.nn.Module):
    """A linear model that records the batch size of every forward."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)
        self.batches: list[int] = []

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        self.batches.append(inputs.shape[0])
        return self.linear(inputs)


class Line(Workload):
    name = "line"

    def loss(self, prediction, target):
        return torch.nn.functional.mse_loss(prediction, target)


def check_with(batch_size: int | None) -> list[int]:
    workload, model, cpu = Line(), CountingModel(), Device.select(0)
    datasets = {"train": Pairs(), "valid": Pairs()}
    evaluator = LossEvaluator(workload.loss)
    extra = () if batch_size is None else (batch_size,)
    report = preflight_check(workload, model, datasets, evaluator, Precision("none", cpu), cpu, *extra)
    assert report.input_shape[0] == model.batches[0]
    return model.batches


def test_two_samples_go_through_the_model_by_default_and_one_for_a_local_batch_of_one():
    assert SAMPLES_PER_BATCH == 2
    assert check_with(None) == [2, 2]  # the training forward and the validation forward
    assert check_with(2) == [2, 2]
    assert check_with(1) == [1, 1]
