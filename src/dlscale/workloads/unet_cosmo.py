"""Dark matter -> gas with a 3D U-Net (the sc21/sc22 "Deep Learning at Scale" tutorial's workload).

Loss: L1 over all voxels and channels, plus ``lambda_rho`` times the L1 of the densities in physical units,
``exp(14 x)`` of channel 0 (the tutorial's optional term; off by default). Metrics: that loss per sample, the
L1 of each target channel, and the same for predicting zeros (L1 = mean |target|), the baseline the model
must beat by far; the image is the central slice of one channel of the first validation sample.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from dlscale.data.cosmo import CosmoCropDataset
from dlscale.data.cosmo_config import CosmoDataConfig
from dlscale.errors import ConfigError, did_you_mean
from dlscale.models.unet3d import UNet3D, count_parameters, size_problem, unet_flops_per_sample
from dlscale.models.unet3d_config import UNetConfig
from dlscale.train.evaluate import EvalSummary, Evaluator, ExampleImage
from dlscale.train.metrics import MetricSums
from dlscale.workloads.protocol import Workload

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


class UNetCosmo(Workload):
    """The dark-matter -> gas U-Net workload (see the module docstring).

    The loss has a parameter, the density weight ``lambda_rho`` (a ``model:`` key), so a run uses the copy that
    :meth:`configured` binds to its config; the registered instance has ``lambda_rho`` 0.
    """

    name = "unet_cosmo"
    data_config = CosmoDataConfig
    model_config = UNetConfig

    def __init__(self, lambda_rho: float = 0.0) -> None:
        self.lambda_rho = lambda_rho

    def configured(self, model_cfg: UNetConfig, data_cfg: CosmoDataConfig) -> UNetCosmo:
        """This workload with the run's loss parameters (``loss`` and ``evaluator`` only get tensors)."""
        return UNetCosmo(lambda_rho=model_cfg.lambda_rho)

    def build_datasets(self, data_cfg: CosmoDataConfig) -> dict[str, CosmoCropDataset]:
        return {"train": CosmoCropDataset(data_cfg, "train"), "valid": CosmoCropDataset(data_cfg, "valid")}

    def build_model(self, model_cfg: UNetConfig, data_cfg: CosmoDataConfig) -> UNet3D:
        problem = size_problem(model_cfg, data_cfg.data_size)
        if problem is not None:
            raise ConfigError(f"model.full_scale / data.data_size: {problem}")
        return UNet3D(model_cfg, data_cfg.N_in_channels, data_cfg.N_out_channels)

    def forward_flops_per_sample(self, model_cfg: UNetConfig, data_cfg: CosmoDataConfig) -> int:
        """Analytic forward FLOPs of one crop (every convolution's multiply-adds), for TFLOP/s and MFU."""
        return unet_flops_per_sample(
            model_cfg, data_cfg.data_size, data_cfg.N_in_channels, data_cfg.N_out_channels
        )

    def loss(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return cosmo_loss(prediction, target, self.lambda_rho)

    def evaluator(self, valid_dataset: CosmoCropDataset, image_channel: str | None = None) -> CosmoEvaluator:
        return CosmoEvaluator(valid_dataset, self.lambda_rho, image_channel)

    def describe_model(self, model: UNet3D) -> str:
        cfg = model.cfg
        return (
            f"3D U-Net with {count_parameters(model):,} parameters: {cfg.levels} levels "
            f"(full_scale {cfg.full_scale}), widths {'-'.join(map(str, cfg.widths()))}"
            + (f", lambda_rho {cfg.lambda_rho}" if cfg.lambda_rho else "")
        )


WORKLOAD = UNetCosmo()
