"""The pre-flight check: before the first training step, two samples of each split go through the workload's
model, loss and evaluator on the run's device and precision, so that the mistakes every new workload makes are
one line naming the member and the user's file:line (exit 2) instead of a traceback an epoch later, or a run
that trains on the wrong thing and exits 0.

What it checks, in order: ``build_datasets`` returned ``train`` and ``valid``, neither empty; a sample is an
``(input, target)`` pair of torch tensors, alike in shape from sample to sample; floating-point samples have
the dtype of the model's parameters; the prediction has the target's shape (an integer target, class labels,
has the prediction's shape without its class dimension 1); the loss is a finite scalar tensor with a gradient
(a workload with a ``training_loss`` hook: the hook's, at step 0, and the shapes on the validation batch only);
the evaluator's summary has a ``headline`` that is one of its ``scalars``, and every scalar is a number.

float64 samples are an error, not cast: a cast in dlscale would hide that every batch is read, copied to the
device and kept in host memory at twice the bytes, and the fix is one ``.float()`` where the samples are made.

A prediction whose shape differs from the target's is an error even where torch would broadcast it: (B, 40)
against (B, 1, 40) broadcasts to (B, B, 40) in ``mse_loss``, which trains, converges to the wrong thing and
finishes with exit 0.

The check leaves the run as it found it: the random generators are restored (dropout, augmentations), so
are the model's buffers (BatchNorm's running statistics), the gradients are dropped and the evaluator is
reset. It costs one forward and backward of two samples and one evaluation forward of two (``Pre-flight
check passed in ...`` in the log says how long): of one sample where the run's local batch is one, so that the
check never needs more memory than a training step (a model that fits the GPU only at batch 1); two samples
are still read and compared.
"""

from __future__ import annotations

import contextlib
import logging
import numbers
import random
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from dlscale.errors import WorkloadError, did_you_mean
from dlscale.runtime.device import Device
from dlscale.scoring.evaluator import Evaluator
from dlscale.training.precision import Precision
from dlscale.training.training_loss import ModelForLoss
from dlscale.workloads.protocol import Workload
from dlscale.workloads.user_code import files_of_workload, location_in, member_location, raised_by_workload

log = logging.getLogger("dlscale.train")

SPLITS = ("train", "valid")
SAMPLES_PER_BATCH = 2  # two, not one: a model with BatchNorm cannot train on a batch of one sample


@dataclass(frozen=True)
class PreflightReport:
    """What the check saw: the shapes and dtypes of a training batch, the loss, the evaluator's headline."""

    input_shape: tuple[int, ...]
    input_dtype: torch.dtype
    prediction_shape: tuple[int, ...]
    target_shape: tuple[int, ...]
    loss: float
    headline: str
    seconds: float
    loss_member: str = "loss"  # "training_loss" for a workload whose hook computes the training loss

    def describe(self) -> str:
        return (
            f"Pre-flight check passed in {self.seconds:.2f} s: input {shape_text(self.input_shape)} "
            f"{dtype_text(self.input_dtype)} -> prediction {shape_text(self.prediction_shape)}, target "
            f"{shape_text(self.target_shape)}; {self.loss_member} {self.loss:.4g}; evaluator headline {self.headline!r}"
        )


def shape_text(shape: tuple[int, ...]) -> str:
    """A batch's shape with its batch dimension as B, as users think of it: ``(B, 1, 40)``."""
    return "(" + ", ".join(["B", *(str(n) for n in shape[1:])]) + (",)" if len(shape) == 1 else ")")


def dtype_text(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def type_text(value: Any) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


class _Checker:
    """The workload and the places in its files that messages point at."""

    def __init__(self, workload: Workload):
        self.workload = workload
        self.files = files_of_workload(workload)
        self.name = workload.name

    def fail(self, problem: str, *where: str) -> WorkloadError:
        places = "; ".join(w for w in where if w)
        return WorkloadError(f"workload {self.name!r}: {problem}" + (f" ({places})" if places else ""))

    def member(self, member: str) -> str:
        where = member_location(self.workload, member).strip(" ()")
        return f"{member} at {where}" if where else member

    def defined(self, what: str, function: Any, member: str) -> str:
        """Where ``function`` is defined when it is the workload's own code, else where ``member`` is."""
        where = location_in(function, self.files)
        return f"{member}'s {what} at {where}" if where else self.member(member)


def checked_splits(workload: Workload, datasets: Any) -> tuple[Dataset, Dataset]:
    """The train and valid data sets of what ``build_datasets`` returned; WorkloadError naming what it
    returned when either is missing or empty."""
    check = _Checker(workload)
    if not isinstance(datasets, Mapping):
        raise check.fail(
            f"build_datasets returned a {type_text(datasets)}; it must return a dict of data sets, "
            "{'train': ..., 'valid': ...}",
            check.member("build_datasets"),
        )
    for split in SPLITS:
        if split not in datasets:
            returned = ", ".join(repr(name) for name in datasets) or "none"
            others = [str(name) for name in datasets if name not in SPLITS]
            raise check.fail(
                f"build_datasets returned the splits {returned}, without {split!r}{did_you_mean(split, others)}; "
                "it must return {'train': ..., 'valid': ...} (more splits, such as 'test', may follow)",
                check.member("build_datasets"),
            )
        try:
            length = len(datasets[split])
        except TypeError:
            raise check.fail(
                f"the {split!r} data set is a {type_text(datasets[split])} without len(); it must be a "
                "map-style data set (__len__ and __getitem__)",
                check.member("build_datasets"),
            ) from None
        if length == 0:
            raise check.fail(f"the {split!r} data set has no samples", check.member("build_datasets"))
    return datasets["train"], datasets["valid"]


def _sample_batch(check: _Checker, dataset: Dataset, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The first samples of ``dataset`` stacked into a batch, after checking that they are pairs of tensors."""
    where = check.defined(
        f"{type(dataset).__qualname__}.__getitem__", type(dataset).__getitem__, "build_datasets"
    )
    samples = []
    for index in range(min(SAMPLES_PER_BATCH, len(dataset))):
        with raised_by_workload(check.workload, f"the {split!r} data set's __getitem__"):
            sample = dataset[index]
        if not isinstance(sample, (tuple, list)) or len(sample) != 2:
            raise check.fail(
                f"a {split!r} sample is a {type_text(sample)}"
                + (f" of {len(sample)} items" if isinstance(sample, (tuple, list)) else "")
                + "; it must be an (input, target) pair of torch tensors",
                where,
            )
        if not all(isinstance(part, torch.Tensor) for part in sample):
            kinds = ", ".join(type_text(part) for part in sample)
            raise check.fail(
                f"a {split!r} sample is ({kinds}); it must be an (input, target) pair of torch tensors "
                "(e.g. torch.from_numpy(array).float())",
                where,
            )
        samples.append(sample)
    for part, name in ((0, "input"), (1, "target")):
        shapes = {tuple(sample[part].shape) for sample in samples}
        if len(shapes) > 1:
            raise check.fail(
                f"the {split!r} samples' {name}s differ in shape ({', '.join(map(str, sorted(shapes)))}); "
                "every sample must have the same shapes, so that they stack into a batch",
                where,
            )
    return torch.stack([s[0] for s in samples]), torch.stack([s[1] for s in samples])


def _check_dtypes(
    check: _Checker,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    parameter_dtype: torch.dtype | None,
    where: str,
) -> None:
    if parameter_dtype is None:
        return
    for tensor, name in ((inputs, "inputs"), (targets, "targets")):
        if tensor.is_floating_point() and tensor.dtype != parameter_dtype:
            raise check.fail(
                f"the samples' {name} are {dtype_text(tensor.dtype)} and the model's parameters "
                f"{dtype_text(parameter_dtype)}; make the samples {dtype_text(parameter_dtype)} where they are "
                f"made (e.g. tensor.to(torch.{dtype_text(parameter_dtype)}) in __getitem__; dlscale does not "
                "cast them, which would hide reading and copying twice the bytes every batch)",
                where,
            )


def _check_shapes(
    check: _Checker, prediction: Any, targets: torch.Tensor, model: torch.nn.Module, where_data: str
) -> None:
    where_model = check.defined(f"{type(model).__qualname__}.forward", type(model).forward, "build_model")
    if not isinstance(prediction, torch.Tensor):
        raise check.fail(
            f"the model returned a {type_text(prediction)}; it must return one prediction tensor", where_model
        )
    got, want = tuple(prediction.shape), tuple(targets.shape)
    if targets.is_floating_point():
        if got != want:
            raise check.fail(
                f"the model's prediction has shape {shape_text(got)} and the target {shape_text(want)}; they must "
                "be equal (a loss such as mse_loss would broadcast them and train on the wrong thing)",
                where_model,
                where_data,
            )
        return
    # Class labels (an integer target): the prediction has one more dimension, the classes, at 1.
    if len(got) != len(want) + 1 or got[:1] + got[2:] != want:
        labels = shape_text(got[:1] + got[2:]) if len(got) >= 2 else "(B, ...)"
        raise check.fail(
            f"the model's prediction has shape {shape_text(got)} and the target, integer class labels, "
            f"{shape_text(want)}; labels must have the prediction's shape without its class dimension 1, "
            f"{labels}",
            where_model,
            where_data,
        )


def _check_loss(check: _Checker, loss: Any, member: str = "loss") -> float:
    where = check.member(member)
    if not isinstance(loss, torch.Tensor):
        raise check.fail(
            f"{member} returned a {type_text(loss)}; it must return a scalar torch tensor", where
        )
    if loss.numel() != 1:
        raise check.fail(
            f"{member} returned a tensor of shape {tuple(loss.shape)}; it must return a scalar, the batch's mean "
            "(e.g. reduction='mean')",
            where,
        )
    value = float(loss.detach())
    if not torch.isfinite(loss.detach()).all():
        raise check.fail(
            f"{member} returned {value} for the first training samples; it must be finite", where
        )
    if not loss.requires_grad:
        raise check.fail(
            "the loss has no gradient: it is detached from the prediction (.item(), .detach(), numpy or "
            f"torch.no_grad() inside {member})",
            where,
        )
    return value


def _check_summary(check: _Checker, summary: Any, evaluator: Evaluator) -> str:
    where = check.defined(f"{type(evaluator).__qualname__}.summary", type(evaluator).summary, "evaluator")
    scalars = getattr(summary, "scalars", None)
    headline = getattr(summary, "headline", None)
    if not isinstance(scalars, Mapping) or not isinstance(headline, str):
        raise check.fail(
            f"the evaluator's summary() returned a {type_text(summary)}; it must return an EvalSummary "
            "(dlscale.scoring.evaluator) with scalars (a dict of numbers) and a headline (one of its keys)",
            where,
        )
    if headline not in scalars:
        names = ", ".join(repr(name) for name in scalars) or "none"
        raise check.fail(
            f"the evaluator's headline {headline!r} is not one of its scalars ({names})"
            f"{did_you_mean(headline, list(scalars))}; the headline names the scalar that says how good the "
            "model is",
            where,
        )
    for name, value in scalars.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise check.fail(
                f"the evaluator's scalars[{name!r}] is a {type_text(value)}; every scalar must be a number "
                "(float(...) of a tensor)",
                where,
            )
    return headline


def _check_training_loss(
    check: _Checker,
    model: torch.nn.Module,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    precision: Precision,
) -> tuple[float, tuple[int, ...]]:
    """The workload's ``training_loss`` on a training batch at step 0, as the step calls it: a finite scalar
    with a gradient. Its targets need not have the prediction's shape (a rollout's hold several steps); the
    validation batch's shapes are still checked. Returns the loss and the shape of ``model(inputs)``."""
    with raised_by_workload(check.workload, "training_loss"):
        loss = check.workload.training_loss(ModelForLoss(model, precision), (inputs, targets), 0)
    loss_value = _check_loss(check, loss, "training_loss")
    with raised_by_workload(check.workload, "training_loss (its backward)"):
        loss.backward()
    del loss
    with torch.no_grad(), raised_by_workload(check.workload, "the model's forward"), precision.autocast():
        prediction_shape = tuple(model(inputs).shape)
    return loss_value, prediction_shape


@contextlib.contextmanager
def _leaves_no_trace(model: torch.nn.Module, device: Device) -> Iterator[None]:
    """Restore the random generators (Python's, numpy's, torch's on the CPU and this run's GPU: not every
    GPU's, which would open a context on each), the model's buffers and training mode; drop the gradients."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    buffers = {name: buffer.detach().clone() for name, buffer in model.named_buffers()}
    was_training = model.training
    gpus = [device.torch] if device.is_gpu else []
    try:
        with torch.random.fork_rng(devices=gpus):
            yield
    finally:
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                if name in buffers:
                    buffer.copy_(buffers[name])
        for parameter in model.parameters():
            parameter.grad = None
        model.train(was_training)
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def preflight_check(
    workload: Workload,
    model: torch.nn.Module,
    datasets: Mapping[str, Dataset],
    evaluator: Evaluator,
    precision: Precision,
    device: Device,
    batch_size: int = SAMPLES_PER_BATCH,
) -> PreflightReport:
    """Check the workload on the first samples of each split (see the module docstring); WorkloadError for
    the first problem. ``model`` is the plain model on the run's device, before any parallel wrapper;
    ``batch_size`` (at most two) samples go through it, the run's local batch when that is smaller."""
    started = time.perf_counter()
    check = _Checker(workload)
    parameter_dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    batches = {}
    for split in SPLITS:
        dataset = datasets[split]
        where_data = check.defined(
            f"{type(dataset).__qualname__}.__getitem__", type(dataset).__getitem__, "build_datasets"
        )
        inputs, targets = _sample_batch(check, dataset, split)
        _check_dtypes(check, inputs, targets, parameter_dtype, where_data)
        inputs, targets = inputs[:batch_size], targets[:batch_size]
        batches[split] = (device.move(inputs), device.move(targets), where_data)

    with _leaves_no_trace(model, device):
        inputs, targets, where_data = batches["train"]
        model.train()
        if workload.training_loss is not None:
            loss_value, prediction_shape = _check_training_loss(check, model, inputs, targets, precision)
        else:
            with raised_by_workload(workload, "the model's forward"), precision.autocast():
                prediction = model(inputs)
            _check_shapes(check, prediction, targets, model, where_data)
            with raised_by_workload(workload, "loss"):
                loss = workload.loss(prediction.float(), targets)
            loss_value = _check_loss(check, loss)
            with raised_by_workload(workload, "loss (its backward)"):
                loss.backward()
            prediction_shape = tuple(prediction.shape)
            del prediction, loss

        valid_inputs, valid_targets, where_valid = batches["valid"]
        model.eval()
        with torch.inference_mode():
            with raised_by_workload(workload, "the model's forward"), precision.autocast():
                valid_prediction = model(valid_inputs)
            _check_shapes(check, valid_prediction, valid_targets, model, where_valid)
            with raised_by_workload(workload, "evaluator"):
                evaluator.reset()
                evaluator.update(valid_inputs, valid_targets, valid_prediction)
                summary = evaluator.summary()
                evaluator.reset()
        headline = _check_summary(check, summary, evaluator)
    device.synchronize()
    return PreflightReport(
        input_shape=tuple(inputs.shape),
        input_dtype=inputs.dtype,
        prediction_shape=prediction_shape,
        target_shape=tuple(targets.shape),
        loss=loss_value,
        headline=headline,
        seconds=time.perf_counter() - started,
        loss_member="loss" if workload.training_loss is None else "training_loss",
    )
