""" "My metric against a baseline" in a few lines: an :class:`~dlscale.scoring.evaluator.Evaluator` built from a
function of (prediction, target) that returns named metrics, and optionally a baseline predictor (persistence,
climatology, zeros) whose predictions get the same metrics.

Each metric is an error (lower is better) and may be, for a batch of B samples,

* a scalar tensor: the batch's mean (each sample counts its batch's mean, as a loss with ``reduction="mean"``);
* a ``(B,)`` tensor: one value per sample;
* a ``(B, C)`` tensor: one value per sample and output channel; reported as the mean over the channels under the
  metric's name and per channel as ``name/<channel>``.

Values are accumulated as sums over samples and a sample count, summed over data-parallel ranks and divided
once at the end (means of sums, not means of means), so the result is the mean over all validation samples
whatever the batch size, the short last batch or the number of ranks. Every rank must join that sum with the
same tensors, also a rank that got no validation sample, so the metrics' names and shapes are learnt up front
from the first validation sample.

With a baseline, each metric's skill ``1 - model / baseline`` (1 perfect, 0 no better than the baseline, below
0 worse) is a scalar of its own (``skill/<name>``) and a console line per epoch; the headline and its
baseline's value end the run's log and summary.json (as the ERA5 workload's RMSE against persistence), and a
per-channel headline gets the skill per channel (log lines, figure and summary.json's ``channel_skill``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from dlscale.errors import ConfigError, WorkloadError, did_you_mean
from dlscale.scoring.evaluator import ChannelSkill, EvalSummary, Evaluator, ExampleImage
from dlscale.scoring.metrics import MetricSums

Metrics = Callable[[torch.Tensor, torch.Tensor], Mapping[str, torch.Tensor]]  # (prediction, target) -> named
Baseline = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (inputs, targets) -> prediction
Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
PROBE_SAMPLES = 2  # the metrics' shapes are learnt on a batch of two: a (B,) value is then told from a scalar


class MetricEvaluator(Evaluator):
    """Validation by ``metrics(prediction, target)`` for the model and for ``baseline(inputs, targets)``.

    ``valid_dataset``: the validation split (its first sample tells the metrics' shapes); ``loss``: the
    workload's loss (the summary's ``loss``, and the baseline's, a mean over samples); ``headline``: the metric
    that says how good the model is (default: the first one ``metrics`` returns); ``channel_names``: the output
    channels' names for ``(B, C)`` metrics and the image (default: their indices); ``image_channel``: the
    channel of the prediction-vs-target image (``log.image_channel``) of ``(B, C, H, W)`` outputs.
    """

    def __init__(
        self,
        valid_dataset: Dataset,
        loss: Loss,
        metrics: Metrics,
        baseline: Baseline | None = None,
        *,
        baseline_name: str = "baseline",
        headline: str | None = None,
        channel_names: Sequence[str] | None = None,
        image_channel: str | None = None,
    ):
        self.loss, self.metrics, self.baseline = loss, metrics, baseline
        self.baseline_name = baseline_name if baseline is not None else None
        self.channel_names = tuple(channel_names) if channel_names is not None else None
        self.shapes = self._probe(valid_dataset)
        self.headline = headline if headline is not None else next(iter(self.shapes))
        if self.headline not in self.shapes:
            raise WorkloadError(
                f"the evaluator's headline {self.headline!r} is not one of the metrics "
                f"({', '.join(map(repr, self.shapes)) or 'none'}){did_you_mean(self.headline, list(self.shapes))}"
            )
        self.image_channel = self._checked_image_channel(image_channel)
        self.reset()

    def _probe(self, dataset: Dataset) -> dict[str, tuple[int, ...]]:
        """Each metric's per-sample shape, () or (C,), from the first validation sample."""
        target = dataset[0][1]
        self.target_shape = tuple(target.shape)
        targets = torch.stack([target] * PROBE_SAMPLES)
        with torch.no_grad():
            values = self._metrics_of(targets.float(), targets)
        return {name: tuple(value.shape[1:]) for name, value in values.items()}

    def _metrics_of(self, predictions: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """``metrics`` of a batch, each value with the batch as its first dimension (a batch mean repeated)."""
        batch = targets.shape[0]
        values = self.metrics(predictions, targets)
        if not isinstance(values, Mapping) or not values:
            raise WorkloadError(
                f"the evaluator's metrics returned a {type(values).__name__}; it must return a non-empty dict "
                "of tensors, {name: value}"
            )
        shaped = {}
        for name, value in values.items():
            if not isinstance(value, torch.Tensor):
                value = torch.as_tensor(value, dtype=torch.float64)
            if value.ndim == 0:
                value = value.expand(batch)
            if value.ndim > 2 or value.shape[0] != batch:
                raise WorkloadError(
                    f"the evaluator's metric {str(name)!r} has shape {tuple(value.shape)} for a batch of {batch}; "
                    f"it must be a scalar (the batch's mean), ({batch},) one value per sample, or "
                    f"({batch}, channels) one per sample and channel"
                )
            shaped[str(name)] = value.detach()
        return shaped

    def reset(self) -> None:
        declared = {"loss": ()}
        for name, shape in self.shapes.items():
            declared[name] = shape
            if self.baseline is not None:
                declared[f"baseline {name}"] = shape
        if self.baseline is not None:
            declared["baseline loss"] = ()
        self.sums = MetricSums().declare(**declared)
        self.example: ExampleImage | None = None

    def reduce_across_ranks(self, sum_: Callable[[torch.Tensor], None], device: torch.device) -> None:
        """Sum over data-parallel ranks (each evaluated its own share of the samples)."""
        self.sums.sum_across_ranks(sum_, device)

    def update(self, inputs: torch.Tensor, targets: torch.Tensor, predictions: torch.Tensor) -> None:
        batch = targets.shape[0]
        predictions = predictions.float()
        values = {"loss": self._batch_loss(predictions, targets).expand(batch)}
        values.update(self._known_metrics(predictions, targets))
        baseline = None
        if self.baseline is not None:
            baseline = self.baseline(inputs, targets)
            if not isinstance(baseline, torch.Tensor) or baseline.shape != targets.shape:
                shape = (
                    tuple(baseline.shape) if isinstance(baseline, torch.Tensor) else type(baseline).__name__
                )
                raise WorkloadError(
                    f"the evaluator's baseline {self.baseline_name!r} returned {shape} for targets of shape "
                    f"{tuple(targets.shape)}; it must return a prediction of the targets' shape"
                )
            baseline = baseline.float()
            values["baseline loss"] = self._batch_loss(baseline, targets).expand(batch)
            for name, value in self._known_metrics(baseline, targets).items():
                values[f"baseline {name}"] = value
        self.sums.add(batch, **values)
        if self.example is None and predictions.dim() == 4 and predictions.shape == targets.shape:
            self.example = self._example(targets, predictions, baseline)

    def _batch_loss(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.loss(predictions, targets).detach().double().reshape(())

    def _known_metrics(self, predictions: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        values = self._metrics_of(predictions, targets)
        for name, value in values.items():
            if tuple(value.shape[1:]) != self.shapes.get(name):
                raise WorkloadError(
                    f"the evaluator's metric {name!r} has shape {tuple(value.shape)}, and on the first "
                    f"validation sample it had (B, {', '.join(map(str, self.shapes.get(name, ())))}); every batch "
                    "must give the same metrics with the same shapes"
                )
        if values.keys() != self.shapes.keys():
            raise WorkloadError(
                f"the evaluator's metrics returned {', '.join(map(repr, values))}, and on the first validation "
                f"sample {', '.join(map(repr, self.shapes))}; every batch must give the same metrics"
            )
        return values

    def _channel_names(self, count: int) -> list[str]:
        if self.channel_names is not None and len(self.channel_names) == count:
            return list(self.channel_names)
        return [str(index) for index in range(count)]

    def _checked_image_channel(self, image_channel: str | None) -> str | None:
        """``log.image_channel``, checked against the channels of a ``(C, H, W)`` target (others draw none)."""
        if image_channel is None or len(self.target_shape) != 3:
            return image_channel
        names = self._channel_names(self.target_shape[0])
        if image_channel not in names:
            raise ConfigError(
                f"log.image_channel: {image_channel!r} is not an output channel"
                f"{did_you_mean(image_channel, names)}; channels: {', '.join(names)}"
            )
        return image_channel

    def _example(
        self, targets: torch.Tensor, predictions: torch.Tensor, baseline: torch.Tensor | None
    ) -> ExampleImage:
        names = self._channel_names(predictions.shape[1])
        wanted = self.image_channel if self.image_channel is not None else names[0]
        channel = names.index(wanted)
        return ExampleImage(
            channel=wanted if self.channel_names else f"channel {channel}",
            target=targets[0, channel].float().cpu().numpy(),
            prediction=predictions[0, channel].cpu().numpy(),
            baseline=baseline[0, channel].cpu().numpy() if baseline is not None else None,
            baseline_name=self.baseline_name,
        )

    def _means(self, prefix: str) -> tuple[dict[str, float], dict[str, np.ndarray]]:
        """The metrics' means over all samples: one number per metric (per-channel ones averaged over the
        channels, and each channel as ``name/<channel>``), and the per-channel arrays."""
        scalars, per_channel = {}, {}
        for name, shape in self.shapes.items():
            mean = self.sums.mean(prefix + name).numpy()
            scalars[name] = float(mean.mean())
            if shape:
                per_channel[name] = mean
                channels = self._channel_names(shape[0])
                scalars.update({f"{name}/{c}": float(v) for c, v in zip(channels, mean, strict=True)})
        return scalars, per_channel

    def summary(self) -> EvalSummary:
        scalars, per_channel = self._means("")
        summary = EvalSummary(
            loss=float(self.sums.mean("loss")),
            scalars=scalars,
            headline=self.headline,
            samples=self.sums.count,
            example=self.example,
        )
        if self.baseline is None:
            summary.lines = [f"  Val {', '.join(f'{n}={scalars[n]:.4g}' for n in self.shapes)}"]
            return summary
        baseline, baseline_per_channel = self._means("baseline ")
        summary.baseline_name = self.baseline_name
        summary.baseline_scalars = {**baseline, "loss": float(self.sums.mean("baseline loss"))}
        for name in self.shapes:
            skill = 1.0 - scalars[name] / baseline[name] if baseline[name] > 0 else float("nan")
            scalars[f"skill/{name}"] = skill
            summary.lines.append(
                f"  Val {name}={scalars[name]:.4g}; {self.baseline_name} {baseline[name]:.4g}, skill {skill:+.3f}"
            )
        if self.headline in per_channel:
            summary.channel_skill = ChannelSkill(
                metric=self.headline,
                baseline_name=self.baseline_name,
                channels=tuple(self._channel_names(self.shapes[self.headline][0])),
                model=per_channel[self.headline],
                baseline=baseline_per_channel[self.headline],
            )
        return summary
