"""ERA5 weather forecasting with a ViT: predict the atmosphere 6 hours ahead (the NERSC tutorial's workload).

The model's blocks mix tokens by attention (the tutorial's ViT), by FourCastNet's adaptive Fourier neural operator
(``model.mixer: afno``) or by the spherical Fourier neural operator's convolution on the data's latitudes
(``model.mixer: sfno``; docs/models.md); only attention has a tensor/context-parallel form.

Loss: relative L2 per sample. Metrics: the loss and the latitude-weighted RMSE of every channel on normalized
fields (the tutorial's ``RMSE(u10m)`` is channel u10), next to the same metrics for *persistence* (tomorrow
equals today), the baseline a forecast must beat.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlscale.data.era5.config import ERA5DataConfig
from dlscale.models.vit_config import ViTConfig
from dlscale.workloads.protocol import Workload, split_not_offered

if TYPE_CHECKING:
    import numpy as np
    import torch

    from dlscale.data.era5.dataset import ERA5Dataset
    from dlscale.data.era5.trajectories import ERA5Trajectories
    from dlscale.models.vit import VisionTransformer
    from dlscale.workloads.era5_metrics import ERA5Evaluator

# torch and the model are imported inside the methods: reading a config imports this module for its two config
# classes, and must stay instant (see dlscale.workloads). A user's own workload need not bother.


class ERA5ViT(Workload):
    """The ERA5 + ViT workload (see the module docstring)."""

    name = "era5_vit"
    data_config = ERA5DataConfig
    model_config = ViTConfig

    def build_datasets(self, data_cfg: ERA5DataConfig) -> dict[str, ERA5Dataset]:
        from dlscale.data.era5.dataset import ERA5Dataset

        return {"train": ERA5Dataset(data_cfg, "train"), "valid": ERA5Dataset(data_cfg, "valid")}

    def build_split(self, data_cfg: ERA5DataConfig, split: str) -> ERA5Dataset:
        """``valid``, or ``test``: the held-out years of ``data.inf_data_path`` (the tutorial's ``test/``)."""
        from dlscale.data.era5.dataset import ERA5Dataset

        self._check_held_out_split(data_cfg, split)
        return ERA5Dataset(data_cfg, split)

    def _check_held_out_split(self, data_cfg: ERA5DataConfig, split: str) -> None:
        """One line naming the split and what the workload offers, when ``split`` is no held-out directory."""
        keys = {"valid": "valid_data_path", "test": "inf_data_path"}
        if split not in keys:
            raise split_not_offered(self.name, split, list(keys))
        directory = data_cfg.path(keys[split])
        if not directory.is_dir():
            where = f"data.{keys[split]}={getattr(data_cfg, keys[split])!r} with data.root={data_cfg.root!r}"
            why = (
                f"{directory} is no directory of *.h5 files ({where}; --set data.root=DIR if the data moved)"
            )
            raise split_not_offered(self.name, split, list(keys), why)

    def build_model(self, model_cfg: ViTConfig, data_cfg: ERA5DataConfig) -> VisionTransformer:
        from dlscale.models.vit import VisionTransformer

        latitudes = self.image_latitudes(data_cfg) if model_cfg.mixer == "sfno" else None
        return VisionTransformer(
            model_cfg, data_cfg.img_size, data_cfg.n_in_channels, data_cfg.n_out_channels, latitudes
        )

    def image_latitudes(self, data_cfg: ERA5DataConfig):
        """The latitudes of the rows the model sees (the SFNO mixer's grid): the training files' own where they
        hold them, else the tutorial's grid of their height; without the files (``dlscale plan`` before the
        data exists) the tutorial's grid of an odd height that the crop leaves one row of, as the tutorial's
        360 of 361 rows. A checkpoint carries the transform's tables, so a model rebuilt there computes what it
        was trained to."""
        from dlscale.data.era5.coordinates import formula_latitudes
        from dlscale.data.era5.layout import scan_split
        from dlscale.errors import DataError

        rows = data_cfg.img_size[0]
        try:
            return scan_split(data_cfg, "train_data_path").grid.latitudes[:rows]
        except DataError:
            return formula_latitudes(rows + 1 - rows % 2)[:rows]

    def parallelize(self, model: VisionTransformer, mesh) -> VisionTransformer:
        """This rank's tensor/context-parallel part of the ViT (see dlscale.parallel.vit_parallel); the config
        already refused tp/cp for a mixer other than attention (ViTConfig.check_parallel)."""
        from dlscale.parallel.vit_parallel import parallelize_vit

        return parallelize_vit(model, mesh)

    def fsdp_units(self, model: VisionTransformer) -> list[torch.nn.Module]:
        """The transformer blocks: FSDP2 gathers one block's parameters at a time."""
        return list(model.blocks)

    def forward_flops_per_sample(self, model_cfg: ViTConfig, data_cfg: ERA5DataConfig) -> int:
        """Analytic forward FLOPs of one sample (matmuls and attention), for TFLOP/s and MFU."""
        from dlscale.models.vit import vit_flops_per_sample

        return vit_flops_per_sample(
            model_cfg, data_cfg.img_size, data_cfg.n_in_channels, data_cfg.n_out_channels
        )

    def loss(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        from dlscale.scoring.metrics import relative_l2_loss

        return relative_l2_loss(prediction, target)

    def evaluator(self, valid_dataset: ERA5Dataset, image_channel: str | None = None) -> ERA5Evaluator:
        from dlscale.workloads.era5_metrics import ERA5Evaluator

        return ERA5Evaluator(valid_dataset, image_channel)

    def normalization_stats(self, data_cfg: ERA5DataConfig) -> dict[str, np.ndarray]:
        """The per-channel means and standard deviations of ``data.global_means_path`` and ``global_stds_path``
        that the data set normalizes with, as float32 (C, 1, 1): the first n_in_channels for the inputs, the
        first n_out_channels for the outputs (fields in their physical units, as in the HDF5 files)."""
        from dlscale.data.era5.dataset import ERA5Dataset

        dataset = ERA5Dataset(data_cfg, "valid")  # reads and checks the stats files as training does
        n_out = data_cfg.n_out_channels
        return {
            "input_mean": dataset.means.reshape(-1, 1, 1),
            "input_std": dataset.stds.reshape(-1, 1, 1),
            "output_mean": dataset.means[:n_out].reshape(-1, 1, 1),
            "output_std": dataset.stds[:n_out].reshape(-1, 1, 1),
        }

    def forecast_data(self, data_cfg: ERA5DataConfig, split: str) -> ERA5Trajectories:
        """The ``valid`` or ``test`` years as trajectories for ``dlscale forecast`` (20 channels in and out: the
        prediction is the next input), with each channel's unit and name; ``train`` too, which multi-step
        training reads (dlscale.data.rollout_samples)."""
        from dlscale.data.era5.trajectories import ERA5Trajectories
        from dlscale.workloads.era5_metrics import CHANNEL_QUANTITIES

        if split != "train":
            self._check_held_out_split(data_cfg, split)
        return ERA5Trajectories(data_cfg, split, CHANNEL_QUANTITIES)

    def describe_model(self, model: VisionTransformer) -> str:
        from dlscale.models.parameters import count_parameters

        return (
            f"ViT with {count_parameters(model):,} parameters: embed {model.embed_dim}, depth {len(model.blocks)}, "
            f"patch {model.patch_size}, {model.num_tokens} tokens ({model.grid_size[0]}x{model.grid_size[1]}), "
            f"mixer {model.mixer}"
        )


WORKLOAD = ERA5ViT()
