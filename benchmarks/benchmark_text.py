"""What the benchmark scripts write into their records besides the numbers: the command that made a record (with
the environment that shapes it), sizes in MiB and ranges of ratios in percent. One place, so that the records of
different scripts read alike."""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MIB = 1 << 20
# The environment a benchmark's numbers depend on: the threads torch uses, and where dlscale was imported from.
SHAPING_VARIABLES = ("OMP_NUM_THREADS", "PYTHONPATH")


def command_line(script: str, argv: Sequence[str]) -> str:
    """``OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/<script> ARGS``: paste-able, as the run saw it."""
    env = " ".join(
        f"{name}={shlex.quote(os.environ[name])}" for name in SHAPING_VARIABLES if name in os.environ
    )
    return f"{env} " * bool(env) + shlex.join(["python", script, *argv])


def mib(value: float) -> str:
    """Bytes as MiB with two decimals."""
    return f"{value / MIB:.2f}"


def percent_range(values: Sequence[float]) -> str:
    """'80-111 %' of ratios (or '95 %' when they round alike)."""
    low, high = round(100 * min(values)), round(100 * max(values))
    return f"{low} %" if low == high else f"{low}-{high} %"


def write_device_record(out: str | Path, kind: str, record: dict[str, Any], text: str) -> Path:
    """``<out>/<record's date>-<record's device>-<kind>.json`` and ``.md`` (``text``), each replaced atomically;
    returns their stem."""
    from dlscale.runtime.atomic_files import write_text_atomically

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{record['date']}-{record['device'].replace(' ', '-')}-{kind}"
    write_text_atomically(stem.with_suffix(".json"), json.dumps(record, indent=2) + "\n")
    write_text_atomically(stem.with_suffix(".md"), text)
    return stem
