"""Seeding and exact capture/restore of every random number generator a training run draws from.

A resumed run must draw the same random numbers as an uninterrupted one (dropout masks, augmentation,
shuffling), so a checkpoint carries the state of Python's `random`, numpy's global generator, torch's CPU
generator and, where CUDA is present, each CUDA device's generator. The captured state is made of tensors and
plain Python scalars/containers only, so it survives `torch.load(..., weights_only=True)`.

This is the one module outside `runtime/device.py` that touches `torch.cuda`, and only for generator state:
the generators are global torch state, and device.py has no business knowing about checkpoints.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from dlscale.errors import CheckpointError, InvalidValue

__all__ = ["capture_rng_state", "restore_rng_state", "seed_everything", "stream_seed"]

log = logging.getLogger(__name__)

# Python's Mersenne Twister state: 624 words plus the position index.
_PY_STATE_LEN = 625
# numpy's legacy global RandomState is always MT19937 with 624 words of key.
_NP_KEY_LEN = 624
_NP_BIT_GENERATOR = "MT19937"
_MAX_SEED = 2**32 - 1

_warned_missing_cuda = False


def seed_everything(seed: int) -> None:
    """Seed Python's `random`, numpy's global generator and torch's generators on every device."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _MAX_SEED:
        # numpy's legacy seeding only takes 32-bit unsigned seeds; refusing here keeps all three generators
        # seeded from the same number instead of letting numpy fail halfway through.
        raise InvalidValue("seed", f"expected an integer in [0, {_MAX_SEED}], got {seed!r}")
    random.seed(seed)
    np.random.seed(seed)
    # torch.manual_seed also seeds every CUDA device (lazily, if CUDA is not initialised yet).
    torch.manual_seed(seed)


def capture_rng_state() -> dict[str, Any]:
    """Return the state of every generator, as tensors and plain Python values (safe for weights_only)."""
    py_version, py_internal, py_gauss_next = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_cached_gaussian = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": {
            "version": int(py_version),
            # Words are < 2**32, so int64 holds them exactly.
            "state": torch.tensor(py_internal, dtype=torch.int64),
            "gauss_next": None if py_gauss_next is None else float(py_gauss_next),
        },
        "numpy": {
            "bit_generator": str(np_name),
            "keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64).copy()),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "cached_gaussian": float(np_cached_gaussian),
        },
        "torch": torch.get_rng_state().clone(),
        "cuda": [],
    }
    if torch.cuda.is_available():
        state["cuda"] = [s.clone() for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Put every generator back into the state returned by `capture_rng_state`.

    The whole state is checked before any generator is touched, so a malformed state raises CheckpointError
    and leaves all generators as they were. A state captured with CUDA restores fine where CUDA is absent
    (the CUDA part is skipped with a one-time warning): resuming a GPU run on CPU is legitimate for debugging.
    """
    if not isinstance(state, Mapping):
        raise CheckpointError(f"rng state: expected a dict, got {type(state).__name__}")
    for key in ("python", "numpy", "torch"):
        if key not in state:
            raise CheckpointError(f"rng state: the '{key}' entry is missing")

    py_state = _python_state(state["python"])
    np_state = _numpy_state(state["numpy"])
    torch_state = _byte_tensor(state["torch"], "rng state: 'torch'")
    cuda_states = _cuda_states(state.get("cuda", []))

    # Validate on throwaway generators so that nothing global changes unless everything fits.
    _try_apply("python", lambda: random.Random().setstate(py_state))
    _try_apply("numpy", lambda: np.random.RandomState().set_state(np_state))
    _try_apply("torch", lambda: torch.Generator().set_state(torch_state))
    cuda_states = _usable_cuda_states(cuda_states)

    random.setstate(py_state)
    np.random.set_state(np_state)
    torch.set_rng_state(torch_state)
    for device_index, cuda_state in enumerate(cuda_states):
        torch.cuda.set_rng_state(cuda_state, device_index)


def _python_state(entry: Any) -> tuple:
    if not isinstance(entry, Mapping):
        raise CheckpointError(f"rng state: 'python' should be a dict, got {type(entry).__name__}")
    words = _int_tensor(entry.get("state"), _PY_STATE_LEN, "rng state: 'python.state'")
    version = entry.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise CheckpointError(f"rng state: 'python.version' should be an int, got {version!r}")
    gauss_next = entry.get("gauss_next")
    if gauss_next is not None and not isinstance(gauss_next, float):
        raise CheckpointError(f"rng state: 'python.gauss_next' should be a float or None, got {gauss_next!r}")
    return (version, tuple(int(w) for w in words.tolist()), gauss_next)


def _numpy_state(entry: Any) -> tuple:
    if not isinstance(entry, Mapping):
        raise CheckpointError(f"rng state: 'numpy' should be a dict, got {type(entry).__name__}")
    name = entry.get("bit_generator")
    if name != _NP_BIT_GENERATOR:
        raise CheckpointError(
            f"rng state: 'numpy.bit_generator' should be '{_NP_BIT_GENERATOR}', got {name!r}"
        )
    keys = _int_tensor(entry.get("keys"), _NP_KEY_LEN, "rng state: 'numpy.keys'")
    if keys.min().item() < 0 or keys.max().item() > 2**32 - 1:
        raise CheckpointError("rng state: 'numpy.keys' holds values outside the 32-bit unsigned range")
    fields = {}
    for field, kind in (("pos", int), ("has_gauss", int), ("cached_gaussian", float)):
        value = entry.get(field)
        if isinstance(value, bool) or not isinstance(value, kind):
            raise CheckpointError(f"rng state: 'numpy.{field}' should be a {kind.__name__}, got {value!r}")
        fields[field] = value
    return (
        name,
        keys.numpy().astype(np.uint32),
        fields["pos"],
        fields["has_gauss"],
        fields["cached_gaussian"],
    )


def _cuda_states(entry: Any) -> list[torch.Tensor]:
    if not isinstance(entry, (list, tuple)):
        raise CheckpointError(f"rng state: 'cuda' should be a list of tensors, got {type(entry).__name__}")
    return [_byte_tensor(s, f"rng state: 'cuda[{i}]'") for i, s in enumerate(entry)]


def _usable_cuda_states(cuda_states: list[torch.Tensor]) -> list[torch.Tensor]:
    """The CUDA states that can be restored here; warns (once) when some have to be dropped."""
    global _warned_missing_cuda
    if not cuda_states:
        return []
    if not torch.cuda.is_available():
        if not _warned_missing_cuda:
            log.warning(
                "the checkpoint holds CUDA generator states for %d device(s) but CUDA is not available "
                "here; restoring the CPU generators only, so GPU-side random draws will differ",
                len(cuda_states),
            )
            _warned_missing_cuda = True
        return []
    device_count = torch.cuda.device_count()
    if len(cuda_states) > device_count:
        log.warning(
            "the checkpoint holds CUDA generator states for %d devices but only %d are visible; "
            "restoring the first %d",
            len(cuda_states),
            device_count,
            device_count,
        )
        cuda_states = cuda_states[:device_count]
    expected_numel = torch.cuda.get_rng_state(0).numel()
    for i, cuda_state in enumerate(cuda_states):
        if cuda_state.numel() != expected_numel:
            raise CheckpointError(
                f"rng state: 'cuda[{i}]' has {cuda_state.numel()} bytes, this torch expects {expected_numel}"
            )
    return cuda_states


def _int_tensor(value: Any, length: int, what: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or value.dtype != torch.int64 or value.shape != (length,):
        raise CheckpointError(
            f"{what} should be an int64 tensor of shape ({length},), got {_describe(value)}"
        )
    return value.cpu()


def _byte_tensor(value: Any, what: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8 or value.dim() != 1:
        raise CheckpointError(f"{what} should be a 1-d uint8 tensor, got {_describe(value)}")
    # set_rng_state wants a contiguous CPU tensor, whatever map_location the checkpoint was loaded with.
    return value.detach().cpu().contiguous()


def _try_apply(name: str, apply: Any) -> None:
    try:
        apply()
    except (TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"rng state: the '{name}' generator state is malformed: {exc}") from exc


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"{type(value).__name__} {value!r}"[:120]


def stream_seed(entropy: Sequence[int]) -> int:
    """A 64-bit seed for a generator of its own, from integers that name what it draws (the run's seed, a stream
    constant, a sample or an initial time, a step): numpy's ``SeedSequence`` mixes them, so lists that differ
    anywhere give independent streams, and the same list the same one on any batch, device or rank layout."""
    state = np.random.SeedSequence(list(entropy)).generate_state(2, dtype=np.uint32)
    return int(state[0]) << 32 | int(state[1])
