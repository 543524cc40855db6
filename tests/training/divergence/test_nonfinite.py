"""Noticing NaN and inf: the device-side record, the state scan, the skipping step and the batch check."""

from __future__ import annotations

import math

import pytest
import torch

from dlscale.data.values.finite_check import FiniteCheckedBatches, check_batch
from dlscale.errors import DataError
from dlscale.runtime.device import Device
from dlscale.training.divergence.nonfinite import NonFiniteWatch, first_nonfinite
from dlscale.training.precision import Precision
from dlscale.training.schedule import LRSchedule
from dlscale.training.step import TrainStep

NAN, INF = float("nan"), float("inf")


def test_the_watch_keeps_the_first_bad_step_with_its_values_until_reset():
    watch = NonFiniteWatch(torch.device("cpu"), check_every=5)
    for step, (loss, norm) in enumerate([(1.0, 2.0), (0.5, INF), (NAN, NAN), (0.1, 1.0)]):
        watch.record(torch.tensor(loss), torch.tensor(norm), step)
    assert watch.poll() == (1, 0.5, INF)
    assert watch.poll() == (1, 0.5, INF)  # still there: a check does not forget
    watch.reset()
    assert watch.poll() is None
    watch.record(torch.tensor(NAN), None, 7)
    step, loss, norm = watch.poll()
    assert step == 7 and math.isnan(loss) and norm is None
    assert [watch.due(s) for s in (4, 5, 10, 11)] == [False, True, True, False]


def test_the_state_scan_names_the_first_bad_tensor_and_ignores_integers():
    state = {
        "model": {"a": torch.ones(3), "b": torch.tensor([1.0, INF])},
        "optimizer": {"state": {0: {"step": torch.tensor(3), "exp_avg": torch.tensor([NAN])}}},
    }
    assert first_nonfinite(state) == "model['b']"
    state["model"]["b"] = torch.zeros(2)
    assert first_nonfinite(state) == "optimizer['state'][0]['exp_avg']"
    state["optimizer"]["state"][0]["exp_avg"] = torch.zeros(1)
    assert first_nonfinite(state) is None
    assert first_nonfinite({"n": torch.arange(3)}) is None


def make_step(skip: bool, amp: str = "none"):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    precision = Precision(amp, Device("cpu"))
    step = TrainStep(
        model,
        torch.nn.functional.mse_loss,
        optimizer,
        LRSchedule(0.1, 10),
        precision=precision,
        skip_nonfinite=skip,
    )
    return model, optimizer, step


def snapshot(model, optimizer):
    weights = [p.detach().clone() for p in model.parameters()]
    moments = [{k: v.clone() for k, v in s.items()} for s in optimizer.state.values()]
    return weights, moments


@pytest.mark.parametrize("bad", ["inputs", "targets"])
def test_a_skipping_step_leaves_weights_and_optimizer_state_as_they_were(bad):
    model, optimizer, step = make_step(skip=True)
    good = torch.ones(2, 3), torch.ones(2, 1)
    step(*good, 0)
    before = snapshot(model, optimizer)
    inputs, targets = torch.ones(2, 3), torch.ones(2, 1)
    (inputs if bad == "inputs" else targets)[0, 0] = NAN
    loss = step(inputs, targets, 1)
    assert step.skipped and math.isnan(float(loss))
    after = snapshot(model, optimizer)
    for a, b in zip(before[0], after[0], strict=True):
        assert torch.equal(a, b)
    for a, b in zip(before[1], after[1], strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)
    step(*good, 2)
    assert not step.skipped and not torch.equal(before[0][0], model.weight)


def test_an_infinite_gradient_with_a_finite_loss_is_skipped_too():
    model, optimizer, step = make_step(skip=True)
    step(torch.ones(2, 3), torch.ones(2, 1), 0)
    hook = model.weight.register_hook(lambda grad: grad * INF)
    weight = model.weight.detach().clone()
    loss = step(torch.ones(2, 3), torch.zeros(2, 1), 1)
    hook.remove()
    assert math.isfinite(float(loss)) and step.skipped and torch.equal(weight, model.weight)


def test_without_skipping_a_nan_step_is_applied_and_the_step_computes_no_norm():
    model, optimizer, step = make_step(skip=False)
    inputs = torch.ones(2, 3)
    inputs[0, 0] = NAN
    step(inputs, torch.ones(2, 1), 0)
    assert not step.skipped and step.last_grad_norm is None
    assert not torch.isfinite(model.weight).all()


def test_an_fp16_skip_keeps_the_scaler_consistent():
    model, optimizer, step = make_step(skip=True, amp="fp16")
    inputs = torch.ones(2, 3)
    inputs[0, 0] = NAN
    step(inputs, torch.ones(2, 1), 0)
    assert step.skipped
    step(torch.ones(2, 3), torch.ones(2, 1), 1)  # unscale_ again: the scaler's step was closed
    assert not step.skipped and torch.isfinite(model.weight).all()


class Located:
    def __init__(self, samples: list[torch.Tensor]):
        self.samples = samples

    def describe_sample(self, index: int, epoch: int = 0) -> str:
        return f"file f.h5, time {index}, epoch {epoch}"


def test_the_batch_check_names_the_sample_channel_and_kind():
    batch = torch.zeros(3, 2, 4), torch.zeros(3, 2, 4)
    batch[1][2, 1, 0] = -INF
    with pytest.raises(DataError) as raised:
        check_batch(batch, [7, 8, 9], Located([]), "training", epoch=4)
    message = str(raised.value)
    assert (
        "the training targets of sample 9 (file f.h5, time 9, epoch 4) hold -inf values, channel 1" in message
    )
    check_batch(
        (torch.zeros(2, 3), torch.tensor([1, 2])), [0, 1], object(), "validation"
    )  # labels: no floats


def test_checked_batches_follow_the_samplers_pass():
    class Sampler:
        epoch = 2

        def __iter__(self):
            return iter([5, 3, 1, 0])

    batches = [(torch.zeros(2, 1), torch.zeros(2, 1)), (torch.tensor([[0.0], [NAN]]), torch.zeros(2, 1))]
    checked = FiniteCheckedBatches(batches, Sampler(), object(), "training", batch_size=2)
    assert len(checked) == 2
    iterator = iter(checked)
    assert next(iterator) is batches[0]
    with pytest.raises(DataError, match=r"inputs of sample 0 hold NaN"):
        next(iterator)


def test_the_lr_scale_multiplies_the_schedule_and_is_saved_only_when_set():
    schedule = LRSchedule(1.0, 100, warmup=10)
    halved = LRSchedule(1.0, 100, warmup=10, scale=0.5)
    assert [halved.lr_at(s) for s in (0, 50, 99)] == [0.5 * schedule.lr_at(s) for s in (0, 50, 99)]
    assert "scale" not in schedule.state_dict() and halved.state_dict()["scale"] == 0.5


# ------------------------------------------------------------------------------------------- GPU only

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_gpu
@pytest.mark.gpu
def test_recording_a_step_never_waits_for_the_gpu():
    device = torch.device("cuda")
    watch = NonFiniteWatch(device, check_every=10)
    losses = [torch.tensor(v, device=device) for v in (1.0, 2.0, NAN, 3.0)]
    norm = torch.tensor(1.0, device=device)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host sync in what follows raises
    try:
        for step, loss in enumerate(losses):
            watch.record(loss, norm, step)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    step, loss, grad_norm = watch.poll()
    assert step == 2 and math.isnan(loss) and grad_norm == 1.0


@needs_gpu
@pytest.mark.gpu
def test_the_state_scan_works_on_gpu_tensors_next_to_cpu_step_counts():
    state = {"model": {"w": torch.ones(3, device="cuda")}, "optimizer": {"step": torch.tensor(3.0)}}
    assert first_nonfinite(state) is None
    state["model"]["w"][1] = INF
    assert first_nonfinite(state) == "model['w']"
