"""The heat2d workload: a CNN surrogate that learns one time step of 2D heat conduction in a heterogeneous medium.

This is all dlscale needs from a workload: its two config sections, the data sets, the model and the loss.
Validation (the loss on the valid split), the model's one-line description and its FLOP count come from
dlscale's defaults; ``normalization_stats`` is optional too (what ``dlscale export`` saves beside the weights). The package's ``pyproject.toml`` registers ``WORKLOAD`` under the ``dlscale.workloads``
entry points, which is how ``workload: heat2d`` in a config finds it.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import torch
import torch.nn.functional as F

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


WORKLOAD = Heat2D()
