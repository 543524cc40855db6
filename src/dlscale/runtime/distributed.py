"""torch.distributed for a run: start the process group for the launch, and the few collectives dlscale needs.

NCCL joins GPU ranks, gloo CPU ranks. Every function here is a no-op (or the identity) in a single-process run,
so callers never branch on the number of ranks.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from dlscale.errors import DlscaleError
from dlscale.runtime.device import Device
from dlscale.runtime.launch import ProcessInfo

log = logging.getLogger("dlscale.distributed")


def start_process_group(process: ProcessInfo, device: Device, timeout_s: float) -> bool:
    """Join the launch's process group; True if this run is distributed (and the group is now up).

    ``timeout_s`` bounds every collective (the start-up's: the training loop sets its own, shorter one with
    :func:`set_collective_timeout`): a rank that died or hangs ends the job with an error on the others after
    that long, instead of leaving them waiting until the allocation runs out. The flight recorder is switched on
    first (:func:`enable_flight_recorder`).
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
    enable_flight_recorder()
    dist.init_process_group(
        backend,
        init_method=f"tcp://{host}:{process.master_port}",
        rank=process.rank,
        world_size=process.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    _Triage.timeout_s = timeout_s
    note_position("start-up")
    log.info("Joined the %s process group: %s", backend, process.describe())
    return True


def stop_process_group(wait_for_others: bool = True) -> None:
    """Leave the process group, by default after a last barrier (no rank exits while another still saves)."""
    if dist.is_available() and dist.is_initialized():
        if wait_for_others:
            with _entered("barrier (the ranks' last)"):
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
    with _entered("all_reduce (average over ranks)"):
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total / dist.get_world_size()


def any_rank(flag: bool, device: Device | torch.device) -> bool:
    """True if ``flag`` is true on any rank (every rank must call this at the same point)."""
    if not is_distributed():
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=_torch_device(device))
    with _entered("all_reduce (any rank)"):
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


def gather_rows_to_main(rows: np.ndarray, counts: list[int], device: Device) -> np.ndarray | None:
    """Every rank's ``rows`` (a numpy array, ``counts[rank]`` rows along its first dimension, the other
    dimensions alike on every rank) concatenated in rank order on rank 0; None on the other ranks. Row by row
    through the device (NCCL sends device tensors), so no rank holds more than its own rows and one more."""
    if not is_distributed():
        return rows
    rank, target = dist.get_rank(), device.torch
    if rank != 0:
        with _entered("send (rows to rank 0)"):
            for row in rows:
                dist.send(torch.from_numpy(np.ascontiguousarray(row)).to(target), dst=0)
        return None
    gathered = np.empty((sum(counts), *rows.shape[1:]), dtype=rows.dtype)
    gathered[: counts[0]] = rows
    at = counts[0]
    buffer = torch.empty(rows.shape[1:], dtype=torch.from_numpy(rows[:0]).dtype, device=target)
    with _entered("recv (rows from the other ranks)"):
        for source in range(1, len(counts)):
            for _ in range(counts[source]):
                dist.recv(buffer, src=source)
                gathered[at] = buffer.cpu().numpy()
                at += 1
    return gathered


def barrier() -> None:
    if is_distributed():
        dist.barrier()


# ---- hang triage ---------------------------------------------------------------------------------------------
# A collective that waits past its timeout ends the run with one line per rank: which collective it waited in (the
# flight recorder's entry that never retired, else dlscale's own record of the collective it entered) and which
# ranks had not arrived (each rank notes its position in the rendezvous store at the loop's fixed points: a rank
# behind the others' is one that had not arrived). NCCL's watchdog also dumps the flight recorder into the run
# directory (``hang/``); gloo keeps the recorder in memory, which is enough for the line.

FLIGHT_RECORDER_ENTRIES = 2000  # torch's ring buffer of recent collectives, per process
_BUFFER_VARIABLES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")  # torch >= 2.9 name, older name
_DUMP_VARIABLES = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
_POSITION_KEY = "dlscale/position/"
_LISTED_RANKS = 8  # a line names at most this many late ranks, then counts the rest


class _Triage:
    """This rank's record: the collective dlscale entered and has not left, and its position in the run."""

    entered: str | None = None
    count = 0
    where = "start-up"
    timeout_s: float | None = None
    dump_prefix: str | None = None  # the TORCH_FR_DUMP_TEMP_FILE dlscale set (a later run may move it)


def enable_flight_recorder(environ: dict[str, str] | Any = None) -> None:
    """Before the process group starts: torch's flight recorder on (it records gloo's collectives too), and
    NCCL's dump of it on a timeout. A value the user set is kept."""
    environ = os.environ if environ is None else environ
    if not any(name in environ for name in _BUFFER_VARIABLES):
        environ["TORCH_FR_BUFFER_SIZE"] = str(FLIGHT_RECORDER_ENTRIES)
    environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")  # read by NCCL's watchdog only


def dump_flight_recorder_into(directory: Path, gpu: bool, environ: dict[str, str] | Any = None) -> str | None:
    """NCCL's dump on a timeout goes to ``directory``/flight_recorder_rank_<rank> (read when it dumps, so this may
    follow the process group's start); None when the user named another place. The directory is made only on
    GPUs: gloo never dumps."""
    environ = os.environ if environ is None else environ
    # A value there is the user's choice, unless dlscale set it for an earlier run of this process.
    ours = _Triage.dump_prefix is not None and environ.get(_DUMP_VARIABLES[0]) == _Triage.dump_prefix
    if any(name in environ for name in _DUMP_VARIABLES) and not ours:
        return None
    if gpu:
        directory.mkdir(parents=True, exist_ok=True)
    environ[_DUMP_VARIABLES[0]] = _Triage.dump_prefix = str(directory / "flight_recorder_rank_")
    return _Triage.dump_prefix


def set_collective_timeout(timeout_s: float) -> bool:
    """Give every process group this timeout from now on (long at start-up, short in the training loop); False
    when this torch cannot (its private ``_set_pg_timeout`` is missing) and the old timeout stays."""
    if not is_distributed():
        return False
    c10d = dist.distributed_c10d
    setter = getattr(c10d, "_set_pg_timeout", None)
    if setter is None:
        return False
    groups = [dist.group.WORLD, *getattr(getattr(c10d, "_world", None), "pg_map", {})]
    for group in dict.fromkeys(groups):
        try:
            setter(datetime.timedelta(seconds=timeout_s), group)
        except (ValueError, RuntimeError, AssertionError):  # not a member, or a backend without timeouts
            continue
    _Triage.timeout_s = timeout_s
    return True


def note_position(where: str) -> None:
    """Every rank calls this at the same points of the run (a step's start, a validation): the rendezvous store
    keeps each rank's latest, which the ranks read when a collective times out. One small write."""
    _Triage.count += 1
    _Triage.where = where
    if not is_distributed():
        return
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set(f"{_POSITION_KEY}{dist.get_rank()}", f"{_Triage.count} {where}")
    except Exception:  # noqa: BLE001 - the store's host may be gone; the position is only for a diagnosis
        pass


@contextlib.contextmanager
def _entered(name: str) -> Iterator[None]:
    """dlscale's own record of the collective this rank waits in (the flight recorder's is preferred)."""
    _Triage.entered = name
    try:
        yield
    finally:
        _Triage.entered = None


def collective_failure_line(error: BaseException) -> str | None:
    """One line for a collective that timed out or lost a peer: the collective, where in the run, and which ranks
    had not arrived. None when ``error`` is no such failure."""
    lowered = str(error).lower()
    if not isinstance(error, getattr(dist, "DistError", ())) and not any(
        marker in lowered for marker in ("gloo", "nccl", "processgroup", "c10d")
    ):
        return None  # not torch.distributed's (a data loader's timeout, say)
    timed_out = "timed out" in lowered or "timeout" in lowered
    peer_left = any(
        s in lowered for s in ("connection closed by peer", "connection reset by peer", "broken pipe")
    )
    if not (timed_out or peer_left) or not process_group_running():
        return None
    rank = dist.get_rank()
    collective = _waiting_collective() or (
        f"dlscale's {_Triage.entered}" if _Triage.entered else "a collective"
    )
    where = f"at {_Triage.where}"
    if peer_left:
        return (
            f"rank {rank}: {collective} {where} failed: a rank it was exchanging with left (it timed out waiting "
            "for this one, or died: see its own line)"
        )
    limit = f" {_Triage.timeout_s:g} s" if _Triage.timeout_s else ""
    return f"rank {rank}: timed out after{limit} waiting in {collective} {where}; {_missing_ranks(rank)}"


def _waiting_collective() -> str | None:
    """The flight recorder's latest collective on this rank, 'all_reduce #12 of the default group': the one that
    never retired, else the last one entered (a failed one's entry retires while the error unwinds)."""
    try:
        dump = torch._C._distributed_c10d._dump_fr_trace_json(True, False)
        entries = json.loads(dump).get("entries", [])
    except Exception:  # noqa: BLE001 - no recorder in this torch, or it is off
        return None
    if not entries:
        return None
    pending = [e for e in entries if not e.get("retired", True)]
    entry = (pending or entries)[-1]
    name = str(entry.get("profiling_name", "a collective")).split(":")[-1]
    group = (entry.get("process_group") or ["", "default_pg"])[-1]
    group = "the default group" if group in ("default_pg", "0", "") else f"group {group}"
    return f"{name} #{entry.get('collective_seq_id', '?')} of {group}"


def _missing_ranks(rank: int) -> str:
    """'not arrived: rank 1 (at step 3)' from the positions the ranks noted in the store."""
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set_timeout(datetime.timedelta(seconds=5))
        positions = {}
        for other in range(dist.get_world_size()):
            key = f"{_POSITION_KEY}{other}"
            if store.check([key]):
                count, _, where = store.get(key).decode().partition(" ")
                positions[other] = (int(count), where)
    except Exception:  # noqa: BLE001 - the store's host (rank 0) is gone
        return "which ranks had not arrived is unknown (the rendezvous store on rank 0 is gone)"
    behind = [
        f"rank {other} ({f'at {positions[other][1]}' if other in positions else 'no position noted'})"
        for other in range(dist.get_world_size())
        if other != rank and positions.get(other, (-1, ""))[0] < _Triage.count
    ]
    if not behind:
        return (
            "every rank had reached this point: one of them is stuck inside it (the other ranks' lines say)"
        )
    more = f" and {len(behind) - _LISTED_RANKS} more" if len(behind) > _LISTED_RANKS else ""
    return "not arrived: " + ", ".join(behind[:_LISTED_RANKS]) + more
