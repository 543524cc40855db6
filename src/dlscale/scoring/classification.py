"""Scores of a classifier: loss and top-1 accuracy, and the confusion matrix (in the summary's ``class_counts``)
that the report draws as per-class accuracy and, for up to 20 classes, as a matrix.

The baseline every classifier must beat is chance (1 / classes) and, stricter on an unbalanced validation set,
always answering the most frequent class; both are reported next to the model's accuracy. A workload names its
classes and its per-sample loss (``nll_per_sample`` for log-probabilities, ``per_sample_cross_entropy`` for
logits); the MNIST and CIFAR workloads use this evaluator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from dlscale.scoring.evaluator import ClassCounts, EvalSummary, Evaluator
from dlscale.scoring.metrics import MetricSums

# (logits or log-probabilities (B, classes), labels (B,)) -> per-sample losses (B,)
PerSampleLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class ClassificationEvaluator(Evaluator):
    """Per-sample loss and top-1 accuracy, plus the class histogram for the majority-class baseline."""

    def __init__(
        self, num_classes: int, per_sample_loss: PerSampleLoss, class_names: Sequence[str] | None = None
    ):
        self.num_classes = num_classes
        self.per_sample_loss = per_sample_loss
        self.class_names = tuple(class_names) if class_names is not None else None
        self.reset()

    def reset(self) -> None:
        classes = self.num_classes
        self.sums = MetricSums().declare(
            loss=(), correct=(), labels=(classes,), confusion=(classes * classes,)
        )

    def reduce_across_ranks(self, sum_: Callable[[torch.Tensor], None], device: torch.device) -> None:
        """Sum over data-parallel ranks (each evaluated its own share of the samples)."""
        self.sums.sum_across_ranks(sum_, device)

    def update(self, inputs: torch.Tensor, targets: torch.Tensor, predictions: torch.Tensor) -> None:
        labels = targets.long()
        self.sums.add(
            inputs.shape[0],
            loss=self.per_sample_loss(predictions.float(), labels),
            correct=(predictions.argmax(dim=1) == labels).double(),
            labels=torch.nn.functional.one_hot(labels, self.num_classes).double(),
            # (true, predicted) pairs counted for the whole batch at once: one row that the sum keeps as is
            confusion=self._confusion_of_batch(labels, predictions).unsqueeze(0),
        )

    def _confusion_of_batch(self, labels: torch.Tensor, predictions: torch.Tensor) -> torch.Tensor:
        """The batch's confusion counts, flattened: entry true * classes + predicted."""
        pairs = labels * self.num_classes + predictions.argmax(dim=1)
        return torch.bincount(pairs, minlength=self.num_classes * self.num_classes)

    def summary(self) -> EvalSummary:
        accuracy = float(self.sums.mean("correct"))
        count = self.sums.count
        majority = float(self.sums.mean("labels").max())
        chance = 1.0 / self.num_classes
        line = (
            f"  Val accuracy={accuracy:.2%} ({round(accuracy * count)}/{count}); "
            f"chance {chance:.2%}, always the most frequent class {majority:.2%}"
        )
        return EvalSummary(
            loss=float(self.sums.mean("loss")),
            scalars={"accuracy": accuracy},
            headline="accuracy",
            lines=[line],
            baseline_name="majority class",
            baseline_scalars={"accuracy": majority},
            class_counts=self.class_counts(),
            samples=count,
        )

    def class_counts(self) -> ClassCounts:
        """The confusion matrix of the samples evaluated so far (summed over ranks once reduced)."""
        flat = self.sums.sums["confusion"].cpu().round().to(torch.int64).numpy()
        return ClassCounts(flat.reshape(self.num_classes, self.num_classes), self.class_names)


def nll_per_sample(log_probabilities: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The negative log-likelihood of each sample's label (B,)."""
    return F.nll_loss(log_probabilities, labels, reduction="none")


def per_sample_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each sample (B,)."""
    return F.cross_entropy(logits, labels, reduction="none")
