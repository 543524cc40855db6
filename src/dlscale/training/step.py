"""One optimizer step: set the LR, forward, loss, backward, optional clipping, update.

Kept apart from the loop so that faster ways of running the same step (a CUDA-graph-captured step, see
:mod:`dlscale.training.graphs`) replace this class without touching the loop. Mixed precision and compilation
are not separate step classes: the step runs ``forward`` (the model, or its compiled form) under the
:class:`~dlscale.training.precision.Precision`'s autocast.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dlscale.parallel.shard_specs import clip_grad_norm_sharded, gradient_norm_sharded
from dlscale.runtime.distributed import any_rank
from dlscale.runtime.nvtx import NO_MARKERS, StepMarkers
from dlscale.training.precision import Precision
from dlscale.training.schedule import LRSchedule
from dlscale.training.training_loss import ModelForLoss, TrainingLoss

LossFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class TrainStep:
    """Runs one training step on a batch that is already on the device; returns the loss (not synchronized).

    ``model`` owns the parameters; ``forward`` (default: the model) computes predictions and may be its
    ``torch.compile``-d form. ``markers`` names the forward/backward/optimizer phases for profilers.

    ``skip_nonfinite`` (the divergence policy ``skip``) checks the loss and the gradient norm before the update
    and leaves the weights and the optimizer state untouched when either is NaN or infinite, as fp16's
    GradScaler does for overflows; that check is a host sync every step. Under fp16 the scaler keeps handling
    gradient overflows itself (they are routine while it finds its scale), so only the loss is checked.
    ``spike_check`` (loss -> device bool, :class:`~dlscale.training.divergence.loss_spike.LossSpikeWatch`) also skips a
    step whose finite loss is an explosion.

    ``training_loss`` (the workload's hook, :mod:`dlscale.training.training_loss`) replaces ``loss_fn(forward(
    inputs), targets)``: it gets the model (``forward`` under autocast), the batch and the global step.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        loss_fn: LossFunction,
        optimizer: torch.optim.Optimizer,
        schedule: LRSchedule,
        max_grad_norm: float | None = None,
        precision: Precision | None = None,
        forward: Callable[[torch.Tensor], torch.Tensor] | None = None,
        markers: StepMarkers = NO_MARKERS,
        skip_nonfinite: bool = False,
        spike_check: Callable[[torch.Tensor], torch.Tensor] | None = None,
        training_loss: TrainingLoss | None = None,
    ):
        self.model = model
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.schedule = schedule
        self.max_grad_norm = max_grad_norm
        self.precision = precision or Precision("none", _device_of(model))
        self.forward = model if forward is None else forward
        self.markers = markers
        self.skip_nonfinite = skip_nonfinite
        self.last_grad_norm: torch.Tensor | None = (
            None  # of the last step, where clipping or skipping computed it
        )
        self.skipped = False  # the last step's update was skipped (skip_nonfinite and a NaN/inf value)
        self.spike_check = spike_check
        self.last_spike = False  # the last skip was for this rank's loss spiking (for the log line)
        self.training_loss = training_loss
        self.model_for_loss = ModelForLoss(self.forward, self.precision)

    def set_lr(self, global_step: int) -> None:
        lr = self.schedule.lr_at(global_step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor, global_step: int) -> torch.Tensor:
        self.set_lr(global_step)
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.forward_backward(inputs, targets, global_step)
        self.update(loss)
        return loss.detach()

    def forward_backward(
        self, inputs: torch.Tensor, targets: torch.Tensor, global_step: int = 0
    ) -> torch.Tensor:
        """Forward under autocast, the loss in fp32 (or the workload's ``training_loss`` of the batch at
        ``global_step``), and backward (scaled under fp16); returns the loss."""
        with self.markers.range("forward"):
            if self.training_loss is not None:
                loss = self.training_loss(self.model_for_loss, (inputs, targets), global_step)
            else:
                with self.precision.autocast():
                    predictions = self.forward(inputs)
                loss = self.loss_fn(predictions.float(), targets)
                # Autograd keeps what backward needs; holding the output here too would keep one more full-size
                # output tensor alive through backward, at the step's memory peak.
                del predictions
        with self.markers.range("backward"):
            self.precision.backward(loss)
        return loss

    def update(self, loss: torch.Tensor | None = None) -> None:
        """Unscale (fp16), clip, and apply the gradients (unless ``skip_nonfinite`` finds ``loss`` or them
        not finite)."""
        with self.markers.range("optimizer"):
            self.precision.unscale(self.optimizer)
            self.last_grad_norm = None
            if self.max_grad_norm is not None:
                # The serial model's gradient norm, also when tensor parallelism shards the parameters.
                self.last_grad_norm = clip_grad_norm_sharded(self.model, self.max_grad_norm)
            elif self.skip_nonfinite and self.precision.scaler is None:
                self.last_grad_norm = gradient_norm_sharded(self.model)
            self.skipped = self.skip_nonfinite and loss is not None and not self._finite(loss)
            if self.skipped:
                self.precision.skip_update()
                return
            self.precision.step(self.optimizer)

    def _finite(self, loss: torch.Tensor) -> bool:
        """Whether this step's loss (and gradient norm) are finite on every rank: all ranks skip alike."""
        finite = torch.isfinite(loss.detach())
        if self.last_grad_norm is not None and self.precision.scaler is None:
            finite = finite & torch.isfinite(self.last_grad_norm.to(finite.device))
        spike = self.spike_check(loss.detach()).to(finite.device) if self.spike_check is not None else None
        self.last_spike = bool(finite) and spike is not None and bool(spike)
        acceptable = bool(finite) and not self.last_spike
        return not any_rank(not acceptable, loss.device)


def _device_of(model: torch.nn.Module):
    from dlscale.runtime.device import Device

    parameter = next(model.parameters(), None)
    return Device(parameter.device if parameter is not None else "cpu")
