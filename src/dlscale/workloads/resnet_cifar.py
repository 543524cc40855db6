"""CIFAR-100 classification with a ResNet (the CSC/LUMI summer school's ResNet-152 demo).

Loss: cross-entropy of the logits. Metrics: loss and top-1 accuracy on the test split, next to chance and the
always-the-most-frequent-class baseline (:class:`~dlscale.scoring.classification.ClassificationEvaluator`).
FLOPs for TFLOP/s and MFU are analytic (every conv and the linear layer), equal to what FlopCounterMode counts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlscale.data.cifar.config import CIFARDataConfig
from dlscale.errors import ConfigError
from dlscale.models.resnet_config import ResNetConfig
from dlscale.workloads.protocol import Workload, split_not_offered

if TYPE_CHECKING:
    import numpy as np
    import torch

    from dlscale.data.cifar.dataset import CIFARDataset
    from dlscale.models.resnet import ResNet
    from dlscale.scoring.classification import ClassificationEvaluator

# torch and the model are imported inside the methods: reading a config imports this module for its two config
# classes, and must stay instant (see dlscale.workloads). A user's own workload need not bother.


class ResNetCIFAR(Workload):
    """The CIFAR-100 + ResNet workload (see the module docstring)."""

    name = "resnet_cifar"
    data_config = CIFARDataConfig
    model_config = ResNetConfig

    def build_datasets(self, data_cfg: CIFARDataConfig) -> dict[str, CIFARDataset]:
        from dlscale.data.cifar.dataset import CIFARDataset

        return {"train": CIFARDataset(data_cfg, "train"), "valid": CIFARDataset(data_cfg, "valid")}

    def build_split(self, data_cfg: CIFARDataConfig, split: str) -> CIFARDataset:
        """``test`` (or ``valid``, the same): CIFAR's test.bin, which the run validates on."""
        from dlscale.data.cifar.dataset import CIFARDataset

        if split not in ("valid", "test"):
            raise split_not_offered(self.name, split, ["test (test.bin, the run's validation set)"])
        return CIFARDataset(data_cfg, "valid")

    def build_model(self, model_cfg: ResNetConfig, data_cfg: CIFARDataConfig) -> ResNet:
        from dlscale.models.resnet import ResNet

        if model_cfg.num_classes != data_cfg.num_classes:
            raise ConfigError(
                f"model.num_classes is {model_cfg.num_classes}, but data.label '{data_cfg.label}' has "
                f"{data_cfg.num_classes} classes; set model.num_classes={data_cfg.num_classes}"
            )
        return ResNet(model_cfg)

    def forward_flops_per_sample(self, model_cfg: ResNetConfig, data_cfg: CIFARDataConfig) -> int:
        """Analytic forward FLOPs of one image (2 per multiply-accumulate of the convs and the linear layer)."""
        from dlscale.models.resnet import resnet_flops_per_sample

        return resnet_flops_per_sample(model_cfg, data_cfg.image_size)

    def loss(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F

        return F.cross_entropy(prediction, target)

    def evaluator(
        self, valid_dataset: CIFARDataset, image_channel: str | None = None
    ) -> ClassificationEvaluator:
        from dlscale.scoring.classification import ClassificationEvaluator, per_sample_cross_entropy

        # image_channel names a field channel to plot for the gridded workloads; classifiers have none.
        return ClassificationEvaluator(
            valid_dataset.num_classes, per_sample_cross_entropy, valid_dataset.class_names
        )

    def normalization_stats(self, data_cfg: CIFARDataConfig) -> dict[str, np.ndarray]:
        """``data.mean`` and ``data.std`` as float32 (3, 1, 1) arrays: inputs are RGB images on the [0, 1] scale,
        already of the model's size (``data.resize``); the outputs are logits, which need no conversion."""
        import numpy as np

        return {
            "input_mean": np.asarray(data_cfg.mean, dtype=np.float32).reshape(3, 1, 1),
            "input_std": np.asarray(data_cfg.std, dtype=np.float32).reshape(3, 1, 1),
        }

    def describe_model(self, model: ResNet) -> str:
        from dlscale.models.parameters import count_parameters

        cfg = model.cfg
        stem = "3x3 stride-1 stem (no max-pool)" if cfg.small_input_stem else "7x7 stride-2 stem + max-pool"
        return (
            f"ResNet-{cfg.depth} with {count_parameters(model):,} parameters: {cfg.block_kind} blocks, width "
            f"{cfg.width}, {stem}, {cfg.num_classes} classes"
        )


WORKLOAD = ResNetCIFAR()
