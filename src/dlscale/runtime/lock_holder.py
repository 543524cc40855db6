"""Who holds a run directory's lock: the identity a lock file records (host, pid, batch job, start time) and
the start time that tells the holder from a later process that reused its pid (whether the pid lives at all,
``psutil.pid_exists`` says). :mod:`dlscale.runtime.run_lock` is the lease built on it."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

_JOB_ID_VARIABLES = ("SLURM_JOB_ID", "LSB_JOBID", "PBS_JOBID")


def job_id_from_environment(environ: Mapping[str, str]) -> str | None:
    """The batch job id of this process (Slurm, LSF or PBS), or None outside a batch job."""
    for name in _JOB_ID_VARIABLES:
        value = environ.get(name, "").strip()
        if value:
            return value
    return None


@dataclass(frozen=True)
class LockHolder:
    """Who holds a run directory's lock, as read from its lock file."""

    host: str
    pid: int | None
    job_id: str | None
    started: str | None
    token: str | None
    process_start: int | None
    heartbeat_age_s: float | None

    def describe(self) -> str:
        """One phrase for messages, e.g. ``pid 1234 on host nid001 (job 5678), started ..., last heartbeat 12 s ago``."""
        if self.pid is None:
            parts = [self.host]
        else:
            job = f"job {self.job_id}" if self.job_id else "no job id"
            parts = [f"pid {self.pid} on host {self.host} ({job})"]
        if self.started:
            parts.append(f"started {self.started.replace('T', ' ')}")
        if self.heartbeat_age_s is not None:
            # A few ms of clock skew between nodes must not read as a heartbeat from the future.
            age = f"{max(self.heartbeat_age_s, 0.0):.0f} s ago"
            # Without a pid the file could not be read, so its mtime is a write, not a known heartbeat.
            parts.append(f"last heartbeat {age}" if self.pid is not None else f"last written {age}")
        return ", ".join(parts)


def parse_holder(raw: bytes, age_s: float) -> LockHolder | None:
    """The holder recorded in a lock file, or None if the file is empty, half written or not ours."""
    try:
        record = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict):
        return None
    host, pid, token = record.get("host"), record.get("pid"), record.get("token")
    if not isinstance(host, str) or not isinstance(token, str) or type(pid) is not int or pid <= 0:
        return None
    job_id = record.get("job_id")
    started = record.get("started")
    process_start = record.get("process_start")
    return LockHolder(
        host=host,
        pid=pid,
        job_id=str(job_id) if job_id is not None else None,
        started=started if isinstance(started, str) else None,
        token=token,
        process_start=process_start if type(process_start) is int else None,
        heartbeat_age_s=age_s,
    )


def process_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), which tells a reused pid from the original."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: count fields after its last ")".
    fields_after_name = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields_after_name[22 - 3])
    except (IndexError, ValueError):
        return None
