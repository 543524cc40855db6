"""A worker group that torchrun's ``--max-restarts`` starts again, on forked gloo ranks sharing one store as
torchrun's agent hosts it: the restarted ranks meet each other, not the dead group's addresses left in that store.
A connection refused (where that can still happen: several nodes, a dead peer) or never made is one line naming
the address and when, apart from a collective's timeout. The real torchrun with a rank killed by SIGKILL is
measured in docs/many-gpus.md (36 s on 2 idle cores, more than the suite can spend)."""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist
from forked_ranks import free_port, run_ranks

from dlscale.errors import DlscaleError
from dlscale.run.process_group import distributed_run
from dlscale.runtime import distributed
from dlscale.runtime.device import Device
from dlscale.runtime.distributed import collective_failure_line, share_from_main
from dlscale.runtime.launch import detect_process

START_TIMEOUT_S = 10.0


def join_and_add(rank: int, store_port: int, restart: int, rank_0_delay_s: float):
    """One rank of a worker group that torchrun started on one node (its restart ``restart``), whose agent keeps
    the store at ``store_port``; rank 0 starts late, as a restarted group's ranks start in any order."""
    os.environ.update(
        MASTER_PORT=str(store_port),
        TORCHELASTIC_USE_AGENT_STORE="True",
        TORCHELASTIC_RESTART_COUNT=str(restart),
        GROUP_WORLD_SIZE="1",
    )
    if rank == 0:
        time.sleep(rank_0_delay_s)
    try:
        with distributed_run(detect_process(), Device("cpu"), START_TIMEOUT_S) as ending:
            share_from_main(
                None, Device("cpu")
            )  # every command's first collective (the broadcast #2)
            total = torch.tensor([rank + 1])
            dist.all_reduce(total)
            ending.alike = True
        return 0, int(total.item())
    except DlscaleError as exc:
        return exc.exit_code, str(exc)


@pytest.fixture
def agent_store():
    """The store torchrun's agent keeps for the whole job, across its worker groups."""
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    yield port
    del store


def test_a_restarted_worker_group_on_one_node_meets_itself_not_the_dead_groups_addresses(agent_store):
    first = run_ranks(2, join_and_add, agent_store, 0, 0.0, timeout_s=60)
    assert first == [(0, 3), (0, 3)]
    # The first group's keys are still in the store: a restarted rank that read its peer's old address would have
    # its connection refused (before the fix: 0.02 s after it began, or gloo's connect timeout on the other rank).
    restarted = run_ranks(2, join_and_add, agent_store, 1, 1.0, timeout_s=60)
    assert restarted == [(0, 3), (0, 3)]


GLOO_REFUSED = (
    "Gloo connectFullMesh failed with [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:152] timed out "
    "connecting: SO_ERROR: Connection refused, remote=[10.0.0.2]:41233$1"
)


def test_the_message_names_a_refused_connection_apart_from_a_timeout(monkeypatch):
    monkeypatch.setattr(distributed._Triage, "started", time.monotonic() - 0.02)
    monkeypatch.setattr(distributed._Triage, "where", "start-up")
    for name in ("TORCHELASTIC_USE_AGENT_STORE", "GROUP_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    line = collective_failure_line(RuntimeError(GLOO_REFUSED), rank=1)
    assert line is not None and line.startswith(
        "rank 1: a connection to the peer at 10.0.0.2:41233 was refused "
    )
    seconds = float(line.split(" was refused ")[1].split(" s after")[0])
    assert 0.02 <= seconds < 5
    assert "(at start-up): no process listens there" in line and "timed out" not in line

    store = dist.DistNetworkError(
        "The client socket has failed to connect to [node01]:29500 (errno: 111 - Connection refused)."
    )
    assert "a connection to the rendezvous store at node01:29500 was refused" in collective_failure_line(
        store, rank=3
    )
    nccl = RuntimeError(
        "NCCL error: socketPollConnect: connect to 10.29.224.148<52333> returned Connection refused"
    )
    assert "the peer at 10.29.224.148:52333 was refused" in collective_failure_line(nccl, rank=0)

    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "4")
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in collective_failure_line(
        RuntimeError(GLOO_REFUSED), rank=1
    )
    never = RuntimeError(
        "Gloo connectFullMesh failed with [/pytorch/third_party/gloo/gloo/transport/tcp/pair.h:311] "
        "Connect timeout [none]"
    )
    line = collective_failure_line(never, rank=0)
    assert line.startswith("rank 0: no connection to the peer was made in time ") and "timed out" not in line
    # what is not torch.distributed's stays the caller's
    assert collective_failure_line(ConnectionRefusedError("[Errno 111] Connection refused")) is None
