"""The cosmology U-Net's loss and validation metrics: L1 over voxels and channels (plus the optional density
term), per channel, next to predicting zeros, and the central slice of one channel for the image."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from dlscale.data.cosmo.dataset import CosmoCropDataset
from dlscale.errors import ConfigError, did_you_mean
from dlscale.scoring.evaluator import EvalSummary, Evaluator, ExampleImage
from dlscale.scoring.metrics import MetricSums

DENSITY_EXPONENT = 14.0  # channel 0 holds log(density) / 14 (the tutorial's loss undoes it with exp(14 x))
HEADLINE = "L1"


def per_sample_loss(prediction: torch.Tensor, target: torch.Tensor, lambda_rho: float) -> torch.Tensor:
    """The training loss of each sample, shape (B,): mean |prediction - target| (+ the density term)."""
    loss = (prediction - target).abs().flatten(1).mean(dim=1)
    if lambda_rho:
        predicted, true = (torch.exp(DENSITY_EXPONENT * x[:, 0]) for x in (prediction, target))
        loss = loss + lambda_rho * (predicted - true).abs().flatten(1).mean(dim=1)
    return loss


def cosmo_loss(prediction: torch.Tensor, target: torch.Tensor, lambda_rho: float = 0.0) -> torch.Tensor:
    """The tutorial's loss: ``l1_loss(gen, tar)`` + lambda_rho * ``l1_loss(exp(14 gen_0), exp(14 tar_0))``."""
    loss = torch.nn.functional.l1_loss(prediction, target)
    if lambda_rho:
        loss = loss + lambda_rho * torch.nn.functional.l1_loss(
            torch.exp(DENSITY_EXPONENT * prediction[:, 0]), torch.exp(DENSITY_EXPONENT * target[:, 0])
        )
    return loss


class CosmoEvaluator(Evaluator):
    """Per-sample loss and per-channel L1, for the model and for predicting zeros."""

    def __init__(self, dataset: CosmoCropDataset, lambda_rho: float = 0.0, image_channel: str | None = None):
        self.names = dataset.target_channel_names
        self.lambda_rho = lambda_rho
        image_channel = image_channel or self.names[0]
        if image_channel not in self.names:
            raise ConfigError(
                f"log.image_channel: {image_channel!r} is not a target channel{did_you_mean(image_channel, self.names)}; "
                f"channels: {', '.join(self.names)}"
            )
        self.image_index = self.names.index(image_channel)
        self.reset()

    def reset(self) -> None:
        channels = (len(self.names),)
        self.sums = MetricSums().declare(loss=(), l1=channels, zeros_loss=(), zeros_l1=channels)
        self.example: ExampleImage | None = None

    def reduce_across_ranks(self, sum_: Callable[[torch.Tensor], None], device: torch.device) -> None:
        """Sum the metrics over data-parallel ranks (each evaluated its own share of the samples)."""
        self.sums.sum_across_ranks(sum_, device)

    def update(self, inputs: torch.Tensor, targets: torch.Tensor, predictions: torch.Tensor) -> None:
        predictions, targets = predictions.float(), targets.float()
        zeros = torch.zeros_like(targets)
        self.sums.add(
            inputs.shape[0],
            loss=per_sample_loss(predictions, targets, self.lambda_rho),
            l1=(predictions - targets).abs().flatten(2).mean(dim=2),
            zeros_loss=per_sample_loss(zeros, targets, self.lambda_rho),
            zeros_l1=targets.abs().flatten(2).mean(dim=2),
        )
        if self.example is None:
            c, middle = self.image_index, targets.shape[-1] // 2
            target_slice = targets[0, c, :, :, middle].cpu().numpy()
            self.example = ExampleImage(
                channel=f"{self.names[c]} (slice z={middle})",
                target=target_slice,
                prediction=predictions[0, c, :, :, middle].cpu().numpy(),
                baseline=np.zeros_like(target_slice),
                baseline_name="zeros",
            )

    def summary(self) -> EvalSummary:
        l1, zeros_l1 = self.sums.mean("l1").numpy(), self.sums.mean("zeros_l1").numpy()
        model, baseline = float(l1.mean()), float(zeros_l1.mean())
        scalars = {HEADLINE: model, **{f"L1/{n}": float(v) for n, v in zip(self.names, l1, strict=True)}}
        baseline_scalars = {
            HEADLINE: baseline,
            **{f"L1/{n}": float(v) for n, v in zip(self.names, zeros_l1, strict=True)},
            "loss": float(self.sums.mean("zeros_loss")),
        }
        channels = ", ".join(f"{n} {v:.4f}" for n, v in zip(self.names, l1, strict=True))
        lines = [
            f"  Val L1={model:.5f}; predicting zeros {baseline:.5f}, ratio {model / baseline:.3f}",
            f"  Val L1 per channel: {channels}",
        ]
        return EvalSummary(
            loss=float(self.sums.mean("loss")),
            scalars=scalars,
            headline=HEADLINE,
            lines=lines,
            baseline_name="zeros",
            baseline_scalars=baseline_scalars,
            example=self.example,
            samples=self.sums.count,
        )
