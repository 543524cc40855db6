"""Validation: run the model over the validation loader and summarise the workload's metrics."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from dlscale.errors import DlscaleError
from dlscale.runtime.device import Device
from dlscale.runtime.distributed import any_rank, is_distributed, sum_across_ranks_


@dataclass
class ExampleImage:
    """One validation sample's channel, for the prediction-vs-target image.

    The arrays hold what the model saw (normalized values, usually); ``scale`` and ``offset`` turn them into
    the physical quantity (``value * scale + offset``, a data set's standard deviation and mean) when ``unit``
    is known. Without ``unit`` the figure says "normalized value"; without ``extent``, its axes are pixels.
    """

    channel: str
    target: Any  # (H, W) numpy array
    prediction: Any  # (H, W) numpy array
    baseline: Any | None = None  # (H, W) numpy array of the baseline prediction, if the workload has one
    baseline_name: str | None = None
    quantity: str | None = None  # what the channel is, e.g. "2 m temperature"
    unit: str | None = None  # of the physical values, e.g. "K"; None: the values stay normalized
    scale: float = 1.0  # physical = value * scale + offset
    offset: float = 0.0
    # (west, east, south, north) edges of the image in degrees longitude / latitude; None: pixel axes
    extent: tuple[float, float, float, float] | None = None
    region: str | None = None  # what part of the grid the image is, when not all of it (said on the axes)

    def physical(self, values: Any) -> Any:
        """``values`` (one of the arrays) in ``unit``; unchanged when the unit is unknown."""
        return values if self.unit is None else values * self.scale + self.offset


@dataclass
class ClassCounts:
    """A classifier's validation counts, for the per-class accuracy and confusion-matrix figures."""

    confusion: Any  # (classes, classes) numpy int array: row = true class, column = predicted class
    class_names: tuple[str, ...] | None = None  # in label order; None: the labels' numbers

    @property
    def num_classes(self) -> int:
        return int(self.confusion.shape[0])

    def names(self) -> list[str]:
        """The class names, or the labels' numbers as text."""
        return list(self.class_names) if self.class_names else [str(c) for c in range(self.num_classes)]

    def per_class_accuracy(self) -> Any:
        """The fraction of each class's samples classified right (NaN for a class with no sample)."""
        samples = self.confusion.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(samples > 0, np.diag(self.confusion) / np.maximum(samples, 1), np.nan)


@dataclass
class ChannelSkill:
    """An error metric per output channel for the model and for the workload's baseline (lower is better), to
    show on which channels the model beats the baseline: ERA5's latitude-weighted RMSE against persistence."""

    metric: str  # what the values are, e.g. "latitude-weighted RMSE"
    baseline_name: str  # e.g. "persistence"
    channels: tuple[str, ...]
    model: Any  # (channels,) numpy array, in the units the model sees (normalized, usually)
    baseline: Any  # (channels,) numpy array, same units
    units: tuple[str, ...] | None = None  # each channel's physical unit ("" where unknown)
    scales: Any | None = None  # (channels,) physical = value * scale (a standard deviation)

    def skill(self) -> Any:
        """The skill score per channel, 1 - model / baseline: 1 is perfect, 0 the baseline's error, below 0
        worse than the baseline (NaN where the baseline is exact, so no skill can be stated)."""
        model, baseline = (
            np.asarray(self.model, dtype=np.float64),
            np.asarray(self.baseline, dtype=np.float64),
        )
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(baseline > 0, 1.0 - model / np.where(baseline > 0, baseline, 1.0), np.nan)

    def not_beating(self) -> list[str]:
        """The channels where the model's error is not below the baseline's (a NaN error counts as not)."""
        model, baseline = np.asarray(self.model), np.asarray(self.baseline)
        return [name for name, m, b in zip(self.channels, model, baseline, strict=True) if not m < b]

    def physical(self, values: Any, index: int) -> str:
        """Channel ``index``'s ``values`` entry in its unit ("38.2 Pa"), or "" when the unit is unknown."""
        if self.units is None or self.scales is None or not self.units[index]:
            return ""
        return f"{float(values[index]) * float(self.scales[index]):.3g} {self.units[index]}"

    def to_dict(self) -> dict[str, Any]:
        """For summary.json: per channel the model's and the baseline's error, the skill and whether it beats
        the baseline; and the list of channels that do not."""
        skill = self.skill()
        channels = {}
        for index, name in enumerate(self.channels):
            channels[name] = {
                "model": float(self.model[index]),
                "baseline": float(self.baseline[index]),
                "skill": float(skill[index]),
                "beats_baseline": bool(self.model[index] < self.baseline[index]),
            }
        return {
            "metric": self.metric,
            "baseline": self.baseline_name,
            "skill": "1 - model / baseline",
            "channels": channels,
            "not_beating_baseline": self.not_beating(),
        }


@dataclass
class EvalSummary:
    """The result of one validation pass, what an evaluator's ``summary()`` returns. Where each field goes:

    * ``loss``: the workload's loss, the mean over all validation samples (not over batches). It picks the
      ``best`` checkpoint, is the ``val_loss`` of the epoch rows and summary.json, and the loss curves' line.
    * ``scalars``: metric name -> a plain float, means over all samples (summed over data-parallel ranks first).
      Each is logged every epoch as ``<name>/valid`` (TensorBoard, the metrics CSV and the other loggers)
      and ends in summary.json's ``final.metrics``.
    * ``headline``: the key of ``scalars`` that best says how good the model is (the pre-flight check refuses one
      that is not a key). It follows the loss in the end-of-run line and summary.json (``headline``,
      ``headline_value``) and is drawn on the loss figure's second axis.
    * ``lines``: console lines printed after each validation (start them with two spaces, as the built-in ones
      do): the metrics and baselines in words.
    * ``baseline_name``: what the baseline is ("persistence", "zeros", "climatology"); None: no baseline.
    * ``baseline_scalars``: the baseline's values of the same names as ``scalars`` (those it has), plus
      ``"loss"`` for its loss: the end-of-run line (``Final validation: loss ..., RMSE ...; persistence: loss
      ..., RMSE ...``), summary.json's ``baseline_loss``, ``baseline_headline`` and ``baseline_metrics``, the
      loggers' ``<name>/<baseline_name>`` and the dashed lines of the loss figure.
    * ``example``: one sample's channel as images (prediction, target, and the baseline's when set), drawn
      as ``figures/prediction_vs_target.png``.
    * ``class_counts``: a classifier's confusion matrix, for the per-class accuracy and confusion figures.
    * ``channel_skill``: an error per output channel for the model and the baseline: the end-of-run skill
      lines (1 - model / baseline per channel, a warning for channels that do not beat the baseline), the
      ``skill_vs_<baseline>`` figure and summary.json's ``channel_skill``.
    * ``units``: metric name -> (unit, scale) for the metrics whose physical value the evaluator knows:
      ``value * scale`` is in ``unit`` (a normalized RMSE times the channel's standard deviation, in m/s), or
      ``("normalized", 1.0)`` for one in normalized units with no known unit. The loss figure, ``metrics.csv``
      and the history rows state these metrics that way; a metric not named here is shown as computed.
    * ``seconds``: the pass's wall time; :func:`evaluate` sets it (an evaluator leaves it 0).
    * ``samples``: how many samples the metrics are over, all ranks together (the count of the sums).

    :class:`~dlscale.scoring.metric_evaluator.MetricEvaluator` fills all but ``class_counts`` from a
    function of (prediction, target) and an optional baseline.
    """

    loss: float  # the workload's loss, averaged over samples
    scalars: dict[str, float]  # metric name -> value (names are TensorBoard tag stems, e.g. "RMSE(u10m)")
    headline: str  # the key of ``scalars`` that best says how good the model is
    lines: list[str] = field(default_factory=list)  # extra console lines (metrics, baselines)
    baseline_name: str | None = None  # e.g. "persistence"
    baseline_scalars: dict[str, float] = field(default_factory=dict)  # the same metrics for the baseline
    example: ExampleImage | None = None
    class_counts: ClassCounts | None = None  # a classifier's confusion matrix, for its figures
    channel_skill: ChannelSkill | None = None  # per-channel error against the baseline, for its figure
    units: dict[str, tuple[str, float]] = field(default_factory=dict)  # metric -> (unit, scale to it)
    seconds: float = 0.0
    samples: int = 0

    def headline_unit(self) -> list | None:
        """[unit, scale] of the headline when the evaluator knows them (value * scale is in unit), else None."""
        known = self.units.get(self.headline)
        return list(known) if known else None

    def headline_numbers(self) -> dict[str, Any]:
        """The headline and the baseline's numbers as an epoch's history row, ``summary.json``'s ``final`` and
        ``metrics.json`` hold them (each beside its own key for the loss)."""
        return {
            "headline": self.headline,
            "headline_value": self.scalars[self.headline],
            # (unit, scale) of the headline when the evaluator knows it: value * scale is in unit (loss figure)
            "headline_unit": self.headline_unit(),
            "baseline": self.baseline_name,
            "baseline_loss": self.baseline_scalars.get("loss"),
            "baseline_headline": self.baseline_scalars.get(self.headline),
        }


class Evaluator(Protocol):
    """What a workload provides to measure a model on validation batches (``Workload.evaluator``).

    The contract, in the order :func:`evaluate` calls it (on every rank, each over its own share of the
    validation samples; a rank's share may be empty):

    * ``reset()``: forget everything; called before each pass (the same evaluator serves every epoch).
    * ``update(inputs, targets, predictions)``: one batch, on the run's device, under ``torch.inference_mode``;
      ``predictions`` may be in the autocast dtype (bf16/fp16): compute in float32 (``.float()``). Keep running
      *sums* over samples and a sample count (:class:`~dlscale.scoring.metrics.MetricSums`), not batch means:
      the last batch is short and ranks hold different numbers of samples.
    * ``reduce_across_ranks(sum_, device)``: turn this rank's sums into the sums over all ranks, ``sum_``
      being an in-place all-reduce; every rank must pass the same tensors in the same order, also a rank that
      saw no sample (declare the sums in ``reset``). Called only when several ranks evaluate.
    * ``summary() -> EvalSummary``: the means, divided once by the total count (see :class:`EvalSummary`).

    :class:`~dlscale.scoring.metric_evaluator.MetricEvaluator` does all of it from a ``metrics(prediction,
    target)`` function and an optional baseline; write one by hand for what it cannot (a classifier's
    confusion matrix, physical units, a baseline made of whole-split statistics).
    """

    def reset(self) -> None: ...

    def update(self, inputs: torch.Tensor, targets: torch.Tensor, predictions: torch.Tensor) -> None: ...

    def summary(self) -> EvalSummary: ...

    def reduce_across_ranks(self, sum_: Callable[[torch.Tensor], None], device: torch.device) -> None:
        """Sum the metrics over the ranks that evaluated different samples, before ``summary()``."""
        # Without it, its metrics would describe this rank's share of the samples only.
        raise TypeError(f"{type(self).__name__} has no reduce_across_ranks(); it cannot run on several ranks")


def evaluate(
    model: torch.nn.Module,
    loader: Any,
    evaluator: Evaluator,
    device: Device,
    predict: Any = None,
    metric_sum: Callable[[torch.Tensor], None] | None = None,
    lockstep: bool = False,
) -> EvalSummary:
    """One pass over ``loader`` in eval mode without gradients; restores the model's training mode after.

    ``predict`` (default: ``model``) maps inputs to predictions, so a precision or compile wrapper can be used.
    ``metric_sum`` sums a tensor in place over the ranks that evaluated different samples (default: all ranks).
    ``lockstep``: every rank runs the model equally often (FSDP2 all-gathers parameters inside the forward, so a
    rank with fewer validation batches repeats its last one, without counting it, until all are done).
    """
    predict = model if predict is None else predict
    was_training = model.training
    model.eval()
    evaluator.reset()
    device.synchronize()
    started = time.perf_counter()
    with torch.inference_mode():
        batches, last_inputs = iter(loader), None
        while True:
            batch = next(batches, None)
            if lockstep and any_rank(batch is not None, device):
                if batch is None:
                    if last_inputs is None:
                        raise DlscaleError("a rank has no validation sample; use fewer data-parallel ranks")
                    predict(last_inputs)  # keeps the other ranks' all-gathers company
                    continue
            elif batch is None:
                break
            inputs, targets = device.move(batch[0]), device.move(batch[1])
            evaluator.update(inputs, targets, predict(inputs))
            last_inputs = inputs
    if metric_sum is None and is_distributed():
        metric_sum = sum_across_ranks_
    if metric_sum is not None:
        evaluator.reduce_across_ranks(metric_sum, device.torch)
    device.synchronize()
    summary = evaluator.summary()
    summary.seconds = time.perf_counter() - started
    model.train(was_training)
    return summary
