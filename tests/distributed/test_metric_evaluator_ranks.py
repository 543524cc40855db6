"""MetricEvaluator on 2 forked gloo ranks gives the numbers of one process: its sums and counts are summed
over the ranks and divided once, also when the ranks hold unequal shares and one of them holds no sample."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from forked_ranks import run_ranks

from dlscale.runtime.device import Device
from dlscale.scoring.evaluator import evaluate
from dlscale.scoring.metric_evaluator import MetricEvaluator

SAMPLES = 7


class Fields(torch.utils.data.Dataset):
    def __init__(self):
        generator = torch.Generator().manual_seed(1)
        self.inputs = torch.randn(SAMPLES, 2, 3, 3, generator=generator)
        self.targets = self.inputs + torch.randn(SAMPLES, 2, 3, 3, generator=generator)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int):
        return self.inputs[index], self.targets[index]


def metrics(prediction, target):
    error = (prediction - target).flatten(2)
    return {"RMSE": error.pow(2).mean(dim=2).sqrt(), "MAE": error.abs().mean()}  # (B, C) and a batch mean


def evaluate_share(rank: int, shares: dict[int, list[list[int]]]) -> dict:
    """Evaluate this rank's batches (lists of sample indices) of the identity model."""
    if rank >= 0:
        torch.distributed.init_process_group("gloo")
    data = Fields()
    batches = [(data.inputs[b], data.targets[b]) for b in shares[max(rank, 0)]]
    evaluator = MetricEvaluator(
        data, F.mse_loss, metrics, lambda x, y: torch.zeros_like(y), baseline_name="zeros"
    )
    model = torch.nn.Identity()
    summary = evaluate(model, batches, evaluator, Device("cpu"), predict=lambda x: 0.5 * x)
    if rank >= 0:
        torch.distributed.destroy_process_group()
    return {"loss": summary.loss, "samples": summary.samples, **summary.scalars, **{
        f"baseline {k}": v for k, v in summary.baseline_scalars.items()
    }}  # fmt: skip


@pytest.mark.parametrize(
    "shares",
    [
        {0: [[0, 1, 2], [3]], 1: [[4, 5], [6]]},
        {0: [[0, 1, 2, 3, 4, 5, 6]], 1: []},  # rank 1 evaluates nothing and still joins the sums
    ],
    ids=["unequal", "one-rank-empty"],
)
def test_two_ranks_give_the_numbers_of_one_process(shares):
    one = evaluate_share(-1, {0: [[0, 1], [2, 3, 4, 5, 6]]})
    two = run_ranks(2, evaluate_share, shares)
    assert two[0] == two[1]
    assert two[0].keys() == one.keys() and two[0]["samples"] == SAMPLES
    for key, value in one.items():
        assert two[0][key] == pytest.approx(value, rel=1e-6), key
