"""MNIST digits with the small CNN of the USC CARC deep-learning workshop (PyTorch's MNIST example).

Loss: the negative log-likelihood of the network's log-probabilities (``F.nll_loss``). Metrics: the loss and
top-1 accuracy on the validation split (MNIST's 10,000 test images, which the workshop tests on after every
epoch), next to chance and the majority-class baseline (:class:`~dlscale.scoring.classification.ClassificationEvaluator`), plus the
workshop's own ``Test set: Average loss: ..., Accuracy: c/N (p%)`` line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlscale.data.mnist.config import MNISTDataConfig
from dlscale.models.cnn_config import CNNConfig
from dlscale.workloads.protocol import Workload, split_not_offered

if TYPE_CHECKING:
    import numpy as np
    import torch

    from dlscale.data.mnist.dataset import MNISTDataset
    from dlscale.models.cnn import MnistCNN
    from dlscale.workloads.mnist_metrics import MnistEvaluator

# torch and the model are imported inside the methods: reading a config imports this module for its two config
# classes, and must stay instant (see dlscale.workloads). A user's own workload need not bother.


class CNNMnist(Workload):
    """The MNIST + CNN workload (see the module docstring)."""

    name = "cnn_mnist"
    data_config = MNISTDataConfig
    model_config = CNNConfig

    def build_datasets(self, data_cfg: MNISTDataConfig) -> dict[str, MNISTDataset]:
        from dlscale.data.mnist.dataset import MNISTDataset

        return {"train": MNISTDataset(data_cfg, "train"), "valid": MNISTDataset(data_cfg, "valid")}

    def build_split(self, data_cfg: MNISTDataConfig, split: str) -> MNISTDataset:
        """``test`` (or ``valid``, the same): MNIST's test images (t10k), which the run validates on."""
        from dlscale.data.mnist.dataset import MNISTDataset

        if split not in ("valid", "test"):
            offered = ["test (MNIST's test images, the run's validation set)"]
            raise split_not_offered(self.name, split, offered)
        return MNISTDataset(data_cfg, "valid")

    def build_model(self, model_cfg: CNNConfig, data_cfg: MNISTDataConfig) -> MnistCNN:
        from dlscale.models.cnn import MnistCNN

        return MnistCNN(model_cfg)

    def loss(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F

        return F.nll_loss(prediction, target)

    def evaluator(self, valid_dataset: MNISTDataset, image_channel: str | None = None) -> MnistEvaluator:
        from dlscale.workloads.mnist_metrics import MnistEvaluator

        # ``image_channel`` (log.image_channel) names a channel of gridded outputs; a classifier has none.
        return MnistEvaluator()

    def normalization_stats(self, data_cfg: MNISTDataConfig) -> dict[str, np.ndarray]:
        """``data.mean`` and ``data.std`` as float32 (1, 1, 1) arrays: inputs are pixels on the [0, 1] scale
        (the idx file's bytes / 255); the outputs are log-probabilities, which need no conversion."""
        import numpy as np

        return {
            "input_mean": np.full((1, 1, 1), data_cfg.mean, dtype=np.float32),
            "input_std": np.full((1, 1, 1), data_cfg.std, dtype=np.float32),
        }

    def describe_model(self, model: MnistCNN) -> str:
        from dlscale.models.parameters import count_parameters

        return (
            f"CNN with {count_parameters(model):,} parameters: conv 1->32->64 (3x3), max-pool, "
            f"fc 9216->128->10, dropout {model.dropout1.p} / {model.dropout2.p}"
        )


WORKLOAD = CNNMnist()
