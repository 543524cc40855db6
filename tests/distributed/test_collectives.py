"""Each autograd collective's forward and backward against autograd of its serial equivalent.

Serial view: a tensor replicated over the ranks is *one* tensor, a per-rank tensor is one of several. Each rank
builds the same deterministic inputs for every rank, runs the collective on its own, and backpropagates
``sum(weight_r * output_r)``; the parent computes the serial function with autograd on all inputs at once and
compares values and gradients. Chunks are uneven (10 rows over 4 ranks: 3, 3, 2, 2) to cover gloo's padding.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from forked_ranks import run_ranks

from dlscale.parallel import collectives as C
from dlscale.parallel.collectives import split_sizes

WORLD, LENGTH, DIM = 4, 10, 1
SHAPE = (2, LENGTH, 3)  # the full tensor; chunks split dimension 1
SIZES = split_sizes(LENGTH, WORLD)


def full_input(seed: int) -> torch.Tensor:
    return torch.randn(SHAPE, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def chunk(x: torch.Tensor, rank: int) -> torch.Tensor:
    return x.narrow(DIM, sum(SIZES[:rank]), SIZES[rank])


def upstream(seed: int, like: torch.Tensor) -> torch.Tensor:
    return torch.randn(like.shape, generator=torch.Generator().manual_seed(1000 + seed), dtype=like.dtype)


# name -> (input on rank r, parallel op, is the output replicated (one tensor) or per rank)
CASES = {
    "copy_to": (lambda r: full_input(0), lambda x, g: C.copy_to_group(x, g), False),
    "reduce_from": (lambda r: full_input(r + 1), lambda x, g: C.reduce_from_group(x, g), True),
    "scatter_to": (lambda r: full_input(0), lambda x, g: C.scatter_to_group(x, DIM, g), False),
    "gather_from": (
        lambda r: chunk(full_input(0), r),
        lambda x, g: C.gather_from_group(x, DIM, SIZES, g),
        True,
    ),
    "all_gather_to": (
        lambda r: chunk(full_input(0), r),
        lambda x, g: C.all_gather_to_group(x, DIM, SIZES, g),
        False,
    ),
    "reduce_scatter": (lambda r: full_input(r + 1), lambda x, g: C.reduce_scatter_group(x, DIM, g), False),
}


def run_case(rank: int, name: str) -> tuple[np.ndarray, np.ndarray]:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        make_input, op, replicated = CASES[name]
        x = make_input(rank).clone().requires_grad_(True)
        y = op(x, dist.group.WORLD)
        weight = upstream(0 if replicated else rank, y)
        (weight * y).sum().backward()
        return y.detach().numpy(), x.grad.numpy()
    finally:
        dist.destroy_process_group()


def serial(name: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Outputs per rank and gradients per rank of the serial equivalent."""
    make_input, _, replicated = CASES[name]
    shared = name in ("copy_to", "scatter_to")  # one input tensor used by every rank
    if shared:
        inputs = [make_input(0).clone().requires_grad_(True)]
    else:
        inputs = [make_input(r).clone().requires_grad_(True) for r in range(WORLD)]
    if name == "copy_to":
        outputs = [inputs[0] for _ in range(WORLD)]
    elif name == "reduce_from":
        outputs = [sum(inputs)]
    elif name == "scatter_to":
        outputs = [chunk(inputs[0], r) for r in range(WORLD)]
    elif name == "gather_from":
        outputs = [torch.cat(inputs, DIM)]
    elif name == "all_gather_to":
        outputs = [torch.cat(inputs, DIM) for _ in range(WORLD)]
    else:  # reduce_scatter
        total = sum(inputs)
        outputs = [chunk(total, r) for r in range(WORLD)]
    loss = sum((upstream(0 if replicated else r, out) * out).sum() for r, out in enumerate(outputs))
    loss.backward()
    grads = [inputs[0].grad] * WORLD if shared else [x.grad for x in inputs]
    per_rank_outputs = outputs * WORLD if replicated else outputs
    return [o.detach() for o in per_rank_outputs], grads


@pytest.mark.parametrize("name", list(CASES))
def test_collective_matches_its_serial_equivalent(name):
    results = run_ranks(WORLD, run_case, name)
    expected_outputs, expected_grads = serial(name)
    for rank, (output, grad) in enumerate(results):
        np.testing.assert_allclose(
            output, expected_outputs[rank].numpy(), rtol=1e-12, err_msg=f"{name} out {rank}"
        )
        np.testing.assert_allclose(
            grad, expected_grads[rank].numpy(), rtol=1e-12, err_msg=f"{name} grad {rank}"
        )


def test_without_a_group_every_collective_is_the_identity():
    x = full_input(0).requires_grad_(True)
    outputs = [
        C.copy_to_group(x, None),
        C.reduce_from_group(x, None),
        C.scatter_to_group(x, DIM, None),
        C.gather_from_group(x, DIM, [LENGTH], None),
        C.all_gather_to_group(x, DIM, [LENGTH], None),
        C.reduce_scatter_group(x, DIM, None),
    ]
    for y in outputs:
        assert y is x


def test_scale_gradient_scales_only_the_gradient():
    x = full_input(0).requires_grad_(True)
    y = C.scale_gradient(x, 3.0)
    torch.testing.assert_close(y, x)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 3.0))
