"""Launch detection: torchrun, Slurm (srun) and LSF/jsrun variables, from synthetic environments."""

from __future__ import annotations

import re
from contextlib import AbstractContextManager

import pytest

from dlscale.errors import DlscaleError
from dlscale.runtime.hostlist import expand_hostlist
from dlscale.runtime.launch import ProcessInfo, detect_process, slurm_default_port


def torchrun_env(**overrides: str) -> dict[str, str]:
    """What torchrun sets for rank 5 of 8 (2 nodes x 4)."""
    env = {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "node07",
        "MASTER_PORT": "29400",
    }
    return env | overrides


def srun_env(**overrides: str) -> dict[str, str]:
    """What srun sets for task 3 of 8 (2 nodes x 4) in job 1234567, plus the allocation's variables."""
    env = {
        "SLURM_JOB_ID": "1234567",
        "SLURM_JOB_NODELIST": "nid[001-002]",
        "SLURM_NTASKS": "8",
        "SLURM_NTASKS_PER_NODE": "4",
        "SLURM_STEP_NUM_TASKS": "8",
        "SLURM_STEP_NODELIST": "nid[001-002]",
        "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "3",
        "SLURM_NODEID": "0",
    }
    return env | overrides


def jsrun_env(**overrides: str) -> dict[str, str]:
    """What jsrun sets on Summit for rank 7 of 12 (2 nodes x 6 GPUs); the launch node is listed first."""
    env = {
        "OMPI_COMM_WORLD_RANK": "7",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "12",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "6",
        "LSB_MCPU_HOSTS": "batch3 1 a01n05 42 a01n06 42",
        "LSB_JOBID": "98765",
    }
    return env | overrides


def without(env: dict[str, str], *variables: str) -> dict[str, str]:
    return {key: value for key, value in env.items() if key not in variables}


def raises_naming(*fragments: str) -> AbstractContextManager[pytest.ExceptionInfo[DlscaleError]]:
    """Expect a DlscaleError whose message contains every fragment, in order."""
    return pytest.raises(DlscaleError, match=".*".join(re.escape(fragment) for fragment in fragments))


# ---- no launcher -----------------------------------------------------------------------------------------


def test_no_launcher_means_one_process() -> None:
    info = detect_process({})
    assert info == ProcessInfo()
    assert (info.rank, info.local_rank, info.world_size, info.local_world_size) == (0, 0, 1, 1)
    assert info.launcher == "single" and info.master_addr is None and info.master_port is None
    assert info.is_main and not info.is_distributed
    assert info.describe() == "single process (no launcher)"


def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(variable, raising=False)
    assert detect_process() == ProcessInfo()
    for variable, value in srun_env().items():
        monkeypatch.setenv(variable, value)
    assert detect_process().rank == 3


def test_sbatch_script_without_srun_is_one_process() -> None:
    # The batch script (or an salloc shell) of an 8-task job: SLURM_NTASKS and SLURM_PROCID describe the
    # allocation; a plain `dlscale train` there is one process, not rank 0 of 8 waiting for 7 others.
    batch = without(srun_env(), "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE")
    assert detect_process(batch) == ProcessInfo()


# ---- torchrun --------------------------------------------------------------------------------------------


def test_torchrun() -> None:
    info = detect_process(torchrun_env())
    assert info == ProcessInfo(5, 1, 8, 4, "node07", 29400, "torchrun")
    assert info.is_distributed and not info.is_main
    assert info.describe() == "rank 5 of 8 (local 1 of 4) via torchrun, master node07:29400"


def test_torchrun_without_master_port_uses_29500() -> None:
    assert detect_process(without(torchrun_env(), "MASTER_PORT")).master_port == 29500


def test_hand_exported_variables_without_local_world_size() -> None:
    # The tutorials' export_DDP_vars.sh sets no LOCAL_WORLD_SIZE; the world size bounds the local rank.
    info = detect_process(without(torchrun_env(), "LOCAL_WORLD_SIZE"))
    assert (info.rank, info.local_rank, info.local_world_size) == (5, 1, 8)


def test_torchrun_of_one_process_is_single_process_with_launcher_recorded() -> None:
    info = detect_process({"WORLD_SIZE": "1"})
    assert info == ProcessInfo(launcher="torchrun")
    assert not info.is_distributed
    info = detect_process(torchrun_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1"))
    assert (info.world_size, info.launcher, info.master_addr) == (1, "torchrun", "node07")


def test_torchrun_inside_an_srun_step_wins() -> None:
    # `srun -N2 --ntasks-per-node 1 torchrun --nproc_per_node 4 ...`: srun's variables describe the torchrun
    # agent (task 1 of 2), torchrun's the trainer (rank 5 of 8).
    env = srun_env(
        SLURM_STEP_NUM_TASKS="2", SLURM_PROCID="1", SLURM_LOCALID="0", SLURM_STEP_TASKS_PER_NODE="1(x2)"
    )
    info = detect_process(env | torchrun_env())
    assert (info.launcher, info.rank, info.world_size, info.master_addr) == ("torchrun", 5, 8, "node07")


# ---- Slurm -----------------------------------------------------------------------------------------------


def test_srun_step() -> None:
    info = detect_process(srun_env())
    assert info == ProcessInfo(3, 3, 8, 4, "nid001", 20000 + 1234567 % 10000, "slurm")
    assert info.describe() == "rank 3 of 8 (local 3 of 4) via slurm, master nid001:24567"


def test_srun_master_is_the_first_host_of_the_step_not_the_job() -> None:
    # A step on the second half of a 4-node allocation: task 0 runs on the step's first node.
    env = srun_env(SLURM_JOB_NODELIST="nid[001-004]", SLURM_STEP_NODELIST="nid[003-004]")
    assert detect_process(env).master_addr == "nid003"


def test_srun_falls_back_to_the_job_node_list() -> None:
    env = without(srun_env(SLURM_JOB_NODELIST="gpu[17-18]"), "SLURM_STEP_NODELIST")
    assert detect_process(env).master_addr == "gpu17"


def test_master_addr_and_port_variables_win_over_slurm() -> None:
    info = detect_process(srun_env(MASTER_ADDR="10.0.0.5", MASTER_PORT="31000"))
    assert (info.master_addr, info.master_port) == ("10.0.0.5", 31000)
    # MASTER_ADDR alone: the port is still the job's.
    info = detect_process(srun_env(MASTER_ADDR="10.0.0.5"))
    assert (info.master_addr, info.master_port) == ("10.0.0.5", 24567)


def test_srun_of_one_task_is_single_process_with_launcher_recorded() -> None:
    env = {
        "SLURM_STEP_NUM_TASKS": "1",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_STEP_NODELIST": "n1",
    }
    info = detect_process(env)
    assert (info.rank, info.world_size, info.local_world_size, info.launcher) == (0, 1, 1, "slurm")
    assert not info.is_distributed
    # Nothing else is needed for one task: no node list, no tasks per node.
    assert detect_process({"SLURM_STEP_NUM_TASKS": "1"}).launcher == "slurm"


def test_uneven_tasks_per_node_picks_this_nodes_count() -> None:
    # srun -n 5 on two nodes: 3 tasks on node 0, 2 on node 1.
    env = srun_env(
        SLURM_STEP_NUM_TASKS="5", SLURM_STEP_TASKS_PER_NODE="3,2", SLURM_PROCID="4", SLURM_LOCALID="1"
    )
    assert detect_process(env | {"SLURM_NODEID": "1"}).local_world_size == 2
    assert detect_process(env | {"SLURM_NODEID": "0"}).local_world_size == 3
    # The "(xN)" repeat form, with an odd node out.
    env = srun_env(
        SLURM_STEP_NUM_TASKS="9", SLURM_STEP_TASKS_PER_NODE="4(x2),1", SLURM_NODEID="2", SLURM_LOCALID="0"
    )
    assert detect_process(env).local_world_size == 1


def test_ntasks_per_node_serves_when_the_step_layout_is_missing() -> None:
    env = without(srun_env(SLURM_NTASKS_PER_NODE="4"), "SLURM_STEP_TASKS_PER_NODE")
    assert detect_process(env).local_world_size == 4


@pytest.mark.parametrize(
    ("environment", "port"),
    [
        ({}, 29500),
        ({"SLURM_JOB_ID": "7"}, 20007),
        ({"SLURM_JOB_ID": "1234567"}, 24567),
        ({"SLURM_JOB_ID": "0"}, 20000),
    ],
)
def test_slurm_default_port(environment: dict[str, str], port: int) -> None:
    assert slurm_default_port(environment) == port


def test_two_jobs_sharing_a_node_get_different_ports() -> None:
    first = detect_process(srun_env(SLURM_JOB_ID="501"))
    second = detect_process(srun_env(SLURM_JOB_ID="502"))
    assert first.master_port != second.master_port
    # ...and every task of one job computes the same one.
    assert (
        detect_process(srun_env(SLURM_PROCID="6", SLURM_LOCALID="2")).master_port
        == detect_process(srun_env()).master_port
    )


# ---- hostlists -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hostlist", "hosts"),
    [
        ("nid001", ["nid001"]),
        ("nid[001-004,007]", ["nid001", "nid002", "nid003", "nid004", "nid007"]),
        ("node01,node[03-05]", ["node01", "node03", "node04", "node05"]),
        ("gpu-a[1-2]-b", ["gpu-a1-b", "gpu-a2-b"]),
        ("nid[0008-0011]", ["nid0008", "nid0009", "nid0010", "nid0011"]),
        ("nid[8-11]", ["nid8", "nid9", "nid10", "nid11"]),
        ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
        ("a[3],b,c[5-6]", ["a3", "b", "c5", "c6"]),
        ("host.example.org", ["host.example.org"]),
    ],
)
def test_expand_hostlist(hostlist: str, hosts: list[str]) -> None:
    assert expand_hostlist(hostlist) == hosts


def test_master_comes_from_a_compressed_multi_group_node_list() -> None:
    env = srun_env(SLURM_STEP_NODELIST="node07,node[03-05]")
    assert detect_process(env).master_addr == "node07"


@pytest.mark.parametrize(
    ("hostlist", "why"),
    [
        ("nid[001-004", "'[' without ']'"),
        ("nid001]", "']' without '['"),
        ("nid[1[2]]", "nested '['"),
        ("nid[]", "empty '[]'"),
        ("nid[a-b]", "not a number"),
        ("nid[4-1]", "runs backwards"),
        ("nid[1-]", "not a number"),
        ("a,,b", "empty host name"),
        ("", "empty host name"),
        ("[1-2]", "starts with '['"),
        ("a b", "white space"),
    ],
)
def test_malformed_node_list_is_refused_naming_variable_and_value(hostlist: str, why: str) -> None:
    with raises_naming(f"SLURM_STEP_NODELIST={hostlist!r}", "Slurm", why):
        detect_process(srun_env(SLURM_STEP_NODELIST=hostlist))


# ---- LSF / jsrun -----------------------------------------------------------------------------------------


def test_jsrun_on_summit() -> None:
    info = detect_process(jsrun_env())
    # The first LSB_MCPU_HOSTS entry is the launch node, where jsrun runs no rank: the master is a01n05.
    assert info == ProcessInfo(7, 1, 12, 6, "a01n05", 29500, "lsf")
    assert info.describe() == "rank 7 of 12 (local 1 of 6) via lsf, master a01n05:29500"


def test_lsf_without_a_launch_node_uses_the_first_host() -> None:
    assert detect_process(jsrun_env(LSB_MCPU_HOSTS="h1 6 h2 6")).master_addr == "h1"


def test_master_addr_wins_over_lsf_hosts() -> None:
    info = detect_process(jsrun_env(MASTER_ADDR="a01n09", MASTER_PORT="29999"))
    assert (info.master_addr, info.master_port) == ("a01n09", 29999)


def test_jsrun_of_one_process_is_single_process_with_launcher_recorded() -> None:
    info = detect_process({"OMPI_COMM_WORLD_SIZE": "1"})
    assert (info.world_size, info.launcher, info.master_addr) == (1, "lsf", None)


def test_mpirun_inside_a_slurm_step_is_read_from_open_mpi() -> None:
    # mpirun starts one daemon per node with srun: Slurm's step variables then count daemons (2), not ranks.
    env = srun_env(
        SLURM_STEP_NUM_TASKS="2", SLURM_PROCID="1", SLURM_LOCALID="0", SLURM_STEP_TASKS_PER_NODE="1(x2)"
    )
    info = detect_process(env | jsrun_env(MASTER_ADDR="nid001"))
    assert (info.launcher, info.rank, info.world_size) == ("lsf", 7, 12)


@pytest.mark.parametrize("hosts", ["batch3", "batch3 1 a01n05", "batch3 one a01n05 42", "   "])
def test_malformed_lsf_host_list_is_refused(hosts: str) -> None:
    with raises_naming(f"LSB_MCPU_HOSTS={hosts!r}", "LSF", "host slots"):
        detect_process(jsrun_env(LSB_MCPU_HOSTS=hosts))


# ---- errors: every message names the variable, its value and the launcher ------------------------------

LAUNCHERS = {"torchrun": torchrun_env, "Slurm": srun_env, "LSF": jsrun_env}
NUMBERS = {
    "torchrun": ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"),
    "Slurm": ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_TASKS_PER_NODE"),
    "LSF": (
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
}
INTEGER_CASES = [
    (launcher, variable) for launcher, variables in NUMBERS.items() for variable in variables[:3]
] + [("torchrun", "LOCAL_WORLD_SIZE"), ("LSF", "OMPI_COMM_WORLD_LOCAL_SIZE"), ("Slurm", "SLURM_JOB_ID")]


@pytest.mark.parametrize(("launcher", "variable"), INTEGER_CASES)
@pytest.mark.parametrize("value", ["two", "", "1.5"])
def test_non_integer_value(launcher: str, variable: str, value: str) -> None:
    with raises_naming(f"{variable}={value!r}", launcher, "not an integer"):
        detect_process(LAUNCHERS[launcher](**{variable: value}))


@pytest.mark.parametrize(
    ("launcher", "variable"), [case for case in INTEGER_CASES if case[1] != "SLURM_JOB_ID"]
)
def test_negative_value(launcher: str, variable: str) -> None:
    with raises_naming(f"{variable}='-1'", launcher):
        detect_process(LAUNCHERS[launcher](**{variable: "-1"}))


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_zero_world_size(launcher: str) -> None:
    size = NUMBERS[launcher][2]
    with raises_naming(f"{size}='0'", launcher, "at least 1"):
        detect_process(LAUNCHERS[launcher](**{size: "0"}))


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_rank_not_below_world_size(launcher: str) -> None:
    rank, _, size, _ = NUMBERS[launcher]
    environment = LAUNCHERS[launcher]()
    with raises_naming(f"{rank}={environment[size]} is not below {size}={environment[size]}", launcher):
        detect_process(environment | {rank: environment[size]})


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_local_rank_not_below_local_world_size(launcher: str) -> None:
    _, local_rank, _, local_size = NUMBERS[launcher]
    with raises_naming(f"{local_rank}=9 is not below {local_size}=", launcher):
        detect_process(LAUNCHERS[launcher](**{local_rank: "9"}))


@pytest.mark.parametrize(
    ("environment", "message"),
    [
        (torchrun_env(LOCAL_WORLD_SIZE="16"), "LOCAL_WORLD_SIZE=16 is larger than WORLD_SIZE=8"),
        (jsrun_env(OMPI_COMM_WORLD_LOCAL_SIZE="13"), "OMPI_COMM_WORLD_LOCAL_SIZE=13 is larger than"),
        (srun_env(SLURM_STEP_TASKS_PER_NODE="16"), "SLURM_STEP_TASKS_PER_NODE=16 is larger than"),
    ],
)
def test_local_world_size_larger_than_world_size(environment: dict[str, str], message: str) -> None:
    with raises_naming(message):
        detect_process(environment)


@pytest.mark.parametrize(
    ("environment", "missing"),
    [
        (without(torchrun_env(), "MASTER_ADDR"), ("WORLD_SIZE=8", "torchrun", "MASTER_ADDR is not set")),
        (
            without(srun_env(), "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"),
            ("SLURM_STEP_NUM_TASKS=8", "Slurm", "SLURM_STEP_NODELIST", "MASTER_ADDR"),
        ),
        (
            without(jsrun_env(), "LSB_MCPU_HOSTS"),
            ("OMPI_COMM_WORLD_SIZE=12", "LSF", "LSB_MCPU_HOSTS", "MASTER_ADDR"),
        ),
        (
            jsrun_env(LSB_MCPU_HOSTS="batch3 1 login2 1"),
            ("OMPI_COMM_WORLD_SIZE=12", "compute host", "MASTER_ADDR"),
        ),
    ],
)
def test_multi_process_launch_without_a_master_address(
    environment: dict[str, str], missing: tuple[str]
) -> None:
    with raises_naming(*missing):
        detect_process(environment)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_empty_master_addr(launcher: str) -> None:
    with raises_naming("MASTER_ADDR=''", launcher, "empty"):
        detect_process(LAUNCHERS[launcher](MASTER_ADDR=""))


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("port", ["0", "65536", "-5"])
def test_port_out_of_range(launcher: str, port: str) -> None:
    with raises_naming(f"MASTER_PORT={port!r}", launcher, "not a TCP port"):
        detect_process(LAUNCHERS[launcher](MASTER_PORT=port))


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_port_not_an_integer(launcher: str) -> None:
    with raises_naming("MASTER_PORT='http'", launcher, "not an integer"):
        detect_process(LAUNCHERS[launcher](MASTER_PORT="http"))


@pytest.mark.parametrize(
    ("environment", "variable"),
    [
        (without(torchrun_env(), "RANK"), "RANK"),
        (without(torchrun_env(), "LOCAL_RANK"), "LOCAL_RANK"),
        (without(srun_env(), "SLURM_PROCID"), "SLURM_PROCID"),
        (without(srun_env(), "SLURM_LOCALID"), "SLURM_LOCALID"),
        (without(jsrun_env(), "OMPI_COMM_WORLD_RANK"), "OMPI_COMM_WORLD_RANK"),
        (without(jsrun_env(), "OMPI_COMM_WORLD_LOCAL_SIZE"), "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ],
)
def test_missing_rank_variable_of_a_multi_process_launch(environment: dict[str, str], variable: str) -> None:
    with raises_naming(f"{variable} is not set"):
        detect_process(environment)


@pytest.mark.parametrize("layout", ["four", "4(x)", "0", "4(x2)x", ""])
def test_malformed_tasks_per_node(layout: str) -> None:
    with raises_naming(f"SLURM_STEP_TASKS_PER_NODE={layout!r}", "Slurm", "task counts per node"):
        detect_process(srun_env(SLURM_STEP_TASKS_PER_NODE=layout))


def test_uneven_tasks_per_node_needs_the_node_id() -> None:
    env = without(srun_env(SLURM_STEP_TASKS_PER_NODE="5,3"), "SLURM_NODEID")
    with raises_naming("SLURM_STEP_TASKS_PER_NODE='5,3'", "SLURM_NODEID is not set"):
        detect_process(env)
    with raises_naming("SLURM_NODEID='2'", "is not a node of"):
        detect_process(srun_env(SLURM_STEP_TASKS_PER_NODE="5,3", SLURM_NODEID="2"))


def test_srun_step_without_any_tasks_per_node() -> None:
    with raises_naming("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "unknown"):
        detect_process(without(srun_env(), "SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"))
