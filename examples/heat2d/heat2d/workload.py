"""The heat2d workload: a CNN surrogate that learns one time step of 2D heat conduction in a heterogeneous medium.

What dlscale needs from a workload: its two config sections, the data sets, the model and the loss. The rest
is optional: ``evaluator`` (its metrics against the persistence baseline, through dlscale's
:class:`~dlscale.scoring.metric_evaluator.MetricEvaluator`; without it, validation reports the loss) and
``normalization_stats`` (what ``dlscale export`` saves beside the weights); the model's one-line description and
its FLOP count come from dlscale's defaults. The package's ``pyproject.toml`` registers ``WORKLOAD`` under the
``dlscale.workloads`` entry points, which is how ``workload: heat2d`` in a config finds it.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import torch
import torch.nn.functional as F

from dlscale.scoring.metric_evaluator import MetricEvaluator
from dlscale.workloads.protocol import Workload
from heat2d.config import SPLITS, Heat2DDataConfig, Heat2DModelConfig
from heat2d.dataset import Heat2DDataset
from heat2d.generate import generate_missing
from heat2d.model import HeatSurrogate


class Heat2D(Workload):
    name = "heat2d"
    data_config = Heat2DDataConfig
    model_config = Heat2DModelConfig

    def build_datasets(self, data_cfg: Heat2DDataConfig) -> dict[str, Heat2DDataset]:
        if data_cfg.generate_if_missing:
            # Every rank may get here at once: the files are written atomically and come out identical.
            generate_missing(data_cfg)
        return {split: Heat2DDataset(data_cfg, split) for split in SPLITS}

    def build_model(self, model_cfg: Heat2DModelConfig, data_cfg: Heat2DDataConfig) -> HeatSurrogate:
        return HeatSurrogate(model_cfg)

    def loss(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(prediction, target)

    def evaluator(self, valid_dataset: Heat2DDataset, image_channel: str | None = None) -> MetricEvaluator:
        # Optional: each sample's RMSE and largest error, for the model and for persistence (u_{k+1} = u_k,
        # the untrained model), the baseline to beat; dlscale reports the skill 1 - model / persistence.
        def metrics(prediction: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
            error = (prediction - target).flatten(1)
            return {"RMSE": error.pow(2).mean(dim=1).sqrt(), "max_error": error.abs().amax(dim=1)}

        def persistence(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return inputs[:, :1]  # channel 0 of the input is u_k

        return MetricEvaluator(
            valid_dataset,
            self.loss,
            metrics,
            persistence,
            baseline_name="persistence",
            image_channel=image_channel,
        )

    def configured(self, model_cfg: Heat2DModelConfig, data_cfg: Heat2DDataConfig) -> Heat2D:
        # Optional: the run's copy of the workload; data.rollout_frames > 1 trains through a rollout loss.
        return Heat2DRollout() if data_cfg.rollout_frames > 1 else self

    def normalization_stats(self, data_cfg: Heat2DDataConfig) -> dict[str, np.ndarray]:
        # Optional: saved by `dlscale export`, so that the exported model maps physical fields (u, kappa) to its
        # inputs and its prediction back to a temperature without the data files.
        data = Heat2DDataset(data_cfg, "valid")  # normalized with the training split's statistics
        column = partial(np.array, dtype=np.float32, ndmin=3)
        return {
            "input_mean": column([data.u_mean, data.kappa_mean]).reshape(2, 1, 1),
            "input_std": column([data.u_std, data.kappa_std]).reshape(2, 1, 1),
            "output_mean": column(data.u_mean),
            "output_std": column(data.u_std),
        }


class Heat2DRollout(Heat2D):
    """Trains the surrogate through its own rollout: the model applied to its own output, data.rollout_frames
    times, against the next frames. A one-step loss never shows the model its own errors, which grow when it is
    stepped autoregressively; this one does. Validation stays the one-step RMSE against persistence."""

    def training_loss(self, model, batch: tuple[torch.Tensor, torch.Tensor], step: int) -> torch.Tensor:
        inputs, targets = batch  # targets: (B, rollout_frames, N, N), the next frames
        u, kappa, losses = inputs[:, :1], inputs[:, 1:], []
        for k in range(targets.shape[1]):
            u = model(torch.cat([u, kappa], dim=1))  # the prediction is the next step's input
            losses.append(self.loss(u, targets[:, k : k + 1]))
        return torch.stack(losses).mean()


WORKLOAD = Heat2D()
