"""torch.distributed for a run: start the process group for the launch, and the few collectives dlscale needs.

NCCL joins GPU ranks, gloo CPU ranks. Every function here is a no-op (or the identity) in a single-process run,
so callers never branch on the number of ranks.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

import torch
import torch.distributed as dist

from dlscale.errors import DlscaleError
from dlscale.runtime.device import Device
from dlscale.runtime.launch import ProcessInfo

log = logging.getLogger("dlscale.distributed")


def start_process_group(process: ProcessInfo, device: Device, timeout_s: float) -> bool:
    """Join the launch's process group; True if this run is distributed (and the group is now up).

    ``timeout_s`` bounds every collective: a rank that died or hangs ends the job with an error on the
    others after that long, instead of leaving them waiting until the allocation runs out.
    """
    if process.world_size <= 1:
        return False
    if dist.is_initialized():
        return True
    if not dist.is_available():
        raise DlscaleError("this torch build has no torch.distributed; it cannot train on several processes")
    backend = "nccl" if device.is_gpu else "gloo"
    if process.master_addr is None or process.master_port is None:
        raise DlscaleError(
            f"rank {process.rank} of {process.world_size} ({process.launcher}): no master address to meet the "
            "other ranks at; set MASTER_ADDR and MASTER_PORT"
        )
    # IPv6 addresses need brackets in a URL.
    host = f"[{process.master_addr}]" if ":" in process.master_addr else process.master_addr
    dist.init_process_group(
        backend,
        init_method=f"tcp://{host}:{process.master_port}",
        rank=process.rank,
        world_size=process.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    log.info("Joined the %s process group: %s", backend, process.describe())
    return True


def stop_process_group(wait_for_others: bool = True) -> None:
    """Leave the process group, by default after a last barrier (no rank exits while another still saves)."""
    if dist.is_available() and dist.is_initialized():
        if wait_for_others:
            dist.barrier()
        dist.destroy_process_group()


def share_from_main(problem: DlscaleError | None, device: Device) -> DlscaleError | None:
    """Rank 0's ``problem`` (e.g. the run directory is locked), on every rank; None when it had none.

    Sent as the exit status and the message's UTF-8 bytes (never pickled). The other ranks get an error marked
    ``quiet``: rank 0 already prints it, and N ranks printing the same line helps nobody.
    """
    if not is_distributed():
        return problem
    code = problem.exit_code if problem is not None else 0
    code, text = _broadcast_from_main(code, str(problem).encode() if problem is not None else b"", device)
    if code == 0:
        return None
    if dist.get_rank() == 0:
        return problem
    shared = DlscaleError(f"rank {dist.get_rank()}: {text.decode(errors='replace')}")
    shared.exit_code = code
    shared.quiet = True
    return shared


def share_text_from_main(text: str | None, device: Device) -> str | None:
    """Rank 0's ``text`` (a JSON document, say) on every rank; None where rank 0 had None."""
    if not is_distributed():
        return text
    present, data = _broadcast_from_main(int(text is not None), (text or "").encode(), device)
    return data.decode() if present else None


def _broadcast_from_main(code: int, data: bytes, device: Device) -> tuple[int, bytes]:
    """Rank 0's (code, bytes) on every rank: a header of two integers, then the bytes if there are any."""
    header = torch.tensor([code, len(data)], dtype=torch.int64, device=device.torch)
    dist.broadcast(header, src=0)
    code, length = (int(v) for v in header.tolist())
    if length == 0:
        return code, b""
    # The other ranks receive into a buffer of rank 0's length, whatever their own (different) text was.
    if dist.get_rank() == 0:
        payload = torch.tensor(list(data), dtype=torch.uint8)
    else:
        payload = torch.zeros(length, dtype=torch.uint8)
    payload = payload.to(device.torch)
    dist.broadcast(payload, src=0)
    return code, bytes(payload.cpu().tolist())


def process_group_running() -> bool:
    """Whether this process has joined a process group (of any size) that is still up."""
    return dist.is_available() and dist.is_initialized()


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def average_across_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """The mean of ``tensor`` over all ranks (a new tensor; ``tensor`` itself when single-process).

    Queued on the device like any kernel: no host synchronization.
    """
    if not is_distributed():
        return tensor
    total = tensor.detach().clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total / dist.get_world_size()


def any_rank(flag: bool, device: Device | torch.device) -> bool:
    """True if ``flag`` is true on any rank (every rank must call this at the same point)."""
    if not is_distributed():
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=_torch_device(device))
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def min_across_ranks(value: float, device: Device | torch.device) -> float:
    """The smallest of ``value`` over all ranks (every rank must call this at the same point)."""
    if not is_distributed():
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=_torch_device(device))
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return float(tensor.item())


def _torch_device(device: Device | torch.device) -> torch.device:
    return device.torch if isinstance(device, Device) else device


def sum_across_ranks_(tensor: torch.Tensor, group: Any = None) -> None:
    """Replace ``tensor`` by its sum over all ranks (or over ``group``), in place; every rank of it calls this
    with the same shape."""
    if is_distributed():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)


def barrier() -> None:
    if is_distributed():
        dist.barrier()
