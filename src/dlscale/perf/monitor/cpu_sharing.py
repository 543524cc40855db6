"""The CPU-sharing check of a CPU run's efficiency report: the cores its process ran on (its CPU time over the
wall time, from the monitor's samples) against its torch threads, and a warning when other processes took the
cores those threads needed. Two runs whose threads add up to more than the cores slow each other far more than
their share of the cores says."""

from __future__ import annotations

from collections.abc import Sequence

# The CPU-sharing warning (see ``cpu_sharing_warning``): a CPU run whose process ran on fewer cores than this
# share of its threads (those the machine has cores for), while other processes used at least half of the cores
# it went without. Two runs of 2 threads each on 2 cores get about one core each (a share of 0.5), and were
# measured about 15 times slower than one run alone: torch's threads wait for each other at every operation,
# and a thread that has lost its core holds up the others.
CPU_SHARED_SHARE = 0.75
OTHERS_TOOK_SHARE = 0.5


def process_cpu_cores(readings: Sequence[tuple[float, float | None]]) -> float | None:
    """The cores this process ran on, on average over ``readings`` ((time s, the process's CPU seconds or None),
    one per monitor sample): the CPU seconds it used between consecutive readings over the seconds between them
    (None without two consecutive readings of its CPU time)."""
    cpu_s = elapsed_s = 0.0
    for (time_before, cpu_before), (time_after, cpu_after) in zip(readings[:-1], readings[1:], strict=True):
        if cpu_before is None or cpu_after is None:
            continue
        cpu_s += cpu_after - cpu_before
        elapsed_s += time_after - time_before
    return cpu_s / elapsed_s if elapsed_s > 0 else None


def cpu_sharing_warning(
    used: float | None, machine_pct: float | None, machine_cpus: int | None, threads: int, usable_cpus: int
) -> str | None:
    """The warning for a CPU run whose process ran on ``used`` cores on average, far fewer than its ``threads``
    could use (at most ``usable_cpus``), while the machine's ``machine_cpus`` were ``machine_pct`` busy, or None
    (thresholds above). A process that left cores idle by itself (waiting on input, or Python between the
    operations) is not warned about: the other processes must have taken at least half of what it went
    without."""
    wanted = min(threads, usable_cpus)
    if used is None or machine_pct is None or not machine_cpus or wanted < 2:
        return None  # one thread is not slowed more than its share says: it waits for no other thread
    if used >= CPU_SHARED_SHARE * wanted:
        return None
    others = max(machine_pct / 100 * machine_cpus - used, 0.0)
    if others < OTHERS_TOOK_SHARE * (wanted - used):
        return None
    return (
        f"CPU shared with other processes: this run's process ran on {used:.1f} cores on average for its "
        f"{threads} threads (torch.get_num_threads()), while other processes kept {others:.1f} of the machine's "
        f"{machine_cpus} cores busy. Runs whose threads add up to more than the cores slow each other far more "
        "than that share (two runs of 2 threads on 2 cores each took about 15 times as long): give each its "
        "own cores (OMP_NUM_THREADS=<cores / runs> before the command) or run them one after another"
    )
