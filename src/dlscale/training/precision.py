"""Mixed precision: autocast for the forward pass, and a gradient scaler for fp16 only.

bf16 has fp32's exponent range, so its gradients do not underflow and need no scaling; fp16 does, so an fp16
run scales the loss before backward and unscales the gradients before clipping and the update (and skips the
update when they overflowed). The loss itself is always computed in fp32 from the (possibly half-precision)
prediction: a relative L2 over a whole field sums millions of squares, which half precision would round badly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from dlscale.runtime.device import Device

AMP_DTYPES = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}


class Precision:
    """How the step computes: autocast dtype (or none) and the fp16 gradient scaler."""

    def __init__(self, amp_mode: str, device: Device):
        if amp_mode not in AMP_DTYPES:
            raise ValueError(f"amp_mode must be one of {', '.join(AMP_DTYPES)}, got {amp_mode!r}")
        self.amp_mode = amp_mode
        self.dtype: torch.dtype | None = AMP_DTYPES[amp_mode]
        self.device_type = device.torch.type
        self.cache_enabled = True  # autocast's cache of low-precision weight copies; off under CUDA graphs
        self.scaler: torch.amp.GradScaler | None = (
            torch.amp.GradScaler(self.device_type) if amp_mode == "fp16" else None
        )

    def autocast(self) -> contextlib.AbstractContextManager:
        """The forward pass's autocast region (a no-op context without AMP)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(
            device_type=self.device_type, dtype=self.dtype, cache_enabled=self.cache_enabled
        )

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of ``loss``, scaled first under fp16."""
        (loss if self.scaler is None else self.scaler.scale(loss)).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring fp16-scaled gradients back to their true size (before clipping reads them)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer update; under fp16 it is skipped when gradients overflowed, and the scale adapts."""
        if self.scaler is None:
            optimizer.step()
        else:
            self.scaler.step(optimizer)
            self.scaler.update()

    def skip_update(self) -> None:
        """Leave this step's update out (the divergence policy ``skip``); fp16's scaler still closes its step,
        lowering its scale as for an overflow."""
        if self.scaler is not None:
            self.scaler.update()

    def wrap_inference(self, forward: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
        """``forward`` run under this autocast, returning fp32 predictions (for validation)."""
        if self.dtype is None:
            return forward

        def predict(inputs: torch.Tensor) -> torch.Tensor:
            with self.autocast():
                return forward(inputs).float()

        return predict

    def state_dict(self) -> dict[str, Any] | None:
        """The scaler's state for checkpoints (None without fp16)."""
        return None if self.scaler is None else self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
