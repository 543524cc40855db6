"""The device layer: the one place that knows whether training runs on a GPU or on the CPU.

Everything else asks a :class:`Device` to synchronize, move tensors or report memory, and never calls
``torch.cuda`` itself. On the CPU the GPU-only operations are harmless no-ops.
"""

from __future__ import annotations

import os

import torch

from dlscale.errors import ConfigError


class Device:
    """A compute device: ``cuda:<n>`` when a GPU is present, else the CPU."""

    def __init__(self, torch_device: torch.device | str):
        self.torch = torch.device(torch_device)
        self.is_gpu = self.torch.type == "cuda"

    @classmethod
    def select(cls, local_rank: int = 0, prefer_cpu: bool = False) -> Device:
        """The GPU of this local rank if there is one, otherwise the CPU.

        ``prefer_cpu`` or the environment variable ``DLSCALE_DEVICE=cpu`` keep a run on the CPU even on a GPU
        machine (the test suite sets it: its bitwise-determinism checks hold on CPUs, not on GPU kernels).
        """
        choice = os.environ.get("DLSCALE_DEVICE", "auto").strip().lower()
        if choice not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"DLSCALE_DEVICE must be auto, cpu or cuda, got {choice!r}")
        if choice == "cuda" and not torch.cuda.is_available():
            raise ConfigError("DLSCALE_DEVICE=cuda, but torch sees no CUDA GPU on this machine")
        if not prefer_cpu and choice != "cpu" and torch.cuda.is_available():
            index = local_rank % torch.cuda.device_count()
            torch.cuda.set_device(index)
            return cls(f"cuda:{index}")
        return cls("cpu")

    @property
    def name(self) -> str:
        """A readable description, e.g. 'NVIDIA H100 80GB HBM3' or 'cpu (2 threads)'."""
        if self.is_gpu:
            return torch.cuda.get_device_name(self.torch)
        threads = torch.get_num_threads()
        return f"cpu ({threads} thread{'s' if threads != 1 else ''})"

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

    def configure(self, deterministic: bool, tf32: bool = True) -> None:
        """Kernel choices: fast autotuned kernels by default, deterministic ones on request; TF32 on or off.

        TF32 runs fp32 matmuls and convolutions on tensor cores with a 10-bit mantissa (NVIDIA's containers
        switch it on by default; the tutorial's pure-fp32 run needed NVIDIA_TF32_OVERRIDE=0). CPUs have no
        TF32, so their fp32 math is left exactly as it is.
        """
        if self.is_gpu:
            torch.backends.cudnn.benchmark = not deterministic
            torch.backends.cudnn.deterministic = deterministic
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.backends.cudnn.allow_tf32 = tf32
        if deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # needed by deterministic cuBLAS
            torch.use_deterministic_algorithms(True)

    def visible_gpu_count(self) -> int:
        """GPUs this process can drive (0 on a CPU run)."""
        return torch.cuda.device_count() if self.is_gpu else 0

    def release_cached_memory(self) -> None:
        """Give the caching allocator's free blocks back to the GPU (between benchmark runs)."""
        if self.is_gpu:
            torch.cuda.empty_cache()

    def driver_version(self) -> str | None:
        """The GPU driver version (through NVML, when nvidia-ml-py is installed); None on the CPU."""
        if not self.is_gpu:
            return None
        try:
            import pynvml

            pynvml.nvmlInit()
            try:
                version = pynvml.nvmlSystemGetDriverVersion()
            finally:
                pynvml.nvmlShutdown()
            return version.decode() if isinstance(version, bytes) else str(version)
        except Exception:  # no NVML library or package: the version is a nice-to-have in reports
            return None

    def memory_capacity_gb(self) -> float:
        """Memory a run can use: the GPU's total, or on the CPU the host memory available now (2^30 bytes)."""
        if self.is_gpu:
            return torch.cuda.get_device_properties(self.torch).total_memory / 1024**3
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 1024**3

    @property
    def computes_bf16(self) -> bool:
        """Whether bfloat16 math runs natively (Ampere and later GPUs; CPUs emulate it, slowly but correctly)."""
        return torch.cuda.is_bf16_supported() if self.is_gpu else True

    @staticmethod
    def is_out_of_memory(error: BaseException) -> bool:
        """Whether ``error`` is the device (or the host) running out of memory, which a smaller batch avoids."""
        return isinstance(error, (torch.OutOfMemoryError, MemoryError))

    def memory_peaks(self) -> dict[str, float]:
        """Peak memory since the last :meth:`reset_peak_memory`, in GB.

        On a GPU: ``allocated`` (by tensors) and ``reserved`` (by the caching allocator, what nvidia-smi sees).
        On the CPU: ``host_rss``, the process's peak resident memory over its whole life (the OS cannot reset it).
        """
        if self.is_gpu:
            return {
                "allocated": torch.cuda.max_memory_allocated(self.torch) / 1024**3,
                "reserved": torch.cuda.max_memory_reserved(self.torch) / 1024**3,
            }
        import resource

        return {"host_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2}  # KiB on Linux

    def __repr__(self) -> str:
        return f"Device({self.torch})"
