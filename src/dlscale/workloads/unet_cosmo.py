"""Dark matter -> gas with a 3D U-Net (the sc21/sc22 "Deep Learning at Scale" tutorial's workload).

Loss: L1 over all voxels and channels, plus ``lambda_rho`` times the L1 of the densities in physical units,
``exp(14 x)`` of channel 0 (the tutorial's optional term; off by default). Metrics: that loss per sample, the
L1 of each target channel, and the same for predicting zeros (L1 = mean |target|), the baseline the model
must beat by far; the image is the central slice of one channel of the first validation sample.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlscale.data.cosmo.config import CosmoDataConfig
from dlscale.errors import ConfigError
from dlscale.models.unet3d_config import UNetConfig
from dlscale.workloads.protocol import Workload, split_not_offered

if TYPE_CHECKING:
    import torch

    from dlscale.data.cosmo.dataset import CosmoCropDataset
    from dlscale.models.unet3d import UNet3D
    from dlscale.workloads.cosmo_metrics import CosmoEvaluator

# torch and the model are imported inside the methods: reading a config imports this module for its two config
# classes, and must stay instant (see dlscale.workloads). A user's own workload need not bother.


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
        from dlscale.data.cosmo.dataset import CosmoCropDataset

        return {"train": CosmoCropDataset(data_cfg, "train"), "valid": CosmoCropDataset(data_cfg, "valid")}

    def build_split(self, data_cfg: CosmoDataConfig, split: str) -> CosmoCropDataset:
        """``valid``: the crops of the validation volume (``data.val_path``), the data's one held-out volume."""
        from dlscale.data.cosmo.dataset import CosmoCropDataset

        if split != "valid":
            why = "the data has one held-out volume, the validation volume (data.val_path)"
            raise split_not_offered(self.name, split, ["valid"], why if split != "train" else "")
        return CosmoCropDataset(data_cfg, "valid")

    def build_model(self, model_cfg: UNetConfig, data_cfg: CosmoDataConfig) -> UNet3D:
        from dlscale.models.unet3d import UNet3D, size_problem

        problem = size_problem(model_cfg, data_cfg.data_size)
        if problem is not None:
            raise ConfigError(f"model.full_scale / data.data_size: {problem}")
        return UNet3D(model_cfg, data_cfg.N_in_channels, data_cfg.N_out_channels)

    def forward_flops_per_sample(self, model_cfg: UNetConfig, data_cfg: CosmoDataConfig) -> int:
        """Analytic forward FLOPs of one crop (every convolution's multiply-adds), for TFLOP/s and MFU."""
        from dlscale.models.unet3d import unet_flops_per_sample

        return unet_flops_per_sample(
            model_cfg, data_cfg.data_size, data_cfg.N_in_channels, data_cfg.N_out_channels
        )

    def loss(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        from dlscale.workloads.cosmo_metrics import cosmo_loss

        return cosmo_loss(prediction, target, self.lambda_rho)

    def evaluator(self, valid_dataset: CosmoCropDataset, image_channel: str | None = None) -> CosmoEvaluator:
        from dlscale.workloads.cosmo_metrics import CosmoEvaluator

        return CosmoEvaluator(valid_dataset, self.lambda_rho, image_channel)

    def describe_model(self, model: UNet3D) -> str:
        from dlscale.models.parameters import count_parameters

        cfg = model.cfg
        return (
            f"3D U-Net with {count_parameters(model):,} parameters: {cfg.levels} levels "
            f"(full_scale {cfg.full_scale}), widths {'-'.join(map(str, cfg.widths()))}"
            + (f", lambda_rho {cfg.lambda_rho}" if cfg.lambda_rho else "")
        )


WORKLOAD = UNetCosmo()
