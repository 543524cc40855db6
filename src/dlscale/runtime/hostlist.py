"""Slurm's compressed host lists (``nid[001-004,007]``) expanded to host names, without calling scontrol.

The first host of a job step's list hosts rank 0 and so the rendezvous; parsing it here means dlscale needs no
Slurm tools on the compute nodes.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from dlscale.errors import DlscaleError


def expand_hostlist(hostlist: str, variable: str = "host list") -> list[str]:
    """Slurm's compressed host list as host names, in order, without calling ``scontrol show hostnames``.

    ``nid[001-003,007]`` -> nid001 nid002 nid003 nid007 (zero padding kept, as Slurm does); ``node01,node[03-04]``
    -> node01 node03 node04; several bracket groups in one name multiply out (``gpu-a[1-2]-b`` -> gpu-a1-b
    gpu-a2-b). ``variable`` names the source in the error raised for a malformed list.
    """

    set_by = " (set by Slurm (srun))" if variable.startswith("SLURM_") else ""

    def malformed(why: str) -> DlscaleError:
        return DlscaleError(f"{variable}={hostlist!r}{set_by} is not a Slurm host list: {why}")

    hosts: list[str] = []
    for pattern in _split_top_level(hostlist, malformed):
        # Each name is literal text and bracket groups, expanded as a Cartesian product from left to right.
        names = [""]
        for literal, group in re.findall(r"([^\[\]]*)(?:\[([^\[\]]*)\])?", pattern):
            names = [name + literal for name in names]
            if group:
                names = [name + suffix for name in names for suffix in _expand_range_group(group, malformed)]
        hosts.extend(names)
    return hosts


def _split_top_level(hostlist: str, malformed: Callable[[str], DlscaleError]) -> list[str]:
    """Split at the commas outside brackets; check that brackets pair up and no name is empty."""
    patterns: list[str] = []
    depth = 0
    start = 0
    for position, char in enumerate(hostlist):
        if char == "[":
            if depth:
                raise malformed("nested '['")
            depth = 1
        elif char == "]":
            if not depth:
                raise malformed("']' without '['")
            depth = 0
        elif char == "," and not depth:
            patterns.append(hostlist[start:position])
            start = position + 1
    if depth:
        raise malformed("'[' without ']'")
    patterns.append(hostlist[start:])
    for pattern in patterns:
        if not pattern:
            raise malformed("empty host name")
        if pattern.startswith("["):
            raise malformed(f"{pattern!r} starts with '[' instead of a host name")
        if any(char.isspace() for char in pattern):
            raise malformed("white space in a host name")
        if "[]" in pattern:
            raise malformed("empty '[]'")
    return patterns


def _expand_range_group(group: str, malformed: Callable[[str], DlscaleError]) -> list[str]:
    """``001-003,7`` -> 001 002 003 7; each range keeps the width of its first number."""
    suffixes: list[str] = []
    for item in group.split(","):
        first, dash, last = item.partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise malformed(f"{item!r} is not a number or a range of numbers")
        if not dash:
            suffixes.append(first)
            continue
        if int(last) < int(first):
            raise malformed(f"range {item!r} runs backwards")
        width = len(first)
        suffixes.extend(str(number).zfill(width) for number in range(int(first), int(last) + 1))
    return suffixes
