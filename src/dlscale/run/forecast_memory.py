"""Whether an ensemble forecast fits in memory, checked before its first step (``dlscale forecast --members N``).

Everything of a rollout whose size grows with the number of members M (:mod:`dlscale.scoring.rollout`,
:mod:`dlscale.scoring.ensemble_scores`, :mod:`dlscale.scoring.perturbations`), for a batch of N initial times of
F = channels x height x width values each, over L = steps + 1 leads:

* the running sums, kept for the whole rollout: the rank histograms, ``(L, C, M + 1)`` int64, and the members'
  non-finite counts, ``(L, M)`` int64; under several ranks the sums are copied twice more (into one float64
  buffer for the all-reduce);
* ``scores.json``'s rank histograms (at up to three leads, C x (M + 1) counts each) as Python lists and JSON
  text: about ``DOCUMENT_BYTES_PER_COUNT`` bytes a count at the peak of writing them;
* what a batch holds from its first lead to its last, ``HELD_BYTES_PER_VALUE`` bytes a value of the (N, M, F)
  ensemble: the perturbed initial states, the members' latest states, the ensemble's forecast in physical units
  at lead 0 and at the latest lead (float32 each);
* beside them, one of three phases at a time: the members through the model (its own activations, measured per
  sample on the model itself: :mod:`dlscale.perf.inference_memory`), the scoring (the sorted members and their
  int64 sort indices, the centred members and the CRPS's temporaries, ``SCORING_BYTES_PER_VALUE``), or the next
  batch's perturbations (on the host, whatever the device: white noise, its FFT in complex64, the smoothed noise,
  ``NOISE_BYTES_PER_VALUE``; ``WHITE_NOISE_BYTES_PER_VALUE`` for white noise, none for dropout);
* with ``--write``, the forecasts kept until they are written (checked on their own as well).

On a GPU a batch is in the device's memory (its perturbations excepted) and the rest in the host's; on the CPU
all of it in the host's. A forecast is refused, in one line saying what it needs, what is available
and the largest ``--members`` that fits, when it needs more than ``MEMORY_SHARE`` of what is available (the
rest: the data read, the model, Python). The constants were measured on the rollout's own code (the tests check
that the estimate covers what a rollout holds).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dlscale.errors import ConfigError

# Bytes a value of the (N, M, F) ensemble, as measured on the rollout (with a margin of a few bytes).
HELD_BYTES_PER_VALUE = 16  # four float32 copies of the ensemble (see above)
SCORING_BYTES_PER_VALUE = 28  # measured: 24, of which 16.5 in EnsembleScores.add
NOISE_BYTES_PER_VALUE = 28  # measured: 24
WHITE_NOISE_BYTES_PER_VALUE = 16  # measured: 12
DOCUMENT_BYTES_PER_COUNT = 200  # measured: 142 at the peak of to_json, and the ranks receive a copy
MEMORY_SHARE = 0.8
GB = 1e9


@dataclass(frozen=True)
class EnsembleShape:
    """What the memory of an ensemble forecast depends on, but for M: one rank's largest batch of initial times
    (``batch`` is a function of M, as the default batch is the run's batch divided by M), the leads, the grid,
    how many rank histograms ``scores.json`` keeps, the perturbation's kind and the model's bytes per sample."""

    batch: Callable[[int], int]
    leads: int
    channels: int
    height: int
    width: int
    histogram_leads: int
    noise_bytes_per_value: int  # NOISE_BYTES_PER_VALUE, WHITE_NOISE_BYTES_PER_VALUE or 0 (dropout)
    model_bytes_per_sample: int
    ranks: int = 1
    kept_forecast_bytes: Callable[[int], int] = lambda members: 0  # --write's forecasts of M members


@dataclass(frozen=True)
class EnsembleMemory:
    """Bytes of an ensemble of ``members``: the sums, the document's histograms, what a batch holds throughout
    and its three phases (the model's step, the scoring, the perturbations), the forecasts kept for --write."""

    members: int
    batch_size: int
    sums: int
    document: int
    held: int
    model_step: int
    scoring: int
    noise: int
    kept: int

    @property
    def batch(self) -> int:
        """A batch on its device at its peak: what it holds and the larger of the model's step and the scoring."""
        return self.held + max(self.model_step, self.scoring)

    def host(self, on_gpu: bool) -> int:
        """What the host's memory holds (on the CPU: everything)."""
        kept = self.sums + self.document + self.kept
        return kept + (self.noise if on_gpu else max(self.batch, self.held + self.noise))

    def device(self) -> int:
        """What a GPU's memory holds: a batch's members through the model and their scores."""
        return self.batch


def ensemble_memory(shape: EnsembleShape, members: int) -> EnsembleMemory:
    """The bytes an ensemble of ``members`` needs (see the module's docstring for each part)."""
    n = shape.batch(members)
    field = shape.channels * shape.height * shape.width
    counts = shape.leads * shape.channels * (members + 1) + shape.leads * members
    copies = 3 if shape.ranks > 1 else 1  # the all-reduce's float64 copies of every sum
    values = n * members * field
    return EnsembleMemory(
        members=members,
        batch_size=n,
        sums=8 * counts * copies,
        document=DOCUMENT_BYTES_PER_COUNT * shape.histogram_leads * shape.channels * (members + 1),
        held=HELD_BYTES_PER_VALUE * values,
        model_step=n * members * shape.model_bytes_per_sample,  # the members and the control
        scoring=SCORING_BYTES_PER_VALUE * values,
        noise=shape.noise_bytes_per_value * values,
        kept=shape.kept_forecast_bytes(members),
    )


@dataclass(frozen=True)
class AvailableMemory:
    """Bytes a forecast may use: the host's (shared by this node's ranks) and, on a GPU, the device's."""

    host: int
    device: int | None = None  # None: the CPU
    device_name: str = ""


def check_ensemble_memory(shape: EnsembleShape, members: int, available: AvailableMemory) -> EnsembleMemory:
    """The memory of an ensemble of ``members``, or a ConfigError naming what it needs, what is available and the
    largest --members that fits, when it needs more than MEMORY_SHARE of the host's or the device's memory."""
    memory = ensemble_memory(shape, members)
    problem = _shortfall(memory, available)
    if problem is None:
        return memory
    needed, where, budget = problem
    fitting = largest_fitting_members(shape, available, members - 1)
    parts = [
        f"the rank histograms and sums {_size(memory.sums)}",
        f"scores.json's rank histograms {_size(memory.document)}",
        f"a batch of {memory.batch_size} initial time{'s' if memory.batch_size > 1 else ''} x {members} members "
        f"through the model and its scores {_size(max(memory.batch, memory.held + memory.noise))}",
    ]
    if where != "host":
        parts = parts[2:]
    elif memory.kept:
        parts.append(f"the forecasts kept for --write {_size(memory.kept)}")
    if fitting >= 2:
        way_out = f"--members {fitting} fits (or a shorter --lead, or a smaller --batch-size)"
    else:
        way_out = (
            "not even --members 2 fits: try a shorter --lead, a smaller --batch-size or fewer --init-count"
        )
    raise ConfigError(
        f"--members {members}: the ensemble needs {_size(needed)} of {where} memory before its first step "
        f"({', '.join(parts)}), more than {MEMORY_SHARE:.0%} of the {_size(budget)} available; {way_out}"
    )


def _size(nbytes: int) -> str:
    """``3.2 GB``, ``0.41 GB``, ``33.6 TB``: three significant digits, terabytes from a thousand GB."""
    return f"{nbytes / 1e12:.3g} TB" if nbytes >= 1e12 else f"{nbytes / GB:.3g} GB"


def largest_fitting_members(shape: EnsembleShape, available: AvailableMemory, most: int) -> int:
    """The largest M <= ``most`` whose ensemble fits (1 when not even 2 members do)."""
    low, high = 1, most  # low: fits (one member is no ensemble: nothing of this is made)
    while low < high:
        middle = (low + high + 1) // 2
        if _shortfall(ensemble_memory(shape, middle), available) is None:
            low = middle
        else:
            high = middle - 1
    return low


def _shortfall(memory: EnsembleMemory, available: AvailableMemory) -> tuple[int, str, int] | None:
    """(bytes needed, which memory, bytes available) where ``memory`` does not fit; None where it does."""
    on_gpu = available.device is not None
    if on_gpu and memory.device() > MEMORY_SHARE * available.device:
        return memory.device(), f"GPU ({available.device_name})", available.device
    host = memory.host(on_gpu)
    if host > MEMORY_SHARE * available.host:
        return host, "host", available.host
    return None
