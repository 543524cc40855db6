"""A workload's own training loss (``Workload.training_loss``): the hook for losses that need more than one
prediction and its target (multi-step rollouts, physics penalties, several inputs), and the model it is given.

The hook receives the model as a function, ``model(inputs) -> predictions``, that is the run's model as the
step would call it: data-parallel (DDP's gradient all-reduce, FSDP2's gathers), compiled with
``train.enable_jit``, under the run's autocast (``train.amp_mode``), and returning float32 predictions, so the
hook's own arithmetic (a loss, a concatenation for the next rollout step, a penalty) runs in float32 outside
autocast, as dlscale's default ``loss(model(inputs), targets)`` does. It may call it as often as it needs.

A CUDA-graph step cannot run the hook: a captured graph replays the kernels of one call, with the step number
and the Python branches of that call frozen in (see :func:`graphs_refusal`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dlscale.training.precision import Precision

Batch = tuple[torch.Tensor, torch.Tensor]
# (model, (inputs, targets), global step) -> the batch's scalar loss
TrainingLoss = Callable[[Callable[[torch.Tensor], torch.Tensor], Batch, int], torch.Tensor]


class ModelForLoss:
    """The run's model as the training-loss hook calls it: under the run's autocast, predictions in float32."""

    def __init__(self, forward: Callable[[torch.Tensor], torch.Tensor], precision: Precision):
        self.forward = forward
        self.precision = precision

    def __call__(self, inputs: torch.Tensor) -> torch.Tensor:
        with self.precision.autocast():
            predictions = self.forward(inputs)
        return predictions.float()


def graphs_refusal(workload_name: str) -> str:
    """Why ``train.cuda_graphs`` cannot run a workload with a training-loss hook, and what to do."""
    return (
        f"train.cuda_graphs cannot capture the training_loss of workload {workload_name!r} (a graph replays "
        "one call of it, its step number and Python branches frozen in); switch cuda_graphs off "
        "(--no-cuda_graphs) or remove training_loss"
    )
