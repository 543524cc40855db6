"""The 3D U-Net's ``model:`` config section: depth, width, initialization, the loss's density term (no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from dlscale.errors import InvalidValue

_WEIGHT_INIT_KEYS = {"conv_init", "conv_scale", "conv_bias"}


@dataclass
class UNetConfig:
    """The ``model:`` section: depth, width, initialization, and the loss's density term."""

    full_scale: bool = True  # six levels (down to 1^3 from a 64^3 crop); false: five
    base_channels: int = 64  # width of the first level; the others are 2x, 4x, 8x, 8x, 8x of it
    weight_init: Any = field(
        default_factory=lambda: {"conv_init": "normal", "conv_scale": 0.02, "conv_bias": 0.0}
    )  # the tutorial's mapping: every conv weight ~ N(0, conv_scale), bias = conv_bias
    lambda_rho: float = 0.0  # weight of L1(exp(14 pred_0), exp(14 target_0)) added to the L1 loss
    # Keep weights and activations channels-last (NDHWC) instead of the tutorial's NCDHW: the same math. Off by
    # default: a CPU training step at the tutorial's size ran at 0.58x NCDHW's speed (no different at the demo's;
    # benchmarks/unet_memory_layout.py); not yet measured on a GPU. FSDP2 cannot shard channels-last weights.
    channels_last: bool = False

    # Keys a resumed run may change: they do not change what the saved weights mean (see resume.py).
    RESUME_SAFE_KEYS: ClassVar[tuple[str, ...]] = ("weight_init", "lambda_rho", "channels_last")

    def __post_init__(self) -> None:
        if self.base_channels < 1:
            raise InvalidValue("base_channels", f"must be >= 1, got {self.base_channels}")
        if self.lambda_rho < 0:
            raise InvalidValue("lambda_rho", f"must be >= 0, got {self.lambda_rho}")
        init = self.weight_init
        if not isinstance(init, dict) or set(init) != _WEIGHT_INIT_KEYS:
            raise InvalidValue(
                "weight_init",
                f"expected a mapping with keys {sorted(_WEIGHT_INIT_KEYS)}, e.g. {{conv_init: normal, "
                f"conv_scale: 0.02, conv_bias: 0.}}; got {init!r}",
            )
        if init["conv_init"] != "normal":
            raise InvalidValue(
                "weight_init", f"conv_init: only 'normal' is supported, got {init['conv_init']!r}"
            )
        if not isinstance(init["conv_scale"], (int, float)) or init["conv_scale"] <= 0:
            raise InvalidValue("weight_init", f"conv_scale must be a number > 0, got {init['conv_scale']!r}")
        if not isinstance(init["conv_bias"], (int, float)):
            raise InvalidValue("weight_init", f"conv_bias must be a number, got {init['conv_bias']!r}")

    @property
    def levels(self) -> int:
        return 6 if self.full_scale else 5

    def widths(self) -> list[int]:
        """Output channels of the down path's levels."""
        c = self.base_channels
        return [c, 2 * c, 4 * c, 8 * c, 8 * c, 8 * c][: self.levels]
