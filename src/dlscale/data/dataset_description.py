"""How logs name a data set: its own ``repr`` when it has one, else its class and length."""

from __future__ import annotations

from typing import Any


def describe_dataset(dataset: Any) -> str:
    """The data set's own repr, or ``L96Pairs of 800 samples`` where it has none (a user's data set, whose
    default repr would be ``<l96.workload.L96Pairs object at 0x...>``)."""
    if type(dataset).__repr__ is not object.__repr__:
        return repr(dataset)
    return f"{type(dataset).__name__} of {len(dataset):,} samples"
