"""Check a workload's tensor/context-parallel form against its serial model, on forked CPU ranks.

**What a workload adds for tp/cp**: the hook ``parallelize(model, mesh)`` (``Workload``'s default refuses tp or
cp > 1). It gets the serial model, built identically on every rank, and returns this rank's part of it, changed
from outside with the layers of ``dlscale.parallel`` (``vit_parallel.parallelize_vit`` is the worked example):

* tp: a pair of linears becomes ``tensor_parallel.ColumnParallelLinear`` (a block of output features) then
  ``RowParallelLinear`` (the matching input features; sums the partial outputs over tp), both cut from the serial
  layers; ``enter_tensor_parallel_region(module, tp_group)`` makes the module holding them sum its input's
  gradient over tp;
* cp: ``context_parallel.SplitSequence`` splits the tokens, the column layers' ``sequence_group`` and
  ``sequence_sizes`` gather keys and values, ``SequenceGatheredLinear`` gathers the output. The cp ranks' partial
  gradients are summed by the data-parallel wrapper (DDP over dp x cp), as in training and in this check;
* ``mesh.size("tp")``, ``mesh.group("tp")``, ``mesh.index("tp")`` (and ``"cp"``) give sizes, groups, positions;
* parameter names stay the serial ones; a shard says so in its module's ``shard_specs`` (the layers above do) or
  is a DTensor; every rank returns the full output, on which ``workload.loss`` runs as in training.

**Checking it from a test** (tp x cp forked gloo ranks; a tiny model takes a few seconds)::

    from dlscale.parallel import assert_matches_serial

    def test_my_model_parallelizes():
        inputs, targets = torch.randn(2, 3, 16, 32), torch.randn(2, 3, 16, 32)
        assert_matches_serial(MY_WORKLOAD, model_cfg, data_cfg, inputs, targets, tensor_parallel=2)

Every rank trains the serial model and its parallel copy side by side on that batch for ``steps`` SGD steps and
compares each step's output, loss and full (unsharded) gradients, and the weights after the last step, with the
serial model's. Data parallelism over several replicas (dp > 1) is not part of the check.
"""

from __future__ import annotations

import copy
import math
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from dlscale.parallel.data_parallel import wrap_data_parallel
from dlscale.parallel.model_parallel import create_mesh
from dlscale.parallel.parallel_config import ParallelConfig
from dlscale.parallel.shard_specs import is_dtensor, shard_specs, unshard
from dlscale.runtime.device import Device
from dlscale.runtime.distributed import is_distributed, start_process_group, stop_process_group
from dlscale.runtime.launch import detect_process
from dlscale.runtime.local_ranks import run_ranks
from dlscale.runtime.rng import seed_everything

# A gradient (or weight) is measured against its own largest entry, but never against less than this share of the
# model's largest gradient (weight) entry: one that is zero in exact arithmetic (a key bias's gradient under
# softmax) is rounding noise in both models, and is checked to be negligible rather than compared digit by digit.
NEGLIGIBLE = 1e-3


@dataclass(frozen=True)
class Difference:
    """The largest entry-wise |parallel - serial| of one quantity, and the largest |serial| entry it is against."""

    max_abs: float
    scale: float
    step: int  # the step (0-based) where it was largest; weights are compared after the last step
    rank: int

    @property
    def rel(self) -> float:
        """``max_abs / scale``; inf for NaN, or for any difference from an all-zero serial tensor."""
        if math.isnan(self.max_abs) or (self.scale == 0 and self.max_abs > 0):
            return math.inf
        return self.max_abs / self.scale if self.scale > 0 else 0.0

    def within(self, rtol: float, atol: float) -> bool:
        return self.max_abs <= atol + rtol * self.scale  # NaN is never within

    def describe(self) -> str:
        return f"max abs diff {self.max_abs:.3g} (rel {self.rel:.3g}) at step {self.step} on rank {self.rank}"


@dataclass
class EquivalenceReport:
    """How the parallel model compares with serial; ``ok`` when everything is within ``rtol`` and ``atol``."""

    layout: str
    rtol: float
    atol: float
    output: Difference | None = None
    loss: Difference | None = None
    gradients: dict[str, Difference] = field(default_factory=dict)  # by parameter name
    weights: dict[str, Difference] = field(default_factory=dict)  # after the last step, by parameter name
    problems: list[str] = field(default_factory=list)  # missing or extra parameters, wrong shapes

    def failures(self) -> list[tuple[str, Difference]]:
        """(what, difference) of each quantity outside the tolerance, the largest relative difference first."""
        found = [("output", self.output), ("loss", self.loss)]
        found += [(f"gradient of {name}", d) for name, d in self.gradients.items()]
        found += [(f"weight {name} after the last step", d) for name, d in self.weights.items()]
        bad = [(n, d) for n, d in found if d is not None and not d.within(self.rtol, self.atol)]
        return sorted(bad, key=lambda item: item[1].rel, reverse=True)

    def worst_parameter(self) -> tuple[str, str, Difference] | None:
        """(name, "gradient" or "weight", difference) of the parameter that differs most relative to its scale."""
        candidates = [(n, "gradient", d) for n, d in self.gradients.items()]
        candidates += [(n, "weight", d) for n, d in self.weights.items()]
        return max(candidates, key=lambda item: item[2].rel, default=None)

    @property
    def ok(self) -> bool:
        return not self.problems and self.output is not None and not self.failures()

    def describe(self) -> str:
        verdict = "matches serial" if self.ok else "differs from serial"
        lines = [f"the parallel model ({self.layout}) {verdict} (rtol={self.rtol:g}, atol={self.atol:g})"]
        lines += [f"  problem: {problem}" for problem in self.problems]
        for what, difference in (("output", self.output), ("loss", self.loss)):
            if difference is not None:
                outside = "" if difference.within(self.rtol, self.atol) else ", outside the tolerance"
                lines.append(f"  {what}: {difference.describe()}{outside}")
        worst = self.worst_parameter()
        if worst is not None:
            lines.append(f"  worst parameter: {worst[0]} ({worst[1]}: {worst[2].describe()})")
        shown = [self.output, self.loss, worst[2] if worst else None]
        failures = [(what, d) for what, d in self.failures() if not any(d is s for s in shown)]
        lines += [f"  {what}: {difference.describe()}" for what, difference in failures[:6]]
        if len(failures) > 6:
            lines.append(
                f"  ... and {len(failures) - 6} more parameters' gradients or weights outside the tolerance"
            )
        return "\n".join(lines)

    __str__ = describe


class _Options(NamedTuple):
    parallel: ParallelConfig
    steps: int
    lr: float
    seed: int
    timeout_s: float


class RankFailed(RuntimeError):
    """A rank raised (in ``parallelize``, or running the models); the earliest failure is the cause."""


def compare_with_serial(
    workload: Any,
    model_cfg: Any,
    data_cfg: Any,
    inputs: torch.Tensor,
    targets: torch.Tensor,
    *,
    tensor_parallel: int = 2,
    context_parallel: int = 1,
    parallel_order: str = "tp-cp-dp",
    steps: int = 2,
    lr: float = 0.1,
    rtol: float = 1e-5,
    atol: float = 0.0,
    seed: int = 0,
    timeout_s: float = 120.0,
) -> EquivalenceReport:
    """Run ``workload``'s serial model and its ``parallelize`` form on tensor_parallel x context_parallel forked
    gloo ranks on the same batch; return how far the output, loss, gradients and weights are from serial.

    ``workload`` is anything with ``build_model(model_cfg, data_cfg)``, ``parallelize(model, mesh)`` and
    ``loss(prediction, target)``; the models stay in train mode and every forward starts from the same seed.
    Raises :class:`RankFailed` naming the rank, the phase and the exception when a rank raises, with no hang
    (the failing rank leaves, which ends the others' collectives; ``timeout_s`` bounds the rest).
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    parallel = ParallelConfig(tensor_parallel, context_parallel, parallel_order)  # errors name the bad size
    world = tensor_parallel * context_parallel
    layout = f"tp={tensor_parallel} x cp={context_parallel} on {world} rank(s)"
    options = _Options(parallel, steps, lr, seed, timeout_s)
    outcomes = run_ranks(
        world, _rank_main, workload, model_cfg, data_cfg, inputs, targets, options, timeout_s=timeout_s + 30
    )
    failures = sorted((o["failure"], rank) for rank, o in enumerate(outcomes) if "failure" in o)
    if failures:
        (_, phase, kind, message, trace), rank = failures[0]
        others = "".join(f"\n(rank {r} then failed in {f[1]}: {f[2]})" for f, r in failures[1:])
        raise RankFailed(
            f"{phase} raised on rank {rank} of {world} ({layout}): {kind}: {message}{others}\n{trace}"
        )
    report = EquivalenceReport(layout, rtol, atol)
    for outcome in outcomes:
        report.output = _worse(report.output, outcome["output"])
        report.loss = _worse(report.loss, outcome["loss"])
        for kind in ("gradients", "weights"):
            for name, difference in outcome[kind].items():
                getattr(report, kind)[name] = _worse(getattr(report, kind).get(name), difference)
        report.problems = list(dict.fromkeys(report.problems + outcome["problems"]))
    return report


def assert_matches_serial(*args: Any, **kwargs: Any) -> EquivalenceReport:
    """:func:`compare_with_serial`, raising AssertionError (naming the worst parameter) unless it matches."""
    report = compare_with_serial(*args, **kwargs)
    if not report.ok:
        raise AssertionError(report.describe())
    return report


# ------------------------------------------------------------------------------------------ on each rank


def _rank_main(rank: int, workload, model_cfg, data_cfg, inputs, targets, options: _Options) -> dict:
    phase = ["starting the process group"]
    start_process_group(detect_process(), Device("cpu"), timeout_s=options.timeout_s)
    try:
        result = _compare_on_rank(rank, workload, model_cfg, data_cfg, inputs, targets, options, phase)
    except BaseException as error:  # the parent names the earliest failure; leaving ends the others' waits
        failure = (time.monotonic(), phase[0], type(error).__name__, str(error), traceback.format_exc())
        stop_process_group(wait_for_others=False)
        return {"failure": failure}
    stop_process_group()
    return result


def _compare_on_rank(rank, workload, model_cfg, data_cfg, inputs, targets, options: _Options, phase) -> dict:
    phase[0] = "creating the mesh"
    mesh = create_mesh(options.parallel, detect_process())
    phase[0] = "workload.build_model"
    seed_everything(options.seed)
    serial = workload.build_model(model_cfg, data_cfg)
    phase[0] = "workload.parallelize"
    parallel = workload.parallelize(copy.deepcopy(serial), mesh)
    phase[0] = "comparing the parameters' names and shapes"
    specs = shard_specs(parallel)
    problems, names = _match_parameters(serial, parallel, specs)
    # As in training, DDP averages the gradients over the ranks holding the same parameters (dp x cp), which also
    # sums the cp ranks' partial gradients (see dlscale.parallel.context_parallel).
    phase[0] = "wrapping the parallel model for data parallelism (DDP over the cp ranks)"
    replica = wrap_data_parallel(parallel, options.parallel, detect_process(), Device("cpu"), mesh)
    result: dict = {"output": None, "loss": None, "gradients": {}, "weights": {}, "problems": problems}
    optimizers = [torch.optim.SGD(model.parameters(), lr=options.lr) for model in (serial, parallel)]
    for step in range(options.steps):
        phase[0] = f"step {step}: the serial model's forward and backward"
        expected, expected_loss = _forward_backward(workload, serial, inputs, targets, options.seed + step)
        phase[0] = f"step {step}: the parallel model's forward and backward"
        output, loss = _forward_backward(workload, replica, inputs, targets, options.seed + step)
        if output.shape != expected.shape:
            problems.append(
                f"the parallel output has shape {tuple(output.shape)} on rank {rank}, the serial one "
                f"{tuple(expected.shape)}: every rank must return the full output (gather it over tp/cp)"
            )
        else:
            result["output"] = _worse(result["output"], _difference(output, expected, step, rank))
        result["loss"] = _worse(result["loss"], _difference(loss, expected_loss, step, rank))
        phase[0] = f"step {step}: gathering the parallel model's gradients"
        for name, param in parallel.named_parameters():
            if name in names and param.grad is None and serial.get_parameter(name).grad is not None:
                problems.append(f"parameter {name} gets no gradient in the parallel model")
        _compare_parameters(result["gradients"], serial, parallel, names, specs, lambda p: p.grad, step, rank)
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    phase[0] = "gathering the parallel model's weights"
    last = options.steps - 1
    _compare_parameters(result["weights"], serial, parallel, names, specs, lambda p: p.detach(), last, rank)
    return result


def _compare_parameters(into: dict, serial, parallel, names: list[str], specs, read, step: int, rank: int):
    """Each parameter's full ``read(parameter)`` (gradient or weight) against the serial model's, into ``into``."""
    serial_params, parallel_params = dict(serial.named_parameters()), dict(parallel.named_parameters())
    largest = max((_largest(read(p)) for p in serial_params.values() if read(p) is not None), default=0.0)
    for name in names:
        local = read(parallel_params[name])
        full = _full(name, torch.zeros_like(parallel_params[name]) if local is None else local, specs)
        want = read(serial_params[name])
        want = torch.zeros_like(full) if want is None else want
        into[name] = _worse(into.get(name), _difference(full, want, step, rank, NEGLIGIBLE * largest))


def _match_parameters(serial: nn.Module, parallel: nn.Module, specs: dict) -> tuple[list[str], list[str]]:
    """Problems with the parallel parameters (names, full shapes), and the names that can be compared."""
    signature = [(name, *_layout(name, p, specs)) for name, p in parallel.named_parameters()]
    if is_distributed():
        every: list = [None] * dist.get_world_size()
        dist.all_gather_object(every, signature)
        differing = [r for r, other in enumerate(every) if other != every[0]]
        if differing:  # gathering shards would then mismatch the collectives, so nothing is compared
            return [f"ranks {differing} hold other parameters (names, layout, shapes) than rank 0"], []
    expected = {name: tuple(p.shape) for name, p in serial.named_parameters()}
    found = {name: shape for name, _, shape in signature}
    problems = [f"the parallel model lacks the serial parameter {n}" for n in expected if n not in found]
    problems += [
        f"the parallel model has a parameter {n} the serial lacks" for n in found if n not in expected
    ]
    comparable = []
    for name, shape in found.items():
        if name in expected and shape != expected[name]:
            problems.append(f"parameter {name} has shape {shape} after unsharding, serial {expected[name]}")
        elif name in expected:
            comparable.append(name)
    return problems, comparable


def _layout(name: str, param: torch.Tensor, specs: dict) -> tuple[str, tuple[int, ...]]:
    """How ``param`` is held (a DTensor, a shard along a dimension, whole) and its full (serial) shape."""
    if is_dtensor(param):  # its shape is already the full one
        return "dtensor", tuple(param.shape)
    spec = specs.get(name)
    return ("whole", tuple(param.shape)) if spec is None else (f"shard{spec.dim}", spec.full_shape(param))


def _full(name: str, local: torch.Tensor, specs: dict) -> torch.Tensor:
    """The serial tensor from this rank's part (a collective over the shard's group)."""
    if is_dtensor(local):
        return unshard(local).detach()
    return specs[name].gather(local) if name in specs else local.detach()


def _forward_backward(workload, model: nn.Module, inputs, targets, seed: int):
    seed_everything(seed)  # the same dropout draws for both models
    output = model(inputs)
    loss = workload.loss(output, targets)
    loss.backward()
    return output.detach(), loss.detach()


def _largest(tensor: torch.Tensor) -> float:
    return float(tensor.detach().double().abs().max()) if tensor.numel() else 0.0


def _difference(actual, expected, step: int, rank: int, floor: float = 0.0) -> Difference:
    gap = (actual.detach().double() - expected.detach().double()).abs()
    return Difference(float(gap.max()) if gap.numel() else 0.0, max(_largest(expected), floor), step, rank)


def _worse(old: Difference | None, new: Difference | None) -> Difference | None:
    return new if old is None or (new is not None and new.rel > old.rel) else old
