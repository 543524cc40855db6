"""Device readings for the monitor: NVIDIA GPUs through NVML, AMD GPUs through amdsmi, the host via psutil
(the machine's CPU and memory, this process's CPU time, and the memory of this process with its children, e.g.
DataLoader workers).

Everything vendor-specific stays in this module; the sampler, the report and the CLI only see the plain
``GpuReading``/``HostReading`` values. Both GPU libraries are imported lazily, and their absence (or a machine
without GPUs) means "no GPU backend", never an error. On a machine without a GPU that is silent; where torch
sees a GPU but its library cannot be used, one warning names the reason (the run then records no GPU power,
energy or utilization). A field that a board does not support (the energy counter before Volta, the power
limit on some consumer cards) reads as None instead of failing the sample.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import psutil

from dlscale.errors import exception_line

log = logging.getLogger("dlscale.monitor")

GIB = 1024**3


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one instant; None where the board or driver does not report the field."""

    index: int
    name: str
    utilization_pct: (
        float | None
    )  # share of the last period in which any kernel ran (not how busy the SMs were)
    memory_used_gb: float | None
    memory_total_gb: float | None
    power_w: float | None
    power_limit_w: float | None  # the enforced limit, what the board may draw right now
    energy_j: float | None  # cumulative counter since the driver loaded (only differences mean anything)
    temperature_c: float | None
    sm_clock_mhz: float | None


@dataclass(frozen=True)
class HostReading:
    """The host at one instant: the machine's CPU and memory, and what this process itself holds."""

    cpu_pct: float  # the whole machine, all cores together, 0..100, since the previous reading
    process_memory_gb: float  # resident memory of this process and its children (DataLoader workers)
    memory_used_gb: float  # the whole machine's used memory: every process on it, not only this run
    memory_total_gb: float  # the whole machine's memory
    # CPU seconds (user + system, all its threads) this process has run since it started, not its children's:
    # differences over time give the cores it ran on, next to the threads it has (None: not read).
    process_cpu_s: float | None = None
    machine_cpus: int | None = None  # the logical CPUs that ``cpu_pct`` covers


class GpuBackend(Protocol):
    """What the sampler needs from a GPU library (the tests provide a scripted one)."""

    name: str

    def read(self) -> list[GpuReading]: ...

    def close(self) -> None: ...


class ProcessTree:
    """The resident memory (RSS) of a process and all its descendants, e.g. a rank and its DataLoader workers.

    The sum counts a page shared between the process and a forked worker once per process, so it is an upper
    bound of what they hold together (the exact figure, PSS, costs a read of every mapping of every process).
    Finding the descendants walks every process of the machine (psutil reads each /proc/<pid>/stat, in Python,
    holding the GIL: ~10 us per process, ~10 ms on a node running a thousand), so the list is looked up again
    only every ``refresh_s`` seconds, and at the next reading after one of them has exited (a new epoch's
    workers replace the old ones).
    """

    def __init__(
        self,
        process: psutil.Process | None = None,
        refresh_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.process = process or psutil.Process()
        self.refresh_s, self.clock = refresh_s, clock
        self._children: list[psutil.Process] = []
        self._found_at: float | None = None  # when the children were last looked up

    def _descendants(self) -> list[psutil.Process]:
        now = self.clock()
        if self._found_at is None or now - self._found_at >= self.refresh_s:
            self._children, self._found_at = self._child_processes(), now
        return self._children

    def _child_processes(self) -> list[psutil.Process]:
        try:
            return self.process.children(recursive=True)
        except psutil.Error:  # a child exiting while the tree is walked: try again at the next reading
            return []

    def rss_bytes(self) -> int:
        """Resident bytes of the process and its descendants now."""
        total = self.process.memory_info().rss
        for child in self._descendants():
            try:
                total += child.memory_info().rss
            except psutil.Error:  # exited (or a zombie): the list is stale, look again next time
                self._found_at = None
        return total


_process_tree: ProcessTree | None = None


def _this_process_tree() -> ProcessTree:
    """This process's tree, made again in a forked child (which is another process, with other children)."""
    global _process_tree
    if _process_tree is None or _process_tree.process.pid != os.getpid():
        _process_tree = ProcessTree()
    return _process_tree


def read_host() -> HostReading:
    """The machine's CPU and memory, this process's own memory (with its children) and its CPU time now; CPU%
    covers the time since the previous call (the first call reads 0)."""
    memory = psutil.virtual_memory()
    tree = _this_process_tree()
    try:
        times = tree.process.cpu_times()
        process_cpu_s: float | None = times.user + times.system
    except (psutil.Error, OSError):  # a container that hides /proc/<pid>/stat: no CPU-sharing check
        process_cpu_s = None
    return HostReading(
        cpu_pct=float(psutil.cpu_percent(interval=None)),
        process_memory_gb=tree.rss_bytes() / GIB,
        memory_used_gb=(memory.total - memory.available) / GIB,
        memory_total_gb=memory.total / GIB,
        process_cpu_s=process_cpu_s,
        machine_cpus=psutil.cpu_count(),
    )


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity: a batch job's share of a node), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS has no affinity call
        return os.cpu_count() or 1


def _optional(read: Callable[[], Any], scale: float = 1.0) -> float | None:
    """``read() * scale``, or None when the library says the field is unsupported (or fails in any way):
    one missing field must not cost the other readings."""
    try:
        value = read()
    except Exception:
        return None
    return None if value is None else float(value) * scale


def _visible_devices() -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as a list (None when unset): torch's ``cuda:i`` is its i-th entry."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return [entry.strip() for entry in value.split(",") if entry.strip()]


class NvmlBackend:
    """NVIDIA GPUs through ``pynvml`` (package nvidia-ml-py).

    ``indices=None`` reads every board of the node (like nvidia-smi, ignoring CUDA_VISIBLE_DEVICES); a list
    reads the boards that torch calls ``cuda:i`` in this process, translated through CUDA_VISIBLE_DEVICES, and
    labels them with those ordinals.
    """

    name = "NVML"

    def __init__(self, indices: Sequence[int] | None = None):
        import pynvml  # lazy: a dependency, but a custom environment may lack it, and it loads the driver

        self._nvml = pynvml
        pynvml.nvmlInit()
        try:
            self._devices = self._handles(indices)
            self._names = [self._device_name(handle) for _, handle in self._devices]
        except Exception:
            pynvml.nvmlShutdown()
            raise

    def _handles(self, indices: Sequence[int] | None) -> list[tuple[int, Any]]:
        nvml = self._nvml
        if indices is None:
            return [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())]
        visible = _visible_devices()
        handles = []
        for ordinal in indices:
            entry = str(ordinal) if visible is None else visible[ordinal]
            if entry.isdigit():
                handle = nvml.nvmlDeviceGetHandleByIndex(int(entry))
            else:  # a GPU-... or MIG-... UUID
                handle = nvml.nvmlDeviceGetHandleByUUID(entry)
            handles.append((ordinal, handle))
        return handles

    def _device_name(self, handle: Any) -> str:
        name = self._nvml.nvmlDeviceGetName(handle)
        return name.decode() if isinstance(name, bytes) else str(name)  # bytes in old bindings

    def read(self) -> list[GpuReading]:
        nvml = self._nvml
        readings = []
        for (index, handle), name in zip(self._devices, self._names, strict=True):
            memory = _optional(lambda handle=handle: nvml.nvmlDeviceGetMemoryInfo(handle).used, 1 / GIB)
            readings.append(
                GpuReading(
                    index=index,
                    name=name,
                    utilization_pct=_optional(
                        lambda handle=handle: nvml.nvmlDeviceGetUtilizationRates(handle).gpu
                    ),
                    memory_used_gb=memory,
                    memory_total_gb=_optional(
                        lambda handle=handle: nvml.nvmlDeviceGetMemoryInfo(handle).total, 1 / GIB
                    ),
                    power_w=_optional(lambda handle=handle: nvml.nvmlDeviceGetPowerUsage(handle), 1e-3),  # mW
                    power_limit_w=_optional(
                        lambda handle=handle: nvml.nvmlDeviceGetEnforcedPowerLimit(handle), 1e-3
                    ),
                    energy_j=_optional(
                        lambda handle=handle: nvml.nvmlDeviceGetTotalEnergyConsumption(handle),
                        1e-3,  # mJ
                    ),
                    temperature_c=_optional(
                        lambda handle=handle: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
                    ),
                    sm_clock_mhz=_optional(
                        lambda handle=handle: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)
                    ),
                )
            )
        return readings

    def close(self) -> None:
        _optional(self._nvml.nvmlShutdown)


class AmdSmiBackend:
    """AMD GPUs through ``amdsmi`` (ROCm). Best effort and UNTESTED: written from the amdsmi Python API
    documentation without an AMD GPU to run it on; every field degrades to None if a call differs."""

    name = "amdsmi"

    def __init__(self, indices: Sequence[int] | None = None):
        import amdsmi  # lazy: only on ROCm machines

        self._amd = amdsmi
        amdsmi.amdsmi_init()
        try:
            handles = amdsmi.amdsmi_get_processor_handles()
            chosen = range(len(handles)) if indices is None else indices
            self._devices = [(i, handles[i]) for i in chosen]
            self._names = [self._device_name(handle) for _, handle in self._devices]
        except Exception:
            amdsmi.amdsmi_shut_down()
            raise

    def _device_name(self, handle: Any) -> str:
        try:
            return str(self._amd.amdsmi_get_gpu_asic_info(handle)["market_name"])
        except Exception:
            return "AMD GPU"

    def _energy_j(self, handle: Any) -> float:
        counter = self._amd.amdsmi_get_energy_count(handle)
        # The accumulator counts units of counter_resolution microjoules.
        return counter["energy_accumulator"] * counter["counter_resolution"] * 1e-6

    def _power(self, handle: Any, key: str) -> float:
        info = self._amd.amdsmi_get_power_info(handle)
        if key == "power" and info.get("current_socket_power") not in (None, "N/A"):
            return info["current_socket_power"]
        return info["average_socket_power"] if key == "power" else info["power_limit"] / 1e6  # limit in uW

    def read(self) -> list[GpuReading]:
        amd = self._amd
        readings = []
        for (index, handle), name in zip(self._devices, self._names, strict=True):
            readings.append(
                GpuReading(
                    index=index,
                    name=name,
                    utilization_pct=_optional(
                        lambda h=handle: amd.amdsmi_get_gpu_activity(h)["gfx_activity"]
                    ),
                    memory_used_gb=_optional(
                        lambda h=handle: amd.amdsmi_get_gpu_vram_usage(h)["vram_used"], 1 / 1024
                    ),
                    memory_total_gb=_optional(
                        lambda h=handle: amd.amdsmi_get_gpu_vram_usage(h)["vram_total"],
                        1 / 1024,  # MB
                    ),
                    power_w=_optional(lambda h=handle: self._power(h, "power")),
                    power_limit_w=_optional(lambda h=handle: self._power(h, "limit")),
                    energy_j=_optional(lambda h=handle: self._energy_j(h)),
                    temperature_c=_optional(
                        lambda h=handle: amd.amdsmi_get_temp_metric(
                            h, amd.AmdSmiTemperatureType.HOTSPOT, amd.AmdSmiTemperatureMetric.CURRENT
                        )
                    ),
                    sm_clock_mhz=_optional(
                        lambda h=handle: amd.amdsmi_get_clock_info(h, amd.AmdSmiClkType.GFX)["clk"]
                    ),
                )
            )
        return readings

    def close(self) -> None:
        _optional(self._amd.amdsmi_shut_down)


def gpu_library_expected() -> str | None:
    """The GPU library this machine should answer to: "NVML" where torch sees a CUDA GPU, "amdsmi" where it
    sees a ROCm one, None where torch sees no GPU (nothing to monitor, which is not a problem)."""
    import torch  # lazy: only asked when no GPU library could be opened

    if not torch.cuda.is_available():
        return None
    return "amdsmi" if torch.version.hip else "NVML"


_warned: set[str] = set()  # the warnings already given in this process: each is given once


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning("%s", message)


def _unusable_library_message(library: str, reason: str) -> str:
    fix = {
        "NVML": "install nvidia-ml-py and check that the NVIDIA driver's libnvidia-ml loads",
        "amdsmi": "install ROCm's amdsmi Python package",
    }[library]
    return (
        f"GPU metrics off: torch sees a GPU but {library} cannot be used ({reason}); GPU power, energy and "
        f"utilization are not recorded ({fix})"
    )


def open_gpu_backend(indices: Sequence[int] | None = None) -> GpuBackend | None:
    """The first GPU library that loads and sees at least one GPU (NVML, then amdsmi); None otherwise.

    Never raises: a missing library, a driver that fails to initialise or a GPU-less node all mean "no GPU
    metrics". Where torch sees a GPU, the reason its library failed is logged as one warning (once per
    process); on a machine without a GPU nothing is logged beyond debug.
    """
    reasons: dict[str, str] = {}
    for backend_class in (NvmlBackend, AmdSmiBackend):
        try:
            backend = backend_class(indices)
        except Exception as exc:  # ImportError, NVMLError (no driver/GPU), amdsmi errors, a bad index
            reasons[backend_class.name] = exception_line(exc)
            log.debug("%s unavailable: %s", backend_class.name, reasons[backend_class.name])
            continue
        if backend._devices:
            return backend
        reasons[backend_class.name] = f"{backend_class.name} sees no GPU"
        backend.close()
    library = gpu_library_expected()
    if library is not None:
        _warn_once(_unusable_library_message(library, reasons.get(library, "no reason given")))
    return None
