"""Which process of a launch this is (rank, local rank, world size, master), from the launcher's environment.

One code path serves every launcher dlscale is started by: torchrun, Slurm's srun, LSF's jsrun (or any Open MPI
launcher), or none at all. The job scripts therefore run `dlscale train` directly, with no wrapper that
exports RANK and friends.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from dlscale.errors import DlscaleError
from dlscale.runtime.hostlist import expand_hostlist

Launcher = Literal["single", "torchrun", "slurm", "lsf"]

# Human names of the launchers, used in error messages so the user knows which tool set the variable at fault.
_LAUNCHER_NAMES: dict[str, str] = {
    "torchrun": "torchrun",
    "slurm": "Slurm (srun)",
    "lsf": "LSF/jsrun (Open MPI)",
}

# torch.distributed's customary rendezvous port; used when nothing better is known.
DEFAULT_MASTER_PORT = 29500
# Under Slurm the default port is derived from the job id, so two jobs that share a node (e.g. two 1-GPU jobs
# on a shared-queue node) do not both try to listen on 29500. The range 20000-29999 stays below Linux's
# default ephemeral range (32768-60999), from which the kernel picks ports for outgoing connections, so the
# chosen port is not taken by some unrelated client socket on the master node.
SLURM_PORT_BASE = 20000
SLURM_PORT_SPAN = 10000

# Host names of LSF launch ("batch") and login nodes. On Summit, LSB_MCPU_HOSTS lists the launch node first;
# jsrun never starts ranks there, so rank 0 (which must host the rendezvous) is on the first *compute* host.
# The Summit tutorial picked MASTER_ADDR the same way (grep -v batch, grep -v login).
_LSF_NON_COMPUTE_PREFIXES = ("batch", "login")


@dataclass(frozen=True)
class ProcessInfo:
    """This process's place in the launch; the defaults describe a single process started without a launcher."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    master_addr: str | None = None
    master_port: int | None = None
    launcher: Launcher = "single"

    @property
    def is_main(self) -> bool:
        """Rank 0 writes the console log, TensorBoard and checkpoints."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        """Whether there are other processes to synchronise with (a process group is needed)."""
        return self.world_size > 1

    def describe(self) -> str:
        """One line for the log, e.g. ``rank 3 of 8 (local 1 of 4) via slurm, master nid001:29512``."""
        if self.launcher == "single":
            return "single process (no launcher)"
        line = (
            f"rank {self.rank} of {self.world_size} (local {self.local_rank} of {self.local_world_size}) "
            f"via {self.launcher}"
        )
        if self.master_addr is not None:
            port = "" if self.master_port is None else f":{self.master_port}"
            line += f", master {self.master_addr}{port}"
        return line


def detect_process(environ: Mapping[str, str] | None = None) -> ProcessInfo:
    """This process's rank, local rank, world size and master address, read from the launcher's variables.

    The innermost launcher wins, because it is the one that started *this* process:

    1. torchrun (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
       ``MASTER_PORT``): torchrun is often itself started by srun, whose variables then describe the torchrun
       agents, not the trainers.
    2. Open MPI's launchers, i.e. LSF's jsrun on Summit (``OMPI_COMM_WORLD_*``): an Open MPI launcher (mpirun)
       inside a Slurm job starts its daemons with srun, so Slurm's step variables can be present too, but then
       describe one daemon per node. srun itself never sets ``OMPI_COMM_WORLD_*``.
    3. Slurm, for an srun step only (``SLURM_STEP_NUM_TASKS``).
    4. Otherwise one process.

    A launch of one process by any launcher is simply single-process (the launcher is recorded). Values that
    are missing, not integers, negative, inconsistent (rank not below the world size), or a multi-process launch
    with no way to find the master raise :class:`DlscaleError` naming the variable, its value and the launcher.
    """
    env = os.environ if environ is None else environ
    if "WORLD_SIZE" in env:
        return _from_torchrun(env)
    if "OMPI_COMM_WORLD_SIZE" in env:
        return _from_lsf(env)
    # Only an srun step is a launch: in a batch script or an salloc shell, SLURM_NTASKS and SLURM_PROCID are set
    # too, but they describe the allocation, and a plain `dlscale train` there is a single process.
    if "SLURM_STEP_NUM_TASKS" in env:
        return _from_slurm(env)
    return ProcessInfo()


# ---- the launchers ---------------------------------------------------------------------------------------


def _from_torchrun(env: Mapping[str, str]) -> ProcessInfo:
    launcher = "torchrun"
    world_size = _size(env, "WORLD_SIZE", launcher)
    rank = _index(env, "RANK", launcher, required=world_size > 1)
    local_rank = _index(env, "LOCAL_RANK", launcher, required=world_size > 1)
    # torchrun always sets LOCAL_WORLD_SIZE; hand-written exports (the tutorials' export_DDP_vars.sh) do not.
    # The world size is then the most it can be, which keeps the local-rank check meaningful.
    local_world_size = _size(env, "LOCAL_WORLD_SIZE", launcher) if "LOCAL_WORLD_SIZE" in env else world_size
    master_addr = _master_addr_override(env, launcher)
    if master_addr is None and world_size > 1:
        raise DlscaleError(
            f"WORLD_SIZE={world_size} ({_LAUNCHER_NAMES[launcher]}) but MASTER_ADDR is not set: the processes "
            "cannot find rank 0; set MASTER_ADDR (torchrun sets it itself)"
        )
    master_port = _port_or_default(env, launcher, master_addr, lambda: DEFAULT_MASTER_PORT)
    return _checked(
        ProcessInfo(rank, local_rank, world_size, local_world_size, master_addr, master_port, launcher),
        ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"),
    )


def _from_slurm(env: Mapping[str, str]) -> ProcessInfo:
    launcher = "slurm"
    # SLURM_STEP_NUM_TASKS is the step's task count. SLURM_NTASKS is not used as a fallback: this path is only
    # taken when SLURM_STEP_NUM_TASKS is set, and SLURM_NTASKS may describe the allocation rather than the step.
    world_size = _size(env, "SLURM_STEP_NUM_TASKS", launcher)
    rank = _index(env, "SLURM_PROCID", launcher, required=world_size > 1)
    local_rank = _index(env, "SLURM_LOCALID", launcher, required=world_size > 1)
    local_world_size, local_size_name = (
        _slurm_local_world_size(env, world_size) if world_size > 1 else (1, "SLURM_STEP_TASKS_PER_NODE")
    )

    master_addr = _master_addr_override(env, launcher)
    if master_addr is None:
        for variable in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"):
            if variable in env:
                # Task 0 of a step always runs on the step's first node, so that node hosts the rendezvous.
                master_addr = expand_hostlist(env[variable], variable)[0]
                break
    if master_addr is None and world_size > 1:
        raise DlscaleError(
            f"SLURM_STEP_NUM_TASKS={world_size} ({_LAUNCHER_NAMES[launcher]}) but neither SLURM_STEP_NODELIST, "
            "SLURM_JOB_NODELIST nor MASTER_ADDR is set: the processes cannot find rank 0; set MASTER_ADDR"
        )
    master_port = _port_or_default(env, launcher, master_addr, lambda: slurm_default_port(env))
    return _checked(
        ProcessInfo(rank, local_rank, world_size, local_world_size, master_addr, master_port, launcher),
        ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_NUM_TASKS", local_size_name),
    )


def _from_lsf(env: Mapping[str, str]) -> ProcessInfo:
    launcher = "lsf"
    world_size = _size(env, "OMPI_COMM_WORLD_SIZE", launcher)
    distributed = world_size > 1
    rank = _index(env, "OMPI_COMM_WORLD_RANK", launcher, required=distributed)
    local_rank = _index(env, "OMPI_COMM_WORLD_LOCAL_RANK", launcher, required=distributed)
    if "OMPI_COMM_WORLD_LOCAL_SIZE" in env or distributed:
        local_world_size = _size(env, "OMPI_COMM_WORLD_LOCAL_SIZE", launcher)
    else:
        local_world_size = 1
    master_addr = _master_addr_override(env, launcher)
    if master_addr is None and "LSB_MCPU_HOSTS" in env:
        master_addr = _first_lsf_compute_host(env["LSB_MCPU_HOSTS"])
    if master_addr is None and distributed:
        raise DlscaleError(
            f"OMPI_COMM_WORLD_SIZE={world_size} ({_LAUNCHER_NAMES[launcher]}) but neither MASTER_ADDR nor "
            f"LSB_MCPU_HOSTS (with a compute host) is set: the processes cannot find rank 0; set MASTER_ADDR"
        )
    master_port = _port_or_default(env, launcher, master_addr, lambda: DEFAULT_MASTER_PORT)
    return _checked(
        ProcessInfo(rank, local_rank, world_size, local_world_size, master_addr, master_port, launcher),
        (
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ),
    )


# ---- Slurm specifics -------------------------------------------------------------------------------------


def slurm_default_port(environ: Mapping[str, str]) -> int:
    """The rendezvous port for a Slurm job: ``20000 + SLURM_JOB_ID % 10000``, or 29500 without a job id.

    Deterministic, so every task of the job computes the same port without talking to the others; spread over
    10,000 ports, so two jobs sharing a node only collide when their ids are equal modulo 10,000. Concurrent
    steps of one job on the same node would share it: give them distinct ``MASTER_PORT`` values.
    """
    if "SLURM_JOB_ID" not in environ:
        return DEFAULT_MASTER_PORT
    job_id = _integer(environ, "SLURM_JOB_ID", "slurm")
    if job_id < 0:
        raise _bad(environ, "SLURM_JOB_ID", "slurm", "is negative; a job id is 0 or more")
    return SLURM_PORT_BASE + job_id % SLURM_PORT_SPAN


def _slurm_local_world_size(env: Mapping[str, str], world_size: int) -> tuple[int, str]:
    """The number of this step's tasks on this node, and the variable it came from (for error messages)."""
    variable = "SLURM_STEP_TASKS_PER_NODE"
    if variable in env:
        counts = _expand_tasks_per_node(env[variable], variable)
        if len(set(counts)) == 1:
            return counts[0], variable
        # An uneven layout (srun -n 5 on 2 nodes: "3,2"): the node's index in the step picks its count.
        if "SLURM_NODEID" not in env:
            raise DlscaleError(
                f"{variable}={env[variable]!r} ({_LAUNCHER_NAMES['slurm']}) gives different task counts per node "
                "but SLURM_NODEID is not set, so this node's count is unknown"
            )
        node = _integer(env, "SLURM_NODEID", "slurm")
        if not 0 <= node < len(counts):
            raise _bad(env, "SLURM_NODEID", "slurm", f"is not a node of {variable}={env[variable]!r}")
        return counts[node], variable
    # --ntasks-per-node; srun always sets the variable above, so this only serves hand-made environments.
    if "SLURM_NTASKS_PER_NODE" in env:
        return _size(env, "SLURM_NTASKS_PER_NODE", "slurm"), "SLURM_NTASKS_PER_NODE"
    raise DlscaleError(
        f"SLURM_STEP_NUM_TASKS={world_size} ({_LAUNCHER_NAMES['slurm']}) but neither SLURM_STEP_TASKS_PER_NODE "
        "nor SLURM_NTASKS_PER_NODE is set: the number of tasks on this node is unknown"
    )


_TASKS_PER_NODE_ITEM = re.compile(r"(\d+)(?:\(x(\d+)\))?")


def _expand_tasks_per_node(value: str, variable: str) -> list[int]:
    """Slurm's per-node task counts, ``"4(x2),3"`` -> ``[4, 4, 3]``."""
    counts: list[int] = []
    for item in value.split(","):
        match = _TASKS_PER_NODE_ITEM.fullmatch(item.strip())
        if match is None or int(match.group(1)) == 0:
            raise DlscaleError(
                f"{variable}={value!r} ({_LAUNCHER_NAMES['slurm']}) is not a list of task counts per node "
                "such as '4(x2),3'"
            )
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


# ---- LSF specifics ---------------------------------------------------------------------------------------


def _first_lsf_compute_host(mcpu_hosts: str) -> str | None:
    """The first host of ``LSB_MCPU_HOSTS`` ("host slots host slots ...") that is not a launch or login node."""
    tokens = mcpu_hosts.split()
    if not tokens or len(tokens) % 2 or not all(count.isdigit() for count in tokens[1::2]):
        raise DlscaleError(
            f"LSB_MCPU_HOSTS={mcpu_hosts!r} ({_LAUNCHER_NAMES['lsf']}) is not a list of 'host slots' pairs "
            "such as 'batch1 1 a01n01 42'"
        )
    for host in tokens[0::2]:
        if not host.startswith(_LSF_NON_COMPUTE_PREFIXES):
            return host
    return None


# ---- values ----------------------------------------------------------------------------------------------


def _bad(env: Mapping[str, str], variable: str, launcher: str, problem: str) -> DlscaleError:
    return DlscaleError(f"{variable}={env[variable]!r} (set by {_LAUNCHER_NAMES[launcher]}) {problem}")


def _integer(env: Mapping[str, str], variable: str, launcher: str) -> int:
    try:
        return int(env[variable].strip())
    except ValueError:
        raise _bad(env, variable, launcher, "is not an integer") from None


def _size(env: Mapping[str, str], variable: str, launcher: str) -> int:
    """A process count: an integer of at least 1."""
    if variable not in env:
        raise DlscaleError(
            f"{variable} is not set, but {_LAUNCHER_NAMES[launcher]} sets it for every process"
        )
    value = _integer(env, variable, launcher)
    if value < 1:
        raise _bad(env, variable, launcher, "must be at least 1 (a number of processes)")
    return value


def _index(env: Mapping[str, str], variable: str, launcher: str, required: bool) -> int:
    """A rank: an integer of at least 0; 0 when absent and not required (a launch of one process)."""
    if variable not in env:
        if required:
            raise DlscaleError(
                f"{variable} is not set, but {_LAUNCHER_NAMES[launcher]} started several processes and sets it "
                "for each"
            )
        return 0
    value = _integer(env, variable, launcher)
    if value < 0:
        raise _bad(env, variable, launcher, "is negative; ranks are 0 or more")
    return value


def _master_addr_override(env: Mapping[str, str], launcher: str) -> str | None:
    """``MASTER_ADDR`` when set: it wins over the address a launcher's host list would give."""
    if "MASTER_ADDR" not in env:
        return None
    address = env["MASTER_ADDR"].strip()
    if not address:
        raise _bad(env, "MASTER_ADDR", launcher, "is empty; set it to the host name or address of rank 0")
    return address


def _port(env: Mapping[str, str], launcher: str) -> int | None:
    """``MASTER_PORT`` when set, checked to be a TCP port."""
    if "MASTER_PORT" not in env:
        return None
    port = _integer(env, "MASTER_PORT", launcher)
    if not 1 <= port <= 65535:
        raise _bad(env, "MASTER_PORT", launcher, "is not a TCP port (1-65535)")
    return port


def _port_or_default(
    env: Mapping[str, str], launcher: str, master_addr: str | None, default: Callable[[], int]
) -> int | None:
    """``MASTER_PORT`` when set; else ``default()`` when there is a master to meet at; else None.

    ``default`` is only called when needed, so a bad variable it reads does not matter once MASTER_PORT is set.
    """
    port = _port(env, launcher)
    return default() if port is None and master_addr is not None else port


def _checked(info: ProcessInfo, names: tuple[str, str, str, str]) -> ProcessInfo:
    """Check that the ranks fit the sizes; ``names`` are the launcher's rank, local rank, size, local size."""
    rank_name, local_rank_name, size_name, local_size_name = names
    launcher = _LAUNCHER_NAMES[info.launcher]
    if info.rank >= info.world_size:
        raise DlscaleError(
            f"{rank_name}={info.rank} is not below {size_name}={info.world_size} (set by {launcher}): "
            f"ranks run from 0 to {info.world_size - 1}"
        )
    if info.local_world_size > info.world_size:
        raise DlscaleError(
            f"{local_size_name}={info.local_world_size} is larger than {size_name}={info.world_size} "
            f"(set by {launcher})"
        )
    if info.local_rank >= info.local_world_size:
        raise DlscaleError(
            f"{local_rank_name}={info.local_rank} is not below {local_size_name}={info.local_world_size} "
            f"(set by {launcher}): local ranks run from 0 to {info.local_world_size - 1}"
        )
    return info
