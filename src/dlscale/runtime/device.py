"""The device layer: the one place that knows whether training runs on a GPU or on the CPU.

Everything else asks a :class:`Device` to synchronize, move tensors or report memory, and never calls
``torch.cuda`` itself. On the CPU the GPU-only operations are harmless no-ops.
"""

from __future__ import annotations

import os

import torch


class Device:
    """A compute device: ``cuda:<n>`` when a GPU is present, else the CPU."""

    def __init__(self, torch_device: torch.device | str):
        self.torch = torch.device(torch_device)
        self.is_gpu = self.torch.type == "cuda"

    @classmethod
    def select(cls, local_rank: int = 0, prefer_cpu: bool = False) -> Device:
        """The GPU of this local rank if there is one (and ``prefer_cpu`` is false), otherwise the CPU."""
        if not prefer_cpu and torch.cuda.is_available():
            index = local_rank % torch.cuda.device_count()
            torch.cuda.set_device(index)
            return cls(f"cuda:{index}")
        return cls("cpu")

    @property
    def name(self) -> str:
        """A readable description, e.g. 'NVIDIA H100 80GB HBM3' or 'cpu (2 threads)'."""
        if self.is_gpu:
            return torch.cuda.get_device_name(self.torch)
        return f"cpu ({torch.get_num_threads()} threads)"

    def synchronize(self) -> None:
        """Wait for queued GPU work, so wall-clock timings are honest; nothing to wait for on the CPU."""
        if self.is_gpu:
            torch.cuda.synchronize(self.torch)

    def move(self, tensor: torch.Tensor) -> torch.Tensor:
        """Copy a batch to this device (asynchronously when it is in pinned memory)."""
        if tensor.device == self.torch:
            return tensor
        return tensor.to(self.torch, non_blocking=tensor.is_pinned())

    @property
    def pin_memory_default(self) -> bool:
        """Pinned host memory only helps copies to a GPU."""
        return self.is_gpu

    def reset_peak_memory(self) -> None:
        if self.is_gpu:
            torch.cuda.reset_peak_memory_stats(self.torch)

    def peak_memory_gb(self) -> float | None:
        """Peak memory allocated by tensors since the last reset (GPU only; None on the CPU)."""
        if self.is_gpu:
            return torch.cuda.max_memory_allocated(self.torch) / 1024**3
        return None

    def configure(self, deterministic: bool) -> None:
        """Kernel choices: fast autotuned kernels by default, deterministic ones on request."""
        if self.is_gpu:
            torch.backends.cudnn.benchmark = not deterministic
            torch.backends.cudnn.deterministic = deterministic
        if deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # needed by deterministic cuBLAS
            torch.use_deterministic_algorithms(True)

    def __repr__(self) -> str:
        return f"Device({self.torch})"
