"""The classification evaluator: per-sample sums, accuracy, the majority-class baseline, and rank sums."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dlscale.scoring.classification import ClassificationEvaluator


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, labels, reduction="none")


def test_accuracy_loss_and_baseline_do_not_depend_on_how_samples_are_batched():
    torch.manual_seed(0)
    logits = torch.randn(10, 4)
    labels = torch.tensor([0, 0, 0, 0, 1, 1, 2, 3, 3, 3])
    logits[:6] += 5 * F.one_hot(labels[:6], 4)  # the first six are right, the rest are chance
    expected_correct = int((logits.argmax(1) == labels).sum())
    summaries = []
    for batch in (10, 3):
        evaluator = ClassificationEvaluator(4, cross_entropy)
        for start in range(0, 10, batch):
            part = slice(start, start + batch)
            evaluator.update(torch.zeros(labels[part].shape[0], 1), labels[part], logits[part])
        summaries.append(evaluator.summary())
    for summary in summaries:
        assert summary.samples == 10
        assert summary.scalars["accuracy"] == pytest.approx(expected_correct / 10)
        assert summary.loss == pytest.approx(float(cross_entropy(logits, labels).mean()))
        assert summary.baseline_scalars["accuracy"] == pytest.approx(0.4)  # class 0 holds 4 of 10
        assert f"({expected_correct}/10)" in summary.lines[0] and "chance 25.00%" in summary.lines[0]


def test_rank_sums_cover_every_metric():
    evaluator = ClassificationEvaluator(3, cross_entropy)
    evaluator.update(torch.zeros(2, 1), torch.tensor([0, 2]), torch.tensor([[2.0, 0, 0], [0, 2.0, 0]]))
    evaluator.reduce_across_ranks(lambda tensor: tensor.mul_(2), torch.device("cpu"))  # as if 2 equal ranks
    summary = evaluator.summary()
    assert summary.samples == 4 and summary.scalars["accuracy"] == pytest.approx(0.5)


def test_the_confusion_matrix_counts_true_against_predicted_classes_over_batches_and_ranks():
    labels = torch.tensor([0, 0, 1, 2, 2, 2])
    predicted = torch.tensor([0, 1, 1, 2, 0, 2])
    logits = F.one_hot(predicted, 3).float()
    evaluator = ClassificationEvaluator(3, cross_entropy)
    evaluator.update(torch.zeros(4, 1), labels[:4], logits[:4])
    evaluator.update(torch.zeros(2, 1), labels[4:], logits[4:])
    counts = evaluator.summary().class_counts
    assert counts.confusion.tolist() == [[1, 1, 0], [0, 1, 0], [1, 0, 2]]
    assert counts.confusion.sum() == 6 and counts.per_class_accuracy().tolist() == pytest.approx(
        [0.5, 1, 2 / 3]
    )
    evaluator.reduce_across_ranks(lambda tensor: tensor.mul_(2), torch.device("cpu"))  # as if 2 equal ranks
    summary = evaluator.summary()
    assert summary.class_counts.confusion.sum() == summary.samples == 12
