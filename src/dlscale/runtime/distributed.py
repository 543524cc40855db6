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
import re
import time
from collections.abc import Iterator, Mapping
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
    enable_flight_recorder()
    timeout = datetime.timedelta(seconds=timeout_s)
    _Triage.started = time.monotonic()
    _Triage.timeout_s = timeout_s
    store = worker_group_store(process, timeout)
    if store is not None:
        dist.init_process_group(
            backend, store=store, rank=process.rank, world_size=process.world_size, timeout=timeout
        )
    else:
        # IPv6 addresses need brackets in a URL.
        host = f"[{process.master_addr}]" if ":" in process.master_addr else process.master_addr
        dist.init_process_group(
            backend,
            init_method=f"tcp://{host}:{process.master_port}",
            rank=process.rank,
            world_size=process.world_size,
            timeout=timeout,
        )
    note_position("start-up")
    log.info("Joined the %s process group: %s", backend, process.describe())
    return True


def worker_group_store(
    process: ProcessInfo, timeout: datetime.timedelta, environ: Mapping[str, str] | None = None
) -> dist.Store | None:
    """Under torchrun on one node, the store torchrun's agent hosts, with a prefix of its own for each worker group
    (``TORCHELASTIC_RESTART_COUNT``); None elsewhere (the process group then meets at MASTER_ADDR:MASTER_PORT).

    Why: torchrun's agent keeps one store for the whole job (``TORCHELASTIC_USE_AGENT_STORE``) and a worker group
    that ``--max-restarts`` starts again finds the dead group's keys in it, among them the addresses gloo and NCCL
    connect to: a restarted rank reads the address of a dead peer before the new peer writes its own, and its
    connection is refused (pytorch/pytorch#135712). A prefix per restart keeps each group to its own keys. Only on
    one node: each node's agent counts its own restarts, and nodes whose counts differ would never meet; on several
    nodes, ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` in torchrun's environment gives each group a new store."""
    environ = os.environ if environ is None else environ
    if environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or environ.get("GROUP_WORLD_SIZE") != "1":
        return None
    if process.master_addr is None or process.master_port is None:
        return None
    store = dist.TCPStore(
        process.master_addr, process.master_port, process.world_size, is_master=False, timeout=timeout
    )
    restart = environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"dlscale/worker_group_{restart}", store)


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
    started: float | None = None  # time.monotonic() when this rank began joining the process group
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


def collective_failure_line(error: BaseException, rank: int | None = None) -> str | None:
    """One line for a collective that timed out or lost a peer, or for a connection to a peer that was refused or
    never made: what failed, where in the run (for a connection, also how long after this rank began joining the
    process group, and the address), and which ranks had not arrived. None when ``error`` is no such failure.
    ``rank``: this rank, for an error raised while the process group was still starting (then the group cannot
    say)."""
    text = str(error)
    lowered = text.lower()
    if not isinstance(error, getattr(dist, "DistError", ())) and not any(
        marker in lowered for marker in ("gloo", "nccl", "processgroup", "c10d")
    ):
        return None  # not torch.distributed's (a data loader's timeout, say)
    # Before the timeouts: gloo words a refused connection "timed out connecting: ... Connection refused" once its
    # retries are spent, which is no collective waiting for a late rank.
    if any(marker in lowered for marker in _REFUSED_MARKERS):
        return _connection_line(text, rank, refused=True)
    if any(marker in lowered for marker in _CONNECT_TIMEOUT_MARKERS):
        return _connection_line(text, rank, refused=False)
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


# How gloo, NCCL and the TCP store say that nothing accepted a connection (ECONNREFUSED, errno 111 on Linux), and
# that a connection was not made in time (gloo's "Connect timeout").
_REFUSED_MARKERS = ("connection refused", "econnrefused", "errno: 111")
_CONNECT_TIMEOUT_MARKERS = ("connect timeout", "timed out connecting")
# Where the address is in their messages: gloo's "remote=[10.0.0.2]:41233", the store's "connect to
# [node01]:29500", NCCL's "connect to 10.0.0.2<41233>".
_ADDRESS_PATTERNS = (
    re.compile(r"remote=\[([^\]]+)\]:(\d+)"),
    re.compile(r"connect to \[([^\]]+)\]:(\d+)"),
    re.compile(r"connect to ([0-9A-Za-z.:-]+)<(\d+)>"),
)


def _connection_line(
    text: str, rank: int | None, refused: bool, environ: Mapping[str, str] | None = None
) -> str:
    """'rank 1: a connection to the peer at 10.0.0.2:41233 was refused 0.02 s after this rank began joining the
    process group (in broadcast #2 of the default group at start-up): ...', with what refuses it and the likely
    way out."""
    environ = os.environ if environ is None else environ
    if process_group_running():
        rank = dist.get_rank()
    who = f"rank {rank}" if rank is not None else "this rank"
    address = next(
        (f"{match[1]}:{match[2]}" for pattern in _ADDRESS_PATTERNS if (match := pattern.search(text))), None
    )
    store = "client socket" in text.lower() or "tcpstore" in text.lower()
    target = "the rendezvous store" if store else "the peer"
    target += f" at {address}" if address else ""
    what = (
        f"a connection to {target} was refused" if refused else f"no connection to {target} was made in time"
    )
    when = ""
    if _Triage.started is not None:
        when = f" {time.monotonic() - _Triage.started:.2f} s after this rank began joining the process group"
    during = _waiting_collective() if process_group_running() else None
    where = f"in {during} at {_Triage.where}" if during else f"at {_Triage.where}"
    if store:
        cause = "the store's host (rank 0's node, or torchrun's agent) is gone or not listening yet"
    elif (
        environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and environ.get("GROUP_WORLD_SIZE", "1") != "1"
    ):
        cause = (
            "under torchrun --max-restarts on several nodes a restarted group can read a dead rank's address "
            "from torchrun's shared store: launch torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1; otherwise "
            "that rank's process is gone (see its own line)"
        )
    else:
        cause = (
            "no process listens there: that rank's process is gone (see its own line), or the address is not "
            "reachable from this host (GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME choose the network interface)"
        )
    return f"{who}: {what}{when} ({where}): {cause}"


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
