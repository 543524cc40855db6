"""JSON text that strict readers accept: every NaN or infinity becomes ``null``.

Python's ``json.dumps`` writes ``NaN``, ``Infinity`` and ``-Infinity`` by default. Those tokens are not JSON,
and strict readers (jq, JavaScript's ``JSON.parse``, many dashboards) reject the whole file because of one
diverged loss or an empty mean. Every JSON file dlscale writes goes through :func:`to_json`; a test scans the
package for other ``json.dumps`` calls.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from typing import Any


def to_json(value: Any, *, indent: int | None = 2, default: Callable[[Any], Any] | None = None) -> str:
    """``value`` as strict JSON text ending with a newline, each non-finite float written as ``null``.

    Non-finite floats are replaced inside nested dicts, lists and tuples, numpy floating scalars included
    (they become plain floats), and also in what ``default`` returns for objects JSON cannot write itself
    (e.g. ``default=str``). Anything non-finite left over (a NaN used as a dict key) raises ``ValueError``
    instead of writing a file that strict readers refuse.
    """
    checked_default = None if default is None else (lambda obj: _finite_or_none(default(obj)))
    text = json.dumps(_finite_or_none(value), indent=indent, default=checked_default, allow_nan=False)
    return text + "\n"


def _finite_or_none(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None; containers are copied, never changed."""
    if isinstance(value, float):  # also numpy.float64, a float subclass
        return float(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite_or_none(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(item) for item in value]
    # A numpy value can only exist if numpy was imported by someone, so look it up instead of importing it
    # (dlscale's JSON writers must not pay for a numpy import they do not need).
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.floating):
        as_float = float(value)
        return as_float if math.isfinite(as_float) else None
    return value
