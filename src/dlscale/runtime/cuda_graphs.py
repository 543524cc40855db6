"""The CUDA pieces of graph capture (see :mod:`dlscale.training.graphs` for what is captured and why).

Graphs exist only on CUDA devices; callers check ``Device.is_gpu`` before using any of this.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def on_side_stream(device: torch.device) -> Iterator[None]:
    """Run the block on a fresh side stream that starts after, and is waited for by, the current stream.

    Capture needs its warm-up iterations off the default stream (cuDNN and cuBLAS set up per stream).
    """
    current = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device=device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        yield
    current.wait_stream(side)


def new_graph() -> torch.cuda.CUDAGraph:
    return torch.cuda.CUDAGraph()


def capture(graph: torch.cuda.CUDAGraph) -> contextlib.AbstractContextManager:
    """Record the block's kernels into ``graph`` (they are not run; ``graph.replay()`` runs them).

    ``thread_local``: the data pipeline's threads keep querying events and allocating pinned memory while
    the training thread captures; in the default ``global`` mode such calls from any thread break the capture.
    """
    return torch.cuda.graph(graph, capture_error_mode="thread_local")


def random_state(device: torch.device) -> torch.Tensor:
    """The device's random generator state (dropout draws from it)."""
    return torch.cuda.get_rng_state(device)


def restore_random_state(state: torch.Tensor, device: torch.device) -> None:
    torch.cuda.set_rng_state(state, device)
