"""CUDA graphs: record the training step's kernels once, then replay them with one launch per step.

A replay skips Python and the per-kernel launch cost, which matters when a step is many small kernels. What
is captured:

* forward, loss and backward, always;
* the optimizer update too, when it can run without the host: Adam or AdamW, with no fp16 gradient scaler
  (the scaler reads the overflow flag on the host to decide whether to skip the update). The optimizer is then
  built ``capturable`` and its learning rate lives in a device tensor that each step overwrites, because a
  Python float would be frozen into the graph. Gradient clipping is captured with it (it never syncs).

What cannot be captured, and runs eagerly instead:

* the fp16 ``GradScaler`` step and SGD's update (as above);
* a batch of another shape (the last, short batch of an epoch): graphs replay fixed shapes, so that step runs
  eagerly on the same parameters, gradients and optimizer state;
* validation, which runs the eager model.

Capture needs warm-up steps on a side stream (cuDNN/cuBLAS pick their algorithms and allocate workspaces there,
and the optimizer creates its state). Those steps would train the model on the first batch, so the weights,
buffers, optimizer state and the device's random state are saved before and restored in place after: the
graphed run starts from exactly the state an eager run would. Capture waits for the first full batch. Dropout draws different random numbers under a graph, so graphed and eager runs
agree to floating-point tolerance only without dropout.
"""

from __future__ import annotations

import logging

import torch

from dlscale.runtime.cuda_graphs import (
    capture,
    new_graph,
    on_side_stream,
    random_state,
    restore_random_state,
)
from dlscale.training.step import TrainStep

log = logging.getLogger("dlscale.train")

CAPTURABLE_OPTIMIZERS = (torch.optim.Adam, torch.optim.AdamW)


def optimizer_is_capturable(optimizer_name: str, amp_mode: str) -> bool:
    """Whether a graphed step also captures the update (see the module docstring)."""
    return optimizer_name in ("Adam", "AdamW") and amp_mode != "fp16"


class GraphedTrainStep(TrainStep):
    """A :class:`TrainStep` that captures itself on its first full batch and replays the graph afterwards."""

    def __init__(self, *args, batch_size: int, warmup_steps: int = 20, **kwargs):
        super().__init__(*args, **kwargs)
        if self.training_loss is not None:
            raise ValueError("a graphed step cannot run a workload's training_loss (see training_loss.py)")
        self.batch_size = batch_size  # capture waits for a full batch (a run may resume at a short last one)
        self.warmup_steps = warmup_steps
        self.capture_optimizer = (
            isinstance(self.optimizer, CAPTURABLE_OPTIMIZERS) and self.precision.scaler is None
        )
        if self.capture_optimizer and not all(g.get("capturable") for g in self.optimizer.param_groups):
            # fused=True alone is not enough: the optimizer refuses to be captured unless capturable is set.
            raise ValueError("a graphed optimizer step needs an optimizer built with capturable=True")
        # Autocast's weight-cast cache would hold tensors made during capture, which replays cannot refresh.
        self.precision.cache_enabled = False
        self.graph = None  # the captured graph, after the first full batch
        self.static_inputs: torch.Tensor | None = None
        self.static_targets: torch.Tensor | None = None
        self.static_loss: torch.Tensor | None = None
        self.lr_tensor: torch.Tensor | None = None
        self.eager_steps = 0  # steps that could not replay (other shapes)

    def set_lr(self, global_step: int) -> None:
        if self.lr_tensor is None:
            super().set_lr(global_step)
        else:
            self.lr_tensor.fill_(self.schedule.lr_at(global_step))  # a kernel, not a host sync

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor, global_step: int) -> torch.Tensor:
        if self.graph is None:
            if inputs.shape[0] != self.batch_size:
                return self._eager_step(inputs, targets, global_step)
            self._capture(inputs, targets)
        if inputs.shape != self.static_inputs.shape or targets.shape != self.static_targets.shape:
            return self._eager_step(inputs, targets, global_step)
        self.set_lr(global_step)
        self.static_inputs.copy_(inputs, non_blocking=True)
        self.static_targets.copy_(targets, non_blocking=True)
        self.graph.replay()
        if not self.capture_optimizer:
            self.update()
        return self.static_loss.detach().clone()  # the static tensor is overwritten by the next replay

    def _eager_step(self, inputs: torch.Tensor, targets: torch.Tensor, global_step: int) -> torch.Tensor:
        """A step outside the graph. Gradients are zeroed in place, never freed: the graph writes into them."""
        self.eager_steps += 1
        self.set_lr(global_step)
        self.optimizer.zero_grad(set_to_none=False)
        loss = self.forward_backward(inputs, targets)
        self.update(loss)
        return loss.detach()

    def _capture(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        log.info(
            "CUDA graphs: %d warm-up steps, then capturing forward, loss, backward%s",
            self.warmup_steps,
            " and the optimizer step" if self.capture_optimizer else " (optimizer step eager)",
        )
        self.static_inputs = inputs.detach().clone()
        self.static_targets = targets.detach().clone()
        if self.capture_optimizer:
            self.lr_tensor = torch.tensor(
                float(self.optimizer.param_groups[0]["lr"]), dtype=torch.float32, device=inputs.device
            )
            for group in self.optimizer.param_groups:
                group["lr"] = self.lr_tensor
        saved = _SavedState(self.model, self.optimizer)

        with on_side_stream(inputs.device):
            for _ in range(self.warmup_steps):
                self.optimizer.zero_grad(set_to_none=True)
                self.forward_backward(self.static_inputs, self.static_targets)
                if self.capture_optimizer:
                    self.update()  # creates the optimizer state, which capture cannot allocate and fill
        saved.restore()

        self.optimizer.zero_grad(set_to_none=True)  # gradients are then allocated in the graph's memory pool
        self.graph = new_graph()
        with capture(self.graph):
            self.static_loss = self.forward_backward(self.static_inputs, self.static_targets)
            if self.capture_optimizer:
                self.update()
        # Capture recorded the kernels without running them; the first replay runs the first step.


class _SavedState:
    """Copies of the weights, buffers and optimizer state, restored in place (addresses must not change)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer
        self.tensors = [(t, t.detach().clone()) for t in (*model.parameters(), *model.buffers())]
        self.device = next(model.parameters()).device
        self.random_state = random_state(self.device)  # the warm-up's dropout must not shift the run's draws
        self.optimizer_state = {
            id(p): {k: v.detach().clone() for k, v in state.items() if torch.is_tensor(v)}
            for p, state in optimizer.state.items()
        }

    @torch.no_grad()
    def restore(self) -> None:
        restore_random_state(self.random_state, self.device)
        for tensor, copy in self.tensors:
            tensor.copy_(copy)
        for param, state in self.optimizer.state.items():
            before = self.optimizer_state.get(id(param), {})
            for key, value in state.items():
                if not torch.is_tensor(value):
                    continue
                if key in before:
                    value.copy_(before[key])
                else:
                    # State created by the warm-up: a fresh Adam state is all zeros (moments and step count).
                    value.zero_()
