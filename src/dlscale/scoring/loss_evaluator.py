"""The validation a workload gets when it defines no evaluator of its own: the workload's loss, per sample.

Each validation batch's loss is weighted by its number of samples, so the result is the mean over all samples
whatever the batch sizes and the number of data-parallel ranks, provided the loss is a mean over the samples
of its batch (as ``mse_loss`` and most losses are by default). For gridded outputs (batch, channels, height,
width) one sample's first channel, or the channel ``log.image_channel`` names by its index, is kept for the
prediction-vs-target image.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dlscale.errors import ConfigError
from dlscale.scoring.evaluator import EvalSummary, Evaluator, ExampleImage
from dlscale.scoring.metrics import MetricSums

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class LossEvaluator(Evaluator):
    """The mean of ``loss`` over the validation samples (and an example image for gridded outputs)."""

    def __init__(self, loss: Loss, image_channel: str | None = None):
        self.loss = loss
        if image_channel is not None and not image_channel.isdigit():
            raise ConfigError(
                f"log.image_channel: {image_channel!r} is not a channel index; this workload's evaluator "
                "knows its output channels by number only (0, 1, ...)"
            )
        self.image_channel = int(image_channel) if image_channel is not None else 0
        self.reset()

    def reset(self) -> None:
        self.sums = MetricSums().declare(loss=())
        self.example: ExampleImage | None = None

    def reduce_across_ranks(self, sum_: Callable[[torch.Tensor], None], device: torch.device) -> None:
        """Sum over data-parallel ranks (each evaluated its own share of the samples)."""
        self.sums.sum_across_ranks(sum_, device)

    def update(self, inputs: torch.Tensor, targets: torch.Tensor, predictions: torch.Tensor) -> None:
        batch = inputs.shape[0]
        batch_loss = self.loss(predictions.float(), targets).detach().double().reshape(())
        self.sums.add(batch, loss=batch_loss.expand(batch))  # each sample carries its batch's mean
        if self.example is None and predictions.dim() == 4 and predictions.shape == targets.shape:
            channel = self.image_channel
            if channel >= predictions.shape[1]:
                raise ConfigError(
                    f"log.image_channel: {channel} is not a channel of the output, which has "
                    f"{predictions.shape[1]} channel(s)"
                )
            self.example = ExampleImage(
                channel=f"channel {channel}",
                target=targets[0, channel].float().cpu().numpy(),
                prediction=predictions[0, channel].float().cpu().numpy(),
            )

    def summary(self) -> EvalSummary:
        loss = float(self.sums.mean("loss"))
        return EvalSummary(
            loss=loss,
            scalars={"loss": loss},
            headline="loss",
            example=self.example,
            samples=self.sums.count,
        )
