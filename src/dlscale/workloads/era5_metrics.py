"""The ERA5 workload's validation metrics: per-sample loss and latitude-weighted RMSE per channel, for the
forecast and for persistence (tomorrow equals today), the baseline a forecast must beat."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from dlscale.data.era5.coordinates import GridCoordinates
from dlscale.data.era5.dataset import ERA5Dataset
from dlscale.errors import ConfigError, did_you_mean
from dlscale.scoring.evaluator import ChannelSkill, EvalSummary, Evaluator, ExampleImage
from dlscale.scoring.metrics import (
    MetricSums,
    latitude_weights,
    relative_l2_per_sample,
    weighted_rmse_per_sample,
)

HEADLINE_CHANNEL = "u10"
DEFAULT_IMAGE_CHANNEL = "t2m"


# What each of the 20 channels (dlscale.data.era5.layout.ERA5_CHANNELS, the tutorial's "u10m" is u10) is, and
# its unit: u/v wind components, t temperature, z geopotential (not height), r relative humidity, at a
# pressure level in hPa or near the surface.
CHANNEL_QUANTITIES: dict[str, tuple[str, str]] = {
    "u10": ("10 m eastward wind", "m/s"),
    "v10": ("10 m northward wind", "m/s"),
    "t2m": ("2 m temperature", "K"),
    "sp": ("surface pressure", "Pa"),
    "msl": ("mean sea-level pressure", "Pa"),
    "t850": ("temperature at 850 hPa", "K"),
    "u1000": ("eastward wind at 1000 hPa", "m/s"),
    "v1000": ("northward wind at 1000 hPa", "m/s"),
    "z1000": ("geopotential at 1000 hPa", "m^2/s^2"),
    "u850": ("eastward wind at 850 hPa", "m/s"),
    "v850": ("northward wind at 850 hPa", "m/s"),
    "z850": ("geopotential at 850 hPa", "m^2/s^2"),
    "u500": ("eastward wind at 500 hPa", "m/s"),
    "v500": ("northward wind at 500 hPa", "m/s"),
    "z500": ("geopotential at 500 hPa", "m^2/s^2"),
    "t500": ("temperature at 500 hPa", "K"),
    "z50": ("geopotential at 50 hPa", "m^2/s^2"),
    "r500": ("relative humidity at 500 hPa", "%"),
    "r850": ("relative humidity at 850 hPa", "%"),
    "tcwv": ("total column water vapour", "kg/m^2"),
}


def channel_unit(name: str) -> str:
    """The physical unit of an ERA5 channel (u10, t850, z500, ...); "" for a channel the table lacks."""
    return CHANNEL_QUANTITIES.get(name, ("", ""))[1]


def grid_extent(
    grid: GridCoordinates, height: int, width: int
) -> tuple[tuple[float, float, float, float], str | None]:
    """The (west, east, first row's edge, last row's edge) pixel edges in degrees of the top-left ``height`` x
    ``width`` crop of ``grid`` (matplotlib's ``extent`` for an image whose row 0 is drawn at the top: a grid
    stored north to south shows north up); and, for a crop, what part of the grid it is (None when it is the
    whole grid). Edges lie half a grid spacing beyond the outer rows' and columns' centres."""
    latitudes, longitudes = grid.latitudes, grid.longitudes
    file_height, file_width = len(latitudes), len(longitudes)
    # Signed spacing: negative for rows that run north to south. One row or column: a 1-degree pixel.
    dlat = float(latitudes[1] - latitudes[0]) if file_height > 1 else -1.0
    dlon = float(longitudes[1] - longitudes[0]) if file_width > 1 else 1.0
    first_row = float(latitudes[0]) - dlat / 2
    last_row = float(latitudes[height - 1]) + dlat / 2
    extent = (float(longitudes[0]) - dlon / 2, float(longitudes[width - 1]) + dlon / 2, last_row, first_row)
    whole = (height, width) == (file_height, file_width)
    region = None if whole else f"top-left {height}x{width} crop of the {file_height}x{file_width} grid"
    return extent, region


class ERA5Evaluator(Evaluator):
    """Per-sample loss and latitude-weighted RMSE per channel, for the model and for persistence."""

    def __init__(self, dataset: ERA5Dataset, image_channel: str | None = None):
        self.n_out = dataset.cfg.n_out_channels
        self.names = dataset.channel_names[: self.n_out]
        self.stds = np.asarray(dataset.stds[: self.n_out], dtype=np.float64)
        self.normalized = dataset.normalize  # False: the fields, and so the RMSEs, are in physical units
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
        self.image_labels = self._image_labels(dataset)
        self.reset()

    def _image_labels(self, dataset: ERA5Dataset) -> dict:
        """What the image's channel is, its unit and how to de-normalize it, and where on Earth it lies."""
        name = self.names[self.image_index]
        quantity, unit = CHANNEL_QUANTITIES.get(name, (None, None))
        labels: dict = {"quantity": quantity, "unit": unit}
        if unit is not None and dataset.normalize:
            labels["scale"] = float(dataset.stds[self.image_index])
            labels["offset"] = float(dataset.means[self.image_index])
        labels["extent"], labels["region"] = grid_extent(dataset.grid, *dataset.cfg.img_size)
        return labels

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
                **self.image_labels,
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
        # Each RMSE in its channel's unit: of normalized fields, so times the channel's standard deviation.
        units = {f"RMSE/{name}": self._unit(c) for c, name in enumerate(self.names)}
        units[headline] = units[f"RMSE/{self.names[self.headline_index]}"]
        i = self.headline_index
        unit, scale = units[headline]
        if self.normalized and unit != "normalized":  # the physical value first, as everywhere else
            model = f"{rmse[i] * scale:.3g} {unit} ({rmse[i]:.4f} normalized)"
            baseline_text = f"{baseline_rmse[i] * scale:.3g} {unit} ({baseline_rmse[i]:.4f})"
        else:
            model, baseline_text = f"{rmse[i]:.4f} {unit}".rstrip(), f"{baseline_rmse[i]:.4f}"
        line = (
            f"  Val {headline}={model}; persistence {baseline_text}, ratio {rmse[i] / baseline_rmse[i]:.2f}"
        )
        return EvalSummary(
            loss=float(self.sums.mean("loss")),
            scalars=scalars,
            headline=headline,
            lines=[line],
            baseline_name="persistence",
            baseline_scalars=baseline,
            example=self.example,
            channel_skill=ChannelSkill(
                metric="latitude-weighted RMSE",
                baseline_name="persistence",
                channels=tuple(self.names),
                model=rmse,
                baseline=baseline_rmse,
                units=tuple(channel_unit(name) for name in self.names),
                scales=self.stds,
            ),
            units=units,
            samples=self.sums.count,
        )

    def _unit(self, index: int) -> tuple[str, float]:
        """(unit, scale) of channel ``index``'s RMSE: its physical unit and the standard deviation that
        normalized it; ("normalized", 1) for a channel whose unit the table lacks."""
        unit = channel_unit(self.names[index])
        if not self.normalized:
            return unit, 1.0  # already physical ("" where the unit is unknown: shown as computed)
        return (unit, float(self.stds[index])) if unit else ("normalized", 1.0)
