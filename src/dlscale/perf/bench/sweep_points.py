"""The points of ``dlscale bench --sweep KEY=v1,v2,...``: the options parsed, their combinations, each point's
``--set`` overrides and names.

Apart from the trials and the plot (:mod:`dlscale.perf.bench.sweep`) and importing neither torch nor matplotlib,
so that ``dlscale bench`` refuses a malformed ``--sweep`` at once, before torch is imported.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dlscale.errors import ConfigError

log = logging.getLogger("dlscale.bench")

Point = tuple[tuple[str, str], ...]  # ((key, value), ...) of one sweep point


@dataclass(frozen=True)
class SweepSpec:
    """One ``--sweep KEY=v1,v2,...``: a config key (dotted or flat, as ``--set`` takes) and its values."""

    key: str
    values: tuple[str, ...]


def parse_sweep(text: str) -> SweepSpec:
    """Parse ``KEY=v1,v2,...``; commas inside brackets stay in a value (``betas=[0.9,0.95],[0.9,0.99]``)."""
    key, sep, values_text = text.partition("=")
    key = key.strip()
    example = "e.g. --sweep num_data_workers=0,2,4"
    if not sep or not key:
        raise ConfigError(f"--sweep {text!r}: expected KEY=v1,v2,..., {example}")
    values = _split_values(values_text)
    if not values or any(not v for v in values):
        raise ConfigError(f"--sweep {text!r}: needs a non-empty, comma-separated list of values, {example}")
    if len(set(values)) != len(values):
        raise ConfigError(f"--sweep {text!r}: a value is listed twice")
    return SweepSpec(key, tuple(values))


def _split_values(text: str) -> list[str]:
    values, depth, current = [], 0, ""
    for char in text:
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        if char == "," and depth == 0:
            values.append(current.strip())
            current = ""
        else:
            current += char
    values.append(current.strip())
    return values if text.strip() else []


def _same_key(a: str, b: str) -> bool:
    """Whether two spellings name one config key: flat names are unique, so 'x' is 'section.x'."""
    return a == b or a.split(".")[-1] == b.split(".")[-1] and ("." not in a or "." not in b)


def check_specs(specs: Sequence[SweepSpec]) -> None:
    """Reject a key swept twice (in any spelling): its values would silently replace each other."""
    for first, second in itertools.combinations(specs, 2):
        if _same_key(first.key, second.key):
            raise ConfigError(
                f"--sweep {first.key} and --sweep {second.key} sweep the same key: give it once"
            )


def sweep_points(specs: Sequence[SweepSpec]) -> list[Point]:
    """Every combination of the swept values, the first --sweep varying slowest."""
    check_specs(specs)
    return [
        tuple(zip([s.key for s in specs], values, strict=True))
        for values in itertools.product(*[s.values for s in specs])
    ]


def point_overrides(point: Point) -> list[str]:
    """The ``--set`` overrides of one point."""
    return [f"{key}={value}" for key, value in point]


def point_label(point: Point) -> str:
    """A short readable name: the values alone for one swept key, ``key=value, ...`` for several."""
    if len(point) == 1:
        return point[0][1]
    return ", ".join(f"{key.split('.')[-1]}={value}" for key, value in point)


def file_slug(point: Point) -> str:
    """The point as a file-name part: only letters, digits, '.', '-', '=' and '_'."""
    text = "_".join(f"{key.split('.')[-1]}={value}" for key, value in point)
    return "".join(c if c.isalnum() or c in ".-=_" else "-" for c in text)


def flags_not_swept(flag_values: Mapping[str, Any], specs: Sequence[SweepSpec]) -> dict[str, Any]:
    """The tutorial-flag values minus those of swept keys (flags are applied after --set and would win)."""
    kept = {}
    for key, value in flag_values.items():
        swept = next((s.key for s in specs if _same_key(key, s.key)), None)
        if swept is None:
            kept[key] = value
        else:
            log.warning("--sweep %s replaces the flag value %s=%s", swept, key, value)
    return kept
