"""Context parallelism: the token sequence is split over the cp ranks between the embedding and the head.

Each cp rank runs the blocks on its own tokens; attention gathers keys and values over cp (see
:class:`~dlscale.parallel.tensor_parallel.ColumnParallelLinear`), and the head's output is gathered back into
the full sequence, so the loss is the serial loss on every cp rank.

Why the gradient scaling: every parameter used after the split (blocks, final norm, head) gets, on each cp
rank, only the part of its gradient that comes from that rank's tokens; the serial gradient is the *sum* over the
cp ranks. Data parallelism averages gradients over the dp x cp ranks that hold the same parameters. Scaling the
gradient flowing back into the split region by cp makes that average the sum over cp (and the mean over dp), so
one all-reduce (or FSDP's reduce-scatter) does both, with no extra communication. The split itself undoes the
scaling on the way back, so the embedding's gradients (computed from the full, gathered sequence) stay exact.
The NERSC tutorial reduces block parameters over cp but forgets the final norm; here no parameter is singled out,
which the equality tests check for every parameter.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dlscale.parallel.collectives import Group, gather_from_group, scale_gradient, scatter_to_group


class SplitSequence(nn.Module):
    """(B, tokens, D) -> this rank's chunk of the tokens (the chunks of ``split_sizes``)."""

    def __init__(self, group: Group, size: int):
        super().__init__()
        self.group, self.size = group, size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return scale_gradient(scatter_to_group(x, 1, self.group), 1.0 / self.size)

    def extra_repr(self) -> str:
        return f"context_parallel={self.size}"


class SequenceGatheredLinear(nn.Module):
    """A replicated linear whose per-token outputs are gathered into the full sequence over the cp group."""

    def __init__(self, linear: nn.Linear, group: Group, size: int, sequence_sizes: list[int]):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.group, self.size, self.sequence_sizes = group, size, list(sequence_sizes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = scale_gradient(F.linear(x, self.weight, self.bias), float(self.size))
        return gather_from_group(y, 1, self.sequence_sizes, self.group)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, sequence gathered"
