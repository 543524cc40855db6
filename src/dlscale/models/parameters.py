"""How many parameters a model has: one count for the start-of-run lines, the export's manifest and the tests."""

from __future__ import annotations

from torch import nn


def count_parameters(module: nn.Module) -> int:
    """Number of scalar parameters in ``module`` (shared tensors counted once; works on the meta device)."""
    return sum(param.numel() for param in module.parameters())
