"""Noticing NaN and infinity cheaply: a device-side record of the first bad step, and a scan of a state.

``NonFiniteWatch.record`` queues a few scalar kernels per step and never waits for the device; the trainer
reads the record (one host sync) only every ``train.nonfinite_check_every`` steps, at epoch ends and before
checkpoints. ``first_nonfinite`` checks a whole checkpoint payload with one reduction and one sync.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from dlscale.runtime.distributed import min_across_ranks


class NonFiniteWatch:
    """Device-side record of the first step whose loss or gradient norm was not finite.

    ``record`` queues a few scalar kernels and never waits for the device; ``poll`` is the one host sync, and
    every rank must call it at the same step (it agrees with the others on the earliest bad step).
    """

    def __init__(self, device: torch.device, check_every: int):
        self.device = torch.device(device)
        self.check_every = check_every
        self._current = torch.zeros((), dtype=torch.int64, device=self.device)
        self._no_norm = torch.zeros((), dtype=torch.float64, device=self.device)
        self.reset()

    def reset(self) -> None:
        """Forget what was recorded (after a rollback)."""
        self._first_step = torch.full((), -1, dtype=torch.int64, device=self.device)
        self._first_values = torch.zeros(2, dtype=torch.float64, device=self.device)  # loss, gradient norm
        self._norm_seen = False

    def due(self, global_step: int) -> bool:
        """Whether the trainer reads the record after the step that made ``global_step`` steps."""
        return global_step % self.check_every == 0

    def record(self, loss: torch.Tensor, grad_norm: torch.Tensor | None, step: int) -> None:
        """Note step ``step``'s loss and (when computed) gradient norm; no host sync."""
        loss = loss.detach().reshape(()).to(torch.float64)
        bad = ~torch.isfinite(loss)
        norm = self._no_norm
        if grad_norm is not None:
            grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
            norm = grad_norm.detach().reshape(()).to(device=loss.device, dtype=torch.float64)
            bad = bad | ~torch.isfinite(norm)
            self._norm_seen = True
        first = bad & (self._first_step < 0)
        self._current.fill_(step)  # a kernel with a scalar argument: no host-to-device copy to wait for
        self._first_step = torch.where(first, self._current, self._first_step)
        self._first_values = torch.where(first, torch.stack((loss, norm)), self._first_values)

    def poll(self) -> tuple[int, float | None, float | None] | None:
        """(step, loss, gradient norm) of the earliest non-finite step on any rank, or None if all were finite.

        The values are this rank's when it saw that step itself, else None (another rank saw it).
        """
        local = int(self._first_step)
        earliest = min_across_ranks(float(local) if local >= 0 else math.inf, self.device)
        if math.isinf(earliest):
            return None
        if local != int(earliest):
            return int(earliest), None, None
        loss, norm = self._first_values.tolist()
        return local, loss, norm if self._norm_seen else None


def first_nonfinite(state: Any, where: str = "") -> str | None:
    """The name of the first floating-point tensor in ``state`` (nested dicts/lists) holding NaN or inf."""
    tensors = list(_floating_tensors(state, where))
    if not tensors:
        return None
    # One reduction on the device and one sync for the whole state; the name is searched only when needed.
    flags = torch.stack([torch.isfinite(t).all().to(tensors[0][1].device) for _, t in tensors])
    if bool(flags.all()):
        return None
    for name, tensor in tensors:
        if not bool(torch.isfinite(tensor).all()):
            return name
    return None


def _floating_tensors(value: Any, where: str) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() or value.is_complex():
            yield where, value.detach()
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _floating_tensors(item, f"{where}[{key!r}]" if where else str(key))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _floating_tensors(item, f"{where}[{index}]")
