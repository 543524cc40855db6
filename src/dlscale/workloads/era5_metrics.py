"""The ERA5 workload's validation metrics: per-sample loss and latitude-weighted RMSE per channel, for the
forecast and for persistence (tomorrow equals today), the baseline a forecast must beat."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from dlscale.data.era5 import ERA5Dataset
from dlscale.errors import ConfigError, did_you_mean
from dlscale.training.evaluate import EvalSummary, Evaluator, ExampleImage
from dlscale.training.metrics import (
    MetricSums,
    latitude_weights,
    relative_l2_per_sample,
    weighted_rmse_per_sample,
)

HEADLINE_CHANNEL = "u10"
DEFAULT_IMAGE_CHANNEL = "t2m"


def channel_unit(name: str) -> str:
    """The physical unit of an ERA5 channel, from its name (u10, t850, z500, ...)."""
    for prefix, unit in (("tcwv", "kg/m2"), ("sp", "Pa"), ("msl", "Pa"), ("u", "m/s"), ("v", "m/s")):
        if name.startswith(prefix):
            return unit
    return {"t": "K", "z": "m2/s2", "r": "%"}.get(name[:1], "")


class ERA5Evaluator(Evaluator):
    """Per-sample loss and latitude-weighted RMSE per channel, for the model and for persistence."""

    def __init__(self, dataset: ERA5Dataset, image_channel: str | None = None):
        self.n_out = dataset.cfg.n_out_channels
        self.names = dataset.channel_names[: self.n_out]
        self.stds = np.asarray(dataset.stds[: self.n_out], dtype=np.float64)
        self.weights = latitude_weights(dataset.latitudes)
        self.headline_index = self.names.index(HEADLINE_CHANNEL) if HEADLINE_CHANNEL in self.names else 0
        image_channel = image_channel or (
            DEFAULT_IMAGE_CHANNEL if DEFAULT_IMAGE_CHANNEL in self.names else self.names[0]
        )
        if image_channel not in self.names:
            raise ConfigError(
                f"log.image_channel: {image_channel!r} is not an output channel of the data"
                f"{did_you_mean(image_channel, self.names)}; channels: {', '.join(self.names)}"
            )
        self.image_index = self.names.index(image_channel)
        self.reset()

    def reset(self) -> None:
        channels = (self.n_out,)
        self.sums = MetricSums().declare(
            loss=(), rmse=channels, persistence_loss=(), persistence_rmse=channels
        )
        self.example: ExampleImage | None = None

    def reduce_across_ranks(self, sum_: Callable[[torch.Tensor], None], device: torch.device) -> None:
        """Sum the metrics over data-parallel ranks (each evaluated its own share of the samples)."""
        self.sums.sum_across_ranks(sum_, device)

    def update(self, inputs: torch.Tensor, targets: torch.Tensor, predictions: torch.Tensor) -> None:
        persistence = inputs[:, : self.n_out]
        self.sums.add(
            inputs.shape[0],
            loss=relative_l2_per_sample(predictions, targets),
            rmse=weighted_rmse_per_sample(predictions, targets, self.weights),
            persistence_loss=relative_l2_per_sample(persistence, targets),
            persistence_rmse=weighted_rmse_per_sample(persistence, targets, self.weights),
        )
        if self.example is None:
            c = self.image_index
            self.example = ExampleImage(
                channel=self.names[c],
                target=targets[0, c].float().cpu().numpy(),
                prediction=predictions[0, c].float().cpu().numpy(),
                baseline=persistence[0, c].float().cpu().numpy(),
                baseline_name="persistence (input)",
            )

    def summary(self) -> EvalSummary:
        rmse = self.sums.mean("rmse").numpy()
        baseline_rmse = self.sums.mean("persistence_rmse").numpy()
        headline = f"RMSE({self.names[self.headline_index]}m)"  # the tutorial's tag: RMSE(u10m)
        scalars = {headline: float(rmse[self.headline_index])}
        scalars.update({f"RMSE/{name}": float(value) for name, value in zip(self.names, rmse, strict=True)})
        baseline = {headline: float(baseline_rmse[self.headline_index])}
        baseline.update({f"RMSE/{n}": float(v) for n, v in zip(self.names, baseline_rmse, strict=True)})
        baseline["loss"] = float(self.sums.mean("persistence_loss"))
        i = self.headline_index
        unit = channel_unit(self.names[i])
        line = (
            f"  Val {headline}={rmse[i]:.4f} ({rmse[i] * self.stds[i]:.3g} {unit}); "
            f"persistence {baseline_rmse[i]:.4f} ({baseline_rmse[i] * self.stds[i]:.3g} {unit}), "
            f"ratio {rmse[i] / baseline_rmse[i]:.2f}"
        )
        return EvalSummary(
            loss=float(self.sums.mean("loss")),
            scalars=scalars,
            headline=headline,
            lines=[line],
            baseline_name="persistence",
            baseline_scalars=baseline,
            example=self.example,
            samples=self.sums.count,
        )
