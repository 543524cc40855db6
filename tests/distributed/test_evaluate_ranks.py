"""``dlscale evaluate`` on forked gloo ranks: a checkpoint that 2 tensor-parallel ranks wrote evaluates in one
process to that run's own final validation, and 2 ranks (sharing the samples, or the model with tp=2) give the
numbers of one process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from forked_ranks import run_ranks
from run_configs import tiny_run_config

import dlscale
from dlscale.run.training import train

CONFIG_FILE = Path(__file__).resolve().parents[2] / "configs" / "vit_era5.yaml"
SAME = 1e-5  # a sum over ranks, or a matmul split over them, adds in another order


def train_rank(rank: int, data: Path, expdir: Path) -> int:
    overrides = ("train.num_epochs=1", "parallel.tensor_parallel=2")
    return train(tiny_run_config(CONFIG_FILE, data, expdir, *overrides))


def evaluate_rank(rank: int, run: Path, overrides: tuple[str, ...]) -> dict:
    return dlscale.evaluate(run, overrides=overrides)


@pytest.fixture(scope="module")
def tp_run(tiny_era5: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One epoch of the tiny ERA5 config trained by 2 tensor-parallel ranks (its checkpoint holds the serial
    model's state)."""
    expdir = tmp_path_factory.mktemp("tp_runs")
    assert run_ranks(2, train_rank, tiny_era5, expdir) == [0, 0]
    return expdir / "tiny" / "00"


def same_metrics(document: dict, reference: dict) -> None:
    assert document["samples"] == reference["samples"] == 23
    assert document["loss"] == pytest.approx(reference["loss"], rel=SAME)
    assert document["metrics"] == pytest.approx(reference["metrics"], rel=SAME)
    assert document["baseline_metrics"] == pytest.approx(reference["baseline_metrics"], rel=SAME)


@pytest.mark.slow
def test_two_ranks_give_the_numbers_of_one_process(tp_run):
    final = json.loads((tp_run / "summary.json").read_text())["final"]
    one = dlscale.evaluate(tp_run)
    assert one["world_size"] == 1 and one["layout"].startswith("dp=1 x tp=1 x cp=1")
    # the 2-rank tensor-parallel run's checkpoint in one process: that run's own final validation
    assert one["loss"] == pytest.approx(final["val_loss"], rel=SAME)
    assert one["metrics"] == pytest.approx(final["metrics"], rel=SAME)
    for overrides, layout in (((), "dp=2 x tp=1"), (("parallel.tensor_parallel=2",), "dp=1 x tp=2")):
        documents = run_ranks(2, evaluate_rank, tp_run, overrides)
        assert documents[0] == documents[1]  # every rank returns rank 0's document
        assert documents[0]["world_size"] == 2 and documents[0]["layout"].startswith(layout)
        same_metrics(documents[0], one)
        written = json.loads((tp_run / "eval" / "valid-ckpt_latest" / "metrics.json").read_text())
        assert written == documents[0]
