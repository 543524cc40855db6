"""``data.check_finite``: find the samples that hold NaN or infinite values, by file and index.

A few bad samples in a multi-terabyte data set make a run diverge at some step, and the loss alone says
nothing about where they are. With the check on, every batch is tested as it arrives (after reading and
normalization, so a zero standard deviation shows too) and the first bad one stops the run with a DataError
naming the split, the sample's index and, where the data set can tell, its file and position in it. It costs a
host sync per batch: switch it on to find bad data, not for production runs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from dlscale.errors import DataError


class FiniteCheckedBatches:
    """A batch source (see :mod:`dlscale.data.loading.pipeline`) whose batches are checked for NaN and inf.

    ``sampler`` must be the sampler the source reads from: each pass lists its indices again (after the
    trainer's ``set_epoch``), so the i-th batch's samples are known without asking the pipeline.
    """

    def __init__(self, source: Any, sampler: Any, dataset: Any, split: str, batch_size: int):
        self.source = source
        self.sampler = sampler
        self.dataset = dataset
        self.split = split
        self.batch_size = batch_size

    def __iter__(self) -> Iterator[Any]:
        indices = list(self.sampler)
        epoch = int(getattr(self.sampler, "epoch", 0))
        for number, batch in enumerate(self.source):
            keys = indices[number * self.batch_size : (number + 1) * self.batch_size]
            check_batch(batch, keys, self.dataset, self.split, epoch)
            yield batch

    def __len__(self) -> int:
        return len(self.source)

    def __getattr__(self, name: str) -> Any:
        # Anything else (e.g. a pipeline's statistics) is the wrapped source's.
        return getattr(self.source, name)


def check_batch(batch: Sequence[Any], keys: Sequence[int], dataset: Any, split: str, epoch: int = 0) -> None:
    """Raise DataError naming the first sample of ``batch`` (whose samples are ``keys``) holding NaN or inf."""
    parts = [("inputs", batch[0]), ("targets", batch[1])]
    floating = [(name, t) for name, t in parts if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not floating or all(bool(torch.isfinite(t).all()) for _, t in floating):
        return
    for name, tensor in floating:
        rows = (
            (~torch.isfinite(tensor)).flatten(1).any(dim=1) if tensor.dim() > 1 else ~torch.isfinite(tensor)
        )
        bad_rows = rows.nonzero().flatten().tolist()
        if not bad_rows:
            continue
        row = bad_rows[0]
        values = tensor[row]
        kinds = [
            kind
            for kind, count in (
                ("NaN", int(torch.isnan(values).sum())),
                ("+inf", int((values == float("inf")).sum())),
                ("-inf", int((values == float("-inf")).sum())),
            )
            if count
        ]
        key = keys[row] if row < len(keys) else None
        where = describe_sample(dataset, key, epoch) if key is not None else f"row {row} of the batch"
        others = f" (and {len(bad_rows) - 1} more in this batch)" if len(bad_rows) > 1 else ""
        channel = _first_bad_channel(values)
        raise DataError(
            f"data.check_finite: the {split} {name} of {where} hold {' and '.join(kinds)} values"
            f"{channel} after reading and normalization{others}; fix or leave out that sample (a zero standard "
            "deviation in the statistics files also gives inf)"
        )


def describe_sample(dataset: Any, index: int, epoch: int = 0) -> str:
    """'sample 17 (file /data/train/1990.h5, time index 17)' where the data set can locate it, else 'sample 17'."""
    describe = getattr(dataset, "describe_sample", None)
    if describe is None:
        return f"sample {index}"
    return f"sample {index} ({describe(index, epoch)})"


def _first_bad_channel(values: torch.Tensor) -> str:
    """', channel 3' for a sample laid out channel first, where one can be named."""
    if values.dim() < 2:
        return ""
    per_channel = (~torch.isfinite(values)).flatten(1).any(dim=1).nonzero().flatten().tolist()
    return f", channel {per_channel[0]}" if per_channel else ""
