"""Validation of a multi-step run: the workload's own metrics on the first step, and the K-step loss beside them.

A multi-step run's validation samples are an initial state and the K states after it
(:class:`dlscale.data.rollout_samples.RolloutSamples`). :func:`rollout_predictions` rolls the model K steps
(the validation ``predict``, so the FSDP2 lockstep of :func:`~dlscale.scoring.evaluator.evaluate`, which repeats
a ``predict`` call, repeats a whole rollout), and :class:`RolloutEvaluator` hands the workload's evaluator the
first step, exactly what it sees in a one-step run (its loss stays the run's ``val_loss``, which picks the best
checkpoint, so a fine-tuned run's numbers line up with its base run's), and adds the mean K-step loss, the
quantity the run trains on, as the scalar ``loss(K-step rollout)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from dlscale.scoring.evaluator import EvalSummary, Evaluator

Predict = Callable[[torch.Tensor], torch.Tensor]
LossFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def rollout_predictions(predict: Predict, inputs: torch.Tensor, steps: int) -> torch.Tensor:
    """(B, steps, ...): the model's predictions ``steps`` autoregressive steps from ``inputs`` (B, ...)."""
    outputs, state = [], inputs
    for _ in range(steps):
        state = predict(state)
        outputs.append(state)
    return torch.stack(outputs, dim=1)


class RolloutPredict:
    """The validation ``predict`` of a multi-step run: inputs -> (B, K, ...) rollout predictions."""

    def __init__(self, predict: Predict, steps: int):
        self.predict = predict
        self.steps = steps

    def __call__(self, inputs: torch.Tensor) -> torch.Tensor:
        return rollout_predictions(self.predict, inputs, self.steps)


def rollout_loss_name(steps: int) -> str:
    return f"loss({steps}-step rollout)"


class RolloutEvaluator:
    """The workload's ``evaluator`` on each rollout's first step, plus the mean ``loss`` over its K steps."""

    def __init__(self, evaluator: Evaluator, loss_fn: LossFunction, steps: int):
        self.evaluator = evaluator
        self.loss_fn = loss_fn
        self.steps = steps
        self.name = rollout_loss_name(steps)
        self.reset()

    def reset(self) -> None:
        self.evaluator.reset()
        self._sums = torch.zeros(2, dtype=torch.float64)  # (sum over samples of the K-step loss, samples)

    def update(self, inputs: torch.Tensor, targets: torch.Tensor, predictions: torch.Tensor) -> None:
        """``targets`` and ``predictions``: (B, K, ...)."""
        self.evaluator.update(inputs, targets[:, 0], predictions[:, 0])
        predictions = predictions.float()
        losses = [self.loss_fn(predictions[:, k], targets[:, k]) for k in range(self.steps)]
        batch_mean = torch.stack(losses).double().mean()
        count = inputs.shape[0]
        self._sums = self._sums.to(batch_mean.device)
        self._sums += torch.stack([batch_mean * count, torch.tensor(float(count), device=batch_mean.device)])

    def reduce_across_ranks(self, sum_: Callable[[torch.Tensor], None], device: torch.device) -> None:
        self.evaluator.reduce_across_ranks(sum_, device)
        self._sums = self._sums.to(device)
        sum_(self._sums)

    def summary(self) -> EvalSummary:
        summary = self.evaluator.summary()
        total, count = (float(value) for value in self._sums.cpu())
        value = total / count if count > 0 else float("nan")
        summary.scalars[self.name] = value
        summary.lines.append(
            f"  {self.steps}-step rollout loss {value:.4g} (the first step's is the loss above)"
        )
        return summary
