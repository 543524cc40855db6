"""The MNIST workload's validation: the classifier's scores (:mod:`dlscale.scoring.classification`) with its
10 classes and the negative log-likelihood of the CNN's log-probabilities, plus the USC CARC workshop's own
``Test set: Average loss: ..., Accuracy: c/N (p%)`` line."""

from __future__ import annotations

from dlscale.data.mnist.config import NUM_CLASSES as MNIST_CLASSES
from dlscale.scoring.classification import ClassificationEvaluator, nll_per_sample
from dlscale.scoring.evaluator import EvalSummary


class MnistEvaluator(ClassificationEvaluator):
    """Accuracy against the baselines, and the workshop's test line (average loss, correct / total)."""

    def __init__(self) -> None:
        super().__init__(MNIST_CLASSES, nll_per_sample)

    def summary(self) -> EvalSummary:
        summary = super().summary()
        count = summary.samples
        correct = round(float(self.sums.mean("correct")) * count)
        summary.lines.append(
            f"  Test set: Average loss: {summary.loss:.4f}, Accuracy: {correct}/{count} "
            f"({100.0 * correct / max(count, 1):.0f}%)"
        )
        return summary
