"""The dp x tp x cp mesh, collectives, DDP/FSDP2, tensor/context-parallel layers, and the check that a
workload's parallel form equals its serial model (:func:`compare_with_serial`, :func:`assert_matches_serial`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["Difference", "EquivalenceReport", "RankFailed", "assert_matches_serial", "compare_with_serial"]

if TYPE_CHECKING:
    from dlscale.parallel.equivalence import (
        Difference,
        EquivalenceReport,
        RankFailed,
        assert_matches_serial,
        compare_with_serial,
    )


def __getattr__(name: str) -> Any:
    # Loaded on first use: the config reads the torch-free section dlscale.parallel.parallel_config, and
    # importing it runs this file, which must not import torch.
    if name in __all__:
        from dlscale.parallel import equivalence

        return getattr(equivalence, name)
    raise AttributeError(f"module 'dlscale.parallel' has no attribute {name!r}")
