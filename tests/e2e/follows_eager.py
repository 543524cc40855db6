"""Comparing a bf16 or torch.compile run with the same config run eagerly in fp32: their losses step by step and
epoch by epoch, to tolerances that say what each switch may change."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from dlscale.run.training import train
from dlscale.training.observer import Observer

# torch.compile (inductor, CPU) runs the same float32 arithmetic as eager, but in its own generated kernels: fused
# pointwise ops and reductions (BatchNorm statistics, log_softmax, the loss's mean) sum in another order and
# vectorize differently from ATen's, so results differ in the last bits and are not bitwise equal (observed: at
# most 2e-7 relative on the losses of these tiny runs; those differences grow only slowly over a few steps).
# The tolerance is 50 times what was observed and still 80 times below the smallest change another seed makes
# to an epoch's loss (8e-4).
COMPILED_REL = 1e-5

# bf16 keeps 8 significant bits: each rounding errs by at most u = 2**-8 (3.9e-3) relative. The first step
# runs on the same weights and batch in both runs, autocast rounds the inputs of matmuls and convolutions to
# bf16, and the loss (in fp32) averages those errors over the batch, so the first loss stays well within u:
# observed at most 4e-4, while another seed (other weights, other batch) moves it by at least 8e-3. Half of u
# tells the two apart.
BF16_FIRST_STEP_REL = 2.0**-9
# After the first update the runs train on different (bf16-rounded) gradients; adaptive optimizers (Adam,
# Adadelta with lr 1) turn small gradient differences into full-size update differences, so the gap grows
# over the epoch: observed up to 1.6e-2 on single steps and 5e-3 on an epoch's mean loss. 5e-2 allows ten
# times that and still fails a run that learns something else.
BF16_EPOCH_REL = 5e-2


class StepLosses(Observer):
    """The loss of every optimizer step, in order."""

    def __init__(self):
        self.losses: list[float] = []

    def on_step_end(self, trainer, loss) -> None:
        self.losses.append(float(loss))


@dataclass(frozen=True)
class Losses:
    """A run's step losses and, per epoch, its train and val losses from summary.json."""

    steps: list[float]
    train: list[float]
    val: list[float]


def train_and_keep_losses(cfg, run_dir: Path) -> Losses:
    """Train ``cfg`` (whose run directory is ``run_dir``) and return its losses."""
    steps = StepLosses()
    assert train(cfg, extra_observers=[steps]) == 0
    history = json.loads((run_dir / "summary.json").read_text())["history"]
    return Losses(steps.losses, [row["train_loss"] for row in history], [row["val_loss"] for row in history])


def assert_close(what: str, actual, expected, rel: float) -> None:
    # (a plain module: pytest does not rewrite its asserts, so the message says what was compared)
    assert actual == pytest.approx(expected, rel=rel), (
        f"{what}: {actual} vs eager fp32 {expected} (rel {rel:g})"
    )


def assert_follows_eager(run: Losses, eager: Losses, switch: str) -> None:
    """``run`` (trained with ``switch``: "bf16" or "compiled") has the losses of the eager fp32 run."""
    assert len(run.steps) == len(eager.steps) > 0 and len(run.train) == len(eager.train) > 0, (run, eager)
    if switch == "compiled":
        assert_close("compiled step losses", run.steps, eager.steps, COMPILED_REL)
        assert_close("compiled train losses", run.train, eager.train, COMPILED_REL)
        assert_close("compiled val losses", run.val, eager.val, COMPILED_REL)
    elif switch == "bf16":
        assert run.steps[0] != eager.steps[0], "bf16 computed exactly like fp32: autocast did not run"
        assert_close("bf16 first step loss", run.steps[0], eager.steps[0], BF16_FIRST_STEP_REL)
        assert_close("bf16 train losses", run.train, eager.train, BF16_EPOCH_REL)
        assert_close("bf16 val losses", run.val, eager.val, BF16_EPOCH_REL)
    else:
        raise ValueError(f"unknown switch {switch!r}")
