"""The multi-step training loss: the model fed its own predictions for K steps, the loss the mean over them.

A batch is ``inputs`` (B, ...) and ``targets`` (B, K_max, ...): the K_max states after each input
(:class:`dlscale.data.rollout_samples.RolloutSamples`). At global step s with K = curriculum(s)::

    x_0 = inputs;  x_k = model(x_{k-1});  loss = (1 / K) * sum_{k=1..K} loss_fn(x_k, targets[:, k - 1])

The gradient flows through all K steps (the model learns what its own errors do to the next step), the way
FourCastNet fine-tunes on two steps and GraphCast's curriculum goes to twelve. Memory: autograd keeps every
step's activations, K times one step's; with ``checkpointing`` each step keeps only its input and recomputes
its activations during backward, one step at a time, so the peak stays near one step's, for one more forward
per step (measured in ``benchmarks/rollout_training_cost.py``).

The model is called as the training-loss hook gets it (:class:`~dlscale.training.training_loss.ModelForLoss`:
data-parallel, compiled and under autocast as configured, float32 out), so DDP, FSDP2, tensor/context
parallelism, AMP and compile need nothing here. Non-reentrant checkpointing replays autocast and the random
state (dropout) of the first forward, so the recomputed step is the step that was run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

from dlscale.training.rollout_curriculum import RolloutCurriculum

log = logging.getLogger("dlscale.train")

LossFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Model = Callable[[torch.Tensor], torch.Tensor]


def rollout_loss(
    model: Model,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    steps: int,
    loss_fn: LossFunction,
    checkpointing: bool = False,
    model_input: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """The mean of ``loss_fn`` over ``steps`` autoregressive steps from ``inputs``, the k-th prediction against
    ``targets[:, k - 1]`` (``targets``: (B, K_max, ...) with K_max >= ``steps``). ``model_input(k, state)``:
    what the model reads at step k (0 the first) from the state, when that is more than the state (the CRPS
    loss appends each member's noise); made outside the checkpointed call, so a recomputed step reads the
    same."""
    if targets.dim() < 2 or targets.shape[1] < steps:
        raise ValueError(
            f"a {steps}-step rollout needs targets of shape (B, >= {steps}, ...), got {tuple(targets.shape)}"
        )
    state, total = inputs, None
    for k in range(steps):
        read = state if model_input is None else model_input(k, state)
        state = checkpoint(model, read, use_reentrant=False) if checkpointing else model(read)
        step_loss = loss_fn(state, targets[:, k])
        total = step_loss if total is None else total + step_loss
    assert total is not None
    return total / steps


class RolloutLoss:
    """``Workload.training_loss`` for multi-step training: K from the curriculum at each global step."""

    def __init__(self, loss_fn: LossFunction, curriculum: RolloutCurriculum, checkpointing: bool = False):
        self.loss_fn = loss_fn
        self.curriculum = curriculum
        self.checkpointing = checkpointing
        self.steps_now: int | None = None  # K of the last call (the log says when it changes)

    def __call__(
        self, model: Model, batch: tuple[torch.Tensor, torch.Tensor], global_step: int
    ) -> torch.Tensor:
        inputs, targets = batch
        steps = self.curriculum.steps_at(global_step)
        if steps != self.steps_now:
            log.info("Multi-step training: %d-step rollouts from global step %d on", steps, global_step)
            self.steps_now = steps
        return rollout_loss(model, inputs, targets, steps, self.loss_fn, self.checkpointing)
