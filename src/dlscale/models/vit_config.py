"""The ViT's ``model:`` config section: its shape, independent of the data (no torch)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from dlscale.errors import InvalidValue


@dataclass
class ViTConfig:
    """The `model:` section of a run config: the shape of the ViT, independent of the data."""

    # width of every token (the transformer's hidden size D)
    embed_dim: int = 384
    # number of transformer blocks
    depth: int = 12
    # attention heads per block; embed_dim must be a multiple of it
    num_heads: int = 8
    # side of the square patch that becomes one token; must divide both image sides
    patch_size: int = 8
    # MLP hidden width as a multiple of embed_dim
    mlp_ratio: float = 4.0
    # token dropout, attention dropout and the largest drop-path rate at once, as in the reference
    dropout: float = 0.0
    # whether q, k and v carry a bias (proj always does)
    qkv_bias: bool = True
    # epsilon of every LayerNorm
    norm_eps: float = 1e-6

    # Keys a resumed run may change: they do not change what the saved weights mean (see resume.py).
    RESUME_SAFE_KEYS: ClassVar[tuple[str, ...]] = ("dropout",)

    def __post_init__(self) -> None:
        for name in ("embed_dim", "depth", "num_heads", "patch_size"):
            value = getattr(self, name)
            if value < 1:
                raise InvalidValue(name, f"must be at least 1, got {value}")
        if self.embed_dim % self.num_heads != 0:
            raise InvalidValue(
                "embed_dim",
                f"{self.embed_dim} is not a multiple of num_heads={self.num_heads} "
                f"(it would need a head dim of {self.embed_dim / self.num_heads:g}); "
                f"use a multiple of {self.num_heads}, e.g. {self.num_heads * max(1, self.embed_dim // self.num_heads)}",
            )
        if not 0.0 <= self.dropout < 1.0:
            raise InvalidValue("dropout", f"must be in [0, 1), got {self.dropout}")
        if not (self.mlp_ratio > 0 and math.isfinite(self.mlp_ratio)):
            raise InvalidValue("mlp_ratio", f"must be a finite number > 0, got {self.mlp_ratio}")
        hidden = self.mlp_ratio * self.embed_dim
        # A fractional width would be truncated silently; refuse it so the model is what the config says.
        if hidden < 1 or hidden != int(hidden):
            raise InvalidValue(
                "mlp_ratio",
                f"mlp_ratio * embed_dim = {self.mlp_ratio} * {self.embed_dim} = {hidden:g} "
                "must be a whole number of at least 1 (the MLP hidden width)",
            )
        if not (self.norm_eps > 0 and math.isfinite(self.norm_eps)):
            raise InvalidValue("norm_eps", f"must be a finite number > 0, got {self.norm_eps}")

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.embed_dim // self.num_heads

    @property
    def mlp_hidden_dim(self) -> int:
        """Width of the MLP's hidden layer."""
        return int(self.mlp_ratio * self.embed_dim)
