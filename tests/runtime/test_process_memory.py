"""The monitor's host memory is this process's own (with its children, the DataLoader workers), apart from the
machine's: a fake process tree, ``read_host`` on fakes, and a real child process that holds memory."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import psutil
import pytest

from dlscale.runtime import gpu_metrics
from dlscale.runtime.gpu_metrics import GIB, ProcessTree, read_host

MIB = 1024**2


class FakeProcess:
    """A psutil.Process stand-in: its RSS, its descendants, or NoSuchProcess once it has exited."""

    def __init__(self, rss: int, children: list[FakeProcess] | None = None, pid: int = 1):
        self.rss, self.children_list, self.pid = rss, children or [], pid
        self.exited, self.children_calls = False, 0

    def memory_info(self):
        if self.exited:
            raise psutil.NoSuchProcess(self.pid)
        return SimpleNamespace(rss=self.rss)

    def cpu_times(self):
        return SimpleNamespace(user=3.0, system=0.5)

    def children(self, recursive: bool = False):
        assert recursive  # workers of workers count too
        self.children_calls += 1
        return [child for child in self.children_list if not child.exited]


class ManualClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_process_tree_sums_the_process_and_its_children():
    worker, grandchild = FakeProcess(200 * MIB, pid=2), FakeProcess(50 * MIB, pid=3)
    main = FakeProcess(100 * MIB, [worker, grandchild])
    assert ProcessTree(main).rss_bytes() == 350 * MIB


def test_process_tree_looks_for_children_again_when_one_exits_or_time_passes():
    clock, old_worker = ManualClock(), FakeProcess(200 * MIB, pid=2)
    main = FakeProcess(100 * MIB, [old_worker])
    tree = ProcessTree(main, refresh_s=2.0, clock=clock)
    assert tree.rss_bytes() == 300 * MIB and tree.rss_bytes() == 300 * MIB
    assert main.children_calls == 1  # walking every process of the machine is not done at each reading
    # The epoch ends: its worker exits and the next epoch's starts.
    old_worker.exited = True
    main.children_list.append(FakeProcess(400 * MIB, pid=4))
    assert tree.rss_bytes() == 100 * MIB  # the exited one is skipped...
    assert tree.rss_bytes() == 500 * MIB and main.children_calls == 2  # ...and the list is looked up again
    main.children_list.append(FakeProcess(10 * MIB, pid=5))
    clock.now = 2.0
    assert tree.rss_bytes() == 510 * MIB and main.children_calls == 3


def test_read_host_reports_the_process_tree_not_the_machine(monkeypatch):
    tree = ProcessTree(FakeProcess(int(0.5 * GIB)))
    monkeypatch.setattr(gpu_metrics, "_this_process_tree", lambda: tree)
    machine = SimpleNamespace(total=32 * GIB, available=20 * GIB)
    monkeypatch.setattr(gpu_metrics.psutil, "virtual_memory", lambda: machine)
    reading = read_host()
    assert reading.process_memory_gb == pytest.approx(0.5)
    assert reading.memory_used_gb == pytest.approx(12.0) and reading.memory_total_gb == pytest.approx(32.0)
    assert reading.process_cpu_s == pytest.approx(3.5)  # user + system: what the CPU-sharing check compares


def test_a_child_process_memory_counts_in_the_real_tree(monkeypatch):
    monkeypatch.setattr(gpu_metrics, "_process_tree", None)  # not one that looked for children earlier
    tree = ProcessTree(refresh_s=0.0)
    before = tree.rss_bytes()
    holds = "import sys; block = b'x' * (128 * 2**20); print('ready', flush=True); sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", holds], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"ready"
        assert tree.rss_bytes() - before >= 120 * MIB
        assert read_host().process_memory_gb * GIB >= 120 * MIB
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    assert tree.rss_bytes() - before < 64 * MIB  # gone with the child
