"""MNIST digits with the small CNN of the USC CARC deep-learning workshop (PyTorch's MNIST example).

Loss: the negative log-likelihood of the network's log-probabilities (``F.nll_loss``). Metrics: the loss and
top-1 accuracy on the validation split (MNIST's 10,000 test images, which the workshop tests on after every
epoch), next to chance and the majority-class baseline (:class:`ClassificationEvaluator`), plus the
workshop's own ``Test set: Average loss: ..., Accuracy: c/N (p%)`` line.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dlscale.data.mnist import MNISTDataset
from dlscale.data.mnist_config import NUM_CLASSES, MNISTDataConfig
from dlscale.models.cnn import MnistCNN, count_parameters
from dlscale.models.cnn_config import CNNConfig
from dlscale.train.evaluate import EvalSummary
from dlscale.workloads.classification import ClassificationEvaluator
from dlscale.workloads.protocol import Workload


def nll_per_sample(log_probabilities: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The negative log-likelihood of each sample's label (B,)."""
    return F.nll_loss(log_probabilities, labels, reduction="none")


class MnistEvaluator(ClassificationEvaluator):
    """Accuracy against the baselines, and the workshop's test line (average loss, correct / total)."""

    def __init__(self) -> None:
        super().__init__(NUM_CLASSES, nll_per_sample)

    def summary(self) -> EvalSummary:
        summary = super().summary()
        count = summary.samples
        correct = round(float(self.sums.mean("correct")) * count)
        summary.lines.append(
            f"  Test set: Average loss: {summary.loss:.4f}, Accuracy: {correct}/{count} "
            f"({100.0 * correct / max(count, 1):.0f}%)"
        )
        return summary


class CNNMnist(Workload):
    """The MNIST + CNN workload (see the module docstring)."""

    name = "cnn_mnist"
    data_config = MNISTDataConfig
    model_config = CNNConfig

    def build_datasets(self, data_cfg: MNISTDataConfig) -> dict[str, MNISTDataset]:
        return {"train": MNISTDataset(data_cfg, "train"), "valid": MNISTDataset(data_cfg, "valid")}

    def build_model(self, model_cfg: CNNConfig, data_cfg: MNISTDataConfig) -> MnistCNN:
        return MnistCNN(model_cfg)

    def loss(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.nll_loss(prediction, target)

    def evaluator(self, valid_dataset: MNISTDataset, image_channel: str | None = None) -> MnistEvaluator:
        # ``image_channel`` (log.image_channel) names a channel of gridded outputs; a classifier has none.
        return MnistEvaluator()

    def describe_model(self, model: MnistCNN) -> str:
        return (
            f"CNN with {count_parameters(model):,} parameters: conv 1->32->64 (3x3), max-pool, "
            f"fc 9216->128->10, dropout {model.dropout1.p} / {model.dropout2.p}"
        )


WORKLOAD = CNNMnist()
