"""One optimizer step: set the LR, forward, loss, backward, optional clipping, update.

Kept apart from the loop so that faster ways of running the same step (mixed precision, compiled or
graph-captured steps) replace this class without touching the loop.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dlscale.train.schedule import LRSchedule

LossFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class TrainStep:
    """Runs one training step on a batch that is already on the device; returns the loss (not synchronized)."""

    def __init__(
        self,
        model: torch.nn.Module,
        loss_fn: LossFunction,
        optimizer: torch.optim.Optimizer,
        schedule: LRSchedule,
        max_grad_norm: float | None = None,
    ):
        self.model = model
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.schedule = schedule
        self.max_grad_norm = max_grad_norm

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor, global_step: int) -> torch.Tensor:
        lr = self.schedule.lr_at(global_step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model(inputs), targets)
        loss.backward()
        if self.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        self.optimizer.step()
        return loss.detach()
