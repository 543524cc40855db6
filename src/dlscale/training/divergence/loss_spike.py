"""Noticing a finite explosion: a step loss far above the median of the steps before it.

A learning rate that is too high often does not give NaN at once: one update throws the weights far out, the
next losses are finite but enormous (1e12 after 1.0), and only steps later do they overflow. Every policy of
``train.on_nonfinite`` treats such a *spike* as a sign of trouble, as it treats NaN: ``stop`` and ``rollback``
end or rewind the run, ``skip`` leaves the update out, and no checkpoint is written from the exploded weights.

The rule (``train.loss_spike_factor``, ``train.loss_spike_window``): a step's loss is a spike when it is more
than ``factor`` times the median of the last ``window`` accepted step losses (skipped and spiking steps are not
accepted, so a run that keeps exploding cannot raise its own median). The median rather than the mean, so that
one hard batch in the window does not move the bar; a factor of 100, so that the ordinary noise of a loss
(a few times up and down between batches) never trips it. ``factor: 0`` switches the rule off.

Everything stays on the device: a ring buffer of recent losses and a few small kernels per step, no host sync.
"""

from __future__ import annotations

import torch


class LossSpikeWatch:
    """The recent accepted step losses of a run (the same on every rank: they are the global batch's)."""

    def __init__(self, device: torch.device, factor: float, window: int):
        self.factor = factor
        self.window = window
        self.device = torch.device(device)
        self.reset()

    @property
    def enabled(self) -> bool:
        return self.factor > 0

    def reset(self) -> None:
        """Forget the history (after a rollback: the restored weights start a new one)."""
        self._history = torch.full(
            (max(self.window, 1),), float("nan"), dtype=torch.float64, device=self.device
        )
        self._next = 0
        self._first_step = torch.full((), -1, dtype=torch.int64, device=self.device)
        self._first_values = torch.zeros(2, dtype=torch.float64, device=self.device)  # loss, median

    def median(self) -> torch.Tensor:
        """The median of the accepted losses so far (NaN while there are none), on the device."""
        return torch.nanmedian(self._history)

    def is_spike(self, loss: torch.Tensor) -> torch.Tensor:
        """A device-side bool: ``loss`` is more than ``factor`` x the median of the history (False when empty
        or switched off)."""
        loss = loss.detach().reshape(()).to(device=self.device, dtype=torch.float64)
        if not self.enabled:
            return torch.zeros((), dtype=torch.bool, device=self.device)
        median = self.median()
        # A NaN median (no history yet) compares False; a non-finite loss is the NaN check's business.
        return torch.isfinite(loss) & (loss > self.factor * median.abs())

    def accept(self, loss: torch.Tensor, accepted: torch.Tensor | bool = True) -> None:
        """Add a step's loss to the history when ``accepted`` (a device bool: no host sync) and finite."""
        if not self.enabled:
            return
        loss = loss.detach().reshape(()).to(device=self.device, dtype=torch.float64)
        keep = torch.as_tensor(accepted, device=self.device) & torch.isfinite(loss)
        slot = self._next % self._history.numel()
        # Written only when kept: a rejected step leaves the slot as it was, and the write position moves on
        # only on the host's count of steps, so the ring may hold fewer than `window` losses after rejections.
        self._history[slot] = torch.where(keep, loss, self._history[slot])
        self._next += 1

    def record(self, loss: torch.Tensor, step: int) -> None:
        """Note step ``step``'s loss (the global batch's): remember it as the first spike if it is one, else add
        it to the history. No host sync."""
        if not self.enabled:
            return
        loss = loss.detach().reshape(()).to(device=self.device, dtype=torch.float64)
        spike = self.is_spike(loss)
        first = spike & (self._first_step < 0)
        self._first_step = torch.where(first, torch.full_like(self._first_step, step), self._first_step)
        self._first_values = torch.where(first, torch.stack((loss, self.median())), self._first_values)
        self.accept(loss, ~spike)

    def poll(self) -> tuple[int, float, float] | None:
        """(step, loss, median before it) of the first spike recorded, or None; one host sync. The losses are
        the global batch's, so every rank finds the same."""
        if not self.enabled:
            return None
        step = int(self._first_step)
        if step < 0:
            return None
        loss, median = self._first_values.tolist()
        return step, loss, median

    def describe(self, loss: float, median: float) -> str:
        """e.g. 'the loss 1.27e+12 is more than 100x the median 1.002 of the losses before it (...)'."""
        return (
            f"the loss {loss:.4g} is more than {self.factor:g}x the median {median:.4g} of the losses before it "
            f"(a finite explosion; the last {self.window} steps at most; train.loss_spike_factor, 0 switches "
            "it off)"
        )
