"""A rollout shared over ranks: each rank rolls out its own initial times, then the running sums are added up.

Every score of a rollout is a float64 sum per (lead, channel) over initial times, with a count (see
:mod:`dlscale.scoring.forecast_scores`), so summing each rank's sums gives the sums of one process that rolled out
every initial time, up to the order of the float64 additions. This module lists those sums for one in-place
all-reduce (one flat tensor: one collective, whatever the number of forecasters).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from dlscale.scoring.rollout import Rollout


def sum_rollout_across_ranks(
    rollout: Rollout, sum_: Callable[[torch.Tensor], None], device: torch.device
) -> None:
    """Turn this rank's running sums of ``rollout`` into the sums over all ranks (``sum_``: an in-place
    all-reduce), and the first lead with a non-finite forecast into the first on any rank. Every rank calls this
    with rollouts of the same leads, channels, forecasters and members (a rank without initial times too)."""
    arrays = _sums(rollout)
    nonfinite = np.zeros(rollout.steps + 2)  # one-hot at the first non-finite lead (the last place: none)
    nonfinite[rollout.first_nonfinite_lead if rollout.first_nonfinite_lead is not None else -1] = 1
    has_acc = np.array([float(scores.has_acc) for scores in rollout.scores.values()])
    arrays += [nonfinite, has_acc]
    flat = torch.from_numpy(np.concatenate([array.ravel().astype(np.float64) for array in arrays])).to(device)
    sum_(flat)
    values, at = flat.cpu().numpy(), 0
    for array in arrays:
        # counts stay integers: float64 holds them exactly below 2**53
        array[...] = values[at : at + array.size].reshape(array.shape).astype(array.dtype)
        at += array.size
    first = np.flatnonzero(nonfinite[:-1])
    rollout.first_nonfinite_lead = int(first[0]) if len(first) else None
    for scores, flag in zip(rollout.scores.values(), has_acc, strict=True):
        scores.has_acc = bool(flag > 0)


def _sums(rollout: Rollout) -> list[np.ndarray]:
    """Every running sum and count of ``rollout``, the arrays themselves (updated in place)."""
    holders = [*rollout.scores.values()]
    if rollout.ensemble is not None:
        holders += [rollout.ensemble.members, rollout.ensemble.control]
    if rollout.spectra is not None:
        holders.append(rollout.spectra)
    return [array for holder in holders for array in holder.running_sums()]
