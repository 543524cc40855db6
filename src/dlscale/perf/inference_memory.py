"""What a model's inference step holds at its peak per sample of its batch, measured on the model itself.

``dlscale forecast`` sends an ensemble's members through the model together, so the memory a forecast needs
grows with the number of members by this much per member: a ViT's attention and MLP activations, a
convolution's feature maps, whatever the workload's model computes. No formula covers every model, so this
runs the step (``predict``: the model with its precision's autocast) on zeros of one sample's shape, for batches
of one and of two samples, and counts the bytes of the tensors alive at each moment: a dispatch mode sees every
tensor an operator makes and when the last reference to its storage goes. The difference between the two peaks
is what one more sample costs (what does not grow with the batch, an autocast copy of the weights, cancels);
activations grow in proportion to the batch, so a batch of B samples needs about B times that.

Only the tensors the operators make count: the model's weights and the input are already there. The step runs
in inference mode, as a forecast does, and leaves the random generators as it found them (a model with dropout
on draws masks). It costs three forward passes of one or two samples.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode


class LiveTensorBytes(TorchDispatchMode):
    """Counts the bytes of the storages the operators inside it make while any tensor still refers to them, and
    the peak of that count (``peak``); each storage counts once, whatever its views."""

    def __init__(self) -> None:
        super().__init__()
        self.references: dict[int, int] = {}  # storage -> tensors alive that the operators returned on it
        self.live = 0
        self.peak = 0

    def _released(self, storage: int, nbytes: int) -> None:
        self.references[storage] -= 1
        if self.references[storage] == 0:
            del self.references[storage]
            self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        outputs = func(*args, **(kwargs or {}))
        for tensor in pytree.tree_leaves(outputs):
            if not isinstance(tensor, torch.Tensor):
                continue
            untyped = tensor.untyped_storage()
            storage, nbytes = StorageWeakRef(untyped).cdata, untyped.nbytes()
            if storage not in self.references:
                self.references[storage] = 0
                self.live += nbytes
                self.peak = max(self.peak, self.live)
            self.references[storage] += 1
            weakref.finalize(tensor, self._released, storage, nbytes)
        return outputs


def peak_step_bytes(
    predict: Callable[[torch.Tensor], torch.Tensor], shape: Sequence[int], device: torch.device
) -> int:
    """The peak bytes of tensors made by one inference step of ``predict`` on zeros of ``shape`` (batch first)."""
    inputs = torch.zeros(tuple(shape), device=device)
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.inference_mode(), LiveTensorBytes() as counted:
        prediction = predict(inputs)
        del prediction
    return counted.peak


def step_bytes_per_sample(
    predict: Callable[[torch.Tensor], torch.Tensor], sample_shape: Sequence[int], device: torch.device
) -> int:
    """The bytes one more sample adds to the peak of an inference step of ``predict`` on (B, *sample_shape)
    inputs: the peak for two samples less the peak for one (the first call warms the step up, so lazily made
    buffers do not count), at least the sample's prediction in float32."""
    peak_step_bytes(predict, (1, *sample_shape), device)
    one = peak_step_bytes(predict, (1, *sample_shape), device)
    two = peak_step_bytes(predict, (2, *sample_shape), device)
    prediction = 4 * int(torch.Size(sample_shape).numel())
    return max(two - one, prediction)
