"""How the members of an ensemble forecast differ: perturbed initial states, or dropout kept on.

``dlscale forecast --members N --perturb SPEC``: member 0 is the control, the unperturbed forecast (the
deterministic one, scored beside the ensemble as ``model``); members 1 .. N-1 differ by

* ``gaussian:SCALE[:LENGTH_KM]``: each member's initial state plus noise of ``SCALE`` times each channel's standard
  deviation, smoothed in space. The noise is added to the state the model reads, which the workload normalizes
  with the training statistics (per channel: ``(x - mean) / std``), so ``SCALE`` in those units is ``SCALE x std``
  in physical ones. The smoothing is a Gaussian correlation in distance on the sphere,
  ``corr(d) = exp(-d^2 / (2 LENGTH^2))``, the same at every point (each point's standard deviation is exactly
  ``SCALE``, the rows near the poles included), channels and members independent.

  Why smooth, and why 500 km by default: white noise at the grid scale is what a model trained on smooth analyses
  damps at once (it never saw such fields), so much of it is lost in the first step and what is left does not
  project onto the large-scale patterns whose errors grow; the errors of an analysis are spatially correlated
  over a few hundred kilometres (the background-error correlation lengths of 4D-Var systems). A length in
  kilometres, not in grid points, makes one ``--perturb`` the same physical perturbation on any grid: on the
  demo's 5.6-degree grid (about 620 km between points at the equator) 500 km correlates neighbours by about 0.5,
  on a 0.25-degree grid it spans some 18 points. ``LENGTH_KM = 0`` gives white noise. A grid that is not a whole
  circle of longitudes with latitudes in degrees (a solver's grid, a regional grid) gets white noise by default,
  and a length is refused there.
* ``dropout``: the control with dropout off, every other member with the model's dropout on (its dropout and
  stochastic-depth layers sample anew for each member; normalization layers stay in inference mode). Only for a
  model that has dropout (a rate above 0).

* ``noise``: a model with noise inputs (``model.noise_channels``, trained with ``train.loss crps``): members
  1 .. N-1 start from the control's state and read their own noise at every model step (:class:`ModelNoise`,
  seeded like the gaussian noise plus the step), the control reads zero noise.

The noise is drawn on the CPU from a generator seeded by the run's seed and the initial time (its trajectory and
step), so an initial time's members are the same whatever the batch, the device or the number of ranks that share
the initial times. Dropout masks come from the device's generator: reproducible for one layout, not across
batch sizes or rank counts.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
from torch import nn

from dlscale.data.trajectories import ForecastStart
from dlscale.errors import ConfigError
from dlscale.runtime.rng import stream_seed
from dlscale.scoring.perturbation_spec import DROPOUT, NO_NOISE_INPUTS, NOISE, Perturbation
from dlscale.scoring.rollout import EnsembleMembers
from dlscale.scoring.spectra import EARTH_RADIUS_M, whole_circle

DEFAULT_LENGTH_KM = 500.0
# Mixed into the seed, so that the perturbations' stream is not the one that initialized the model's weights.
PERTURBATION_STREAM = 0x9E3779B9
MODEL_NOISE_STREAM = 0x7F4A7C15  # a noise model's members' inputs (--perturb noise)


class SmoothedNoise:
    """Noise of unit standard deviation at every point of a (C, H, W) grid, correlated as
    ``exp(-d^2 / (2 L^2))`` in great-circle distance (separably: along the meridians, then along each circle of
    latitude), drawn per initial time from a seeded CPU generator.

    A kernel of width ``L / sqrt(2)`` gives that correlation (a Gaussian's autocorrelation is a Gaussian of
    sqrt(2) times its width). Along a circle of latitude the filter is applied in Fourier space (periodic; its
    width in columns grows as 1 / cos(latitude), so a pole row gets its zonal mean: one value, as a point should),
    along the meridians as an (H, H) matrix. The variance each point then has is known in closed form (a sum of
    squared kernel weights), and the field is divided by its square root, so every point, the polar rows
    included, has exactly unit variance."""

    def __init__(self, latitudes: np.ndarray, longitudes: np.ndarray, length_km: float, seed: int):
        self.seed = seed
        self.shape = (len(latitudes), len(longitudes))
        self.length_km = length_km
        if length_km == 0:
            self.meridian = None
            return
        width_m = 1000 * length_km / math.sqrt(2)
        phi = np.deg2rad(np.asarray(latitudes, dtype=np.float64))
        distance = EARTH_RADIUS_M * (phi[:, None] - phi[None, :])
        meridian = np.exp(-0.5 * (distance / width_m) ** 2)  # (H, H)
        columns = len(longitudes)
        spacing_m = EARTH_RADIUS_M * 2 * np.pi / columns * np.cos(phi)  # (H,) metres between columns
        width_columns = width_m / np.maximum(spacing_m, 1e-9)
        frequencies = np.fft.fftfreq(columns)  # cycles per column
        zonal = np.exp(-2 * (np.pi * width_columns[:, None] * frequencies[None, :]) ** 2)  # (H, W) transfer
        zonal_variance = (zonal**2).mean(axis=1)  # (H,): a row's variance after the zonal filter
        variance = (meridian**2) @ zonal_variance
        self.meridian = torch.from_numpy(meridian / np.sqrt(variance)[:, None]).float()
        self.zonal = torch.from_numpy(zonal).float()

    def draw(self, starts: Sequence[ForecastStart], members: int, channels: int) -> torch.Tensor:
        """(N, members, C, H, W) float32 on the CPU: the noise of each start's ``members`` members."""
        fields = torch.stack([self._white(start, members, channels) for start in starts])
        if self.meridian is None:
            return fields
        spectrum = torch.fft.fft(fields, dim=-1) * self.zonal
        zonally = torch.fft.ifft(spectrum, dim=-1).real
        return torch.einsum("ij,...jw->...iw", self.meridian, zonally)

    def _white(self, start: ForecastStart, members: int, channels: int) -> torch.Tensor:
        seed = stream_seed([self.seed, PERTURBATION_STREAM, start.trajectory, start.step])
        generator = torch.Generator().manual_seed(seed)
        return torch.randn((members, channels, *self.shape), generator=generator)


class ModelNoise:
    """A noise model's members' noise inputs (``--perturb noise``): unit Gaussian noise of the model's
    ``noise_channels`` on its grid, per initial time and model step from a CPU generator seeded by the run's
    seed, the initial time (trajectory and step) and the model step, so an initial time's members are the same
    whatever the batch, the device or the number of ranks, and each step's noise is new (as in training)."""

    def __init__(self, channels: int, grid: tuple[int, int], members: int, seed: int):
        self.channels, self.grid, self.members, self.seed = channels, grid, members, seed

    def __call__(self, starts: Sequence[ForecastStart], lead: int) -> torch.Tensor:
        """(N * members, channels, H, W): the noise of each start's members at model step ``lead``."""
        fields = []
        for start in starts:
            seed = stream_seed([self.seed, MODEL_NOISE_STREAM, start.trajectory, start.step, lead])
            generator = torch.Generator().manual_seed(seed)
            fields.append(torch.randn((self.members, self.channels, *self.grid), generator=generator))
        return torch.cat(fields)


def noise_input_members(
    count: int, model: nn.Module, predict: Callable[[torch.Tensor], torch.Tensor], seed: int, description: str
) -> EnsembleMembers:
    """The members of ``--perturb noise``: the control's initial state, each member's own noise inputs at every
    step; a ConfigError for a model without noise inputs."""
    channels = int(getattr(model, "noise_channels", 0) or 0)
    image = getattr(model, "img_size", None)
    if channels < 1 or image is None:
        raise ConfigError(f"--perturb noise: {NO_NOISE_INPUTS}; use --perturb gaussian:SCALE or dropout")

    noise = ModelNoise(channels, tuple(image), count - 1, seed)
    return EnsembleMembers(count, control_copies(count), predict, seed, description, noise)


def control_copies(count: int) -> Callable[[Sequence[ForecastStart], torch.Tensor], torch.Tensor]:
    """The ``perturb`` of members that start from the control's state (dropout and noise members differ by the
    model, not the state): (N, C, H, W) -> (N, count - 1, C, H, W), a view."""

    def copies(starts: Sequence[ForecastStart], state: torch.Tensor) -> torch.Tensor:
        return state.unsqueeze(1).expand(state.shape[0], count - 1, *state.shape[1:])

    return copies


def noise_for_grid(
    perturbation: Perturbation, latitudes: np.ndarray, longitudes: np.ndarray, seed: int
) -> SmoothedNoise:
    """The noise of a gaussian ``perturbation`` on this grid: smoothed over its length (the default's on a
    latitude-longitude grid that is a whole circle, white noise elsewhere), or a ConfigError for a length asked
    of a grid it cannot measure."""
    on_the_sphere = _on_the_sphere(latitudes, longitudes)
    length = perturbation.length_km
    if length is None:
        length = DEFAULT_LENGTH_KM if on_the_sphere else 0.0
    elif length > 0 and not on_the_sphere:
        raise ConfigError(
            f"--perturb gaussian:{perturbation.scale:g}:{length:g}: a correlation length in km needs a grid of "
            "distinct latitudes in degrees whose longitudes go once round the circle; this data's grid is not one "
            f"(give gaussian:{perturbation.scale:g}:0 for white noise)"
        )
    return SmoothedNoise(latitudes, longitudes, length, seed)


def _on_the_sphere(latitudes: np.ndarray, longitudes: np.ndarray) -> bool:
    latitudes = np.asarray(latitudes, dtype=np.float64)
    distinct = len(np.unique(latitudes)) == len(latitudes) and bool(np.all(np.abs(latitudes) <= 90))
    return distinct and whole_circle(np.asarray(longitudes, dtype=np.float64))


def noise_in_units(
    scale: float | Sequence[float], to_physical: Callable[[torch.Tensor], torch.Tensor], shape: Sequence[int]
) -> np.ndarray:
    """(C, H, W) float64: the standard deviation of ``gaussian:SCALE``'s noise at each point in the channels'
    physical units. The noise (``scale`` standard deviations of the normalized state at every point) is added
    to what the model reads; ``to_physical`` (the trajectories' de-normalization, affine per channel) maps a
    step of ``scale`` there to its size in physical units: ``scale x std`` of each channel for a workload that
    normalizes as ``(x - mean) / std``."""
    zero = torch.zeros((1, *shape), dtype=torch.float64)
    if isinstance(scale, (int, float)):
        step = torch.full((1, *shape), float(scale), dtype=torch.float64)
    else:  # per-channel scales (gaussian:auto)
        per_channel = torch.tensor([float(value) for value in scale], dtype=torch.float64)
        step = per_channel.view(1, -1, *([1] * (len(shape) - 1))).expand(1, *shape).clone()
    # float64: z500's mean (5e5 m^2/s^2) would leave float32 a few units of a small scale's step.
    difference = to_physical(step) - to_physical(zero)
    return np.abs(difference[0].double().cpu().numpy())


def has_dropout(model: nn.Module) -> bool:
    """Whether any dropout layer of ``model`` drops something (a rate above 0)."""
    return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules())


@contextlib.contextmanager
def dropout_on(model: nn.Module) -> Iterator[None]:
    """``model`` in training mode but for its normalization layers with running statistics (Monte Carlo
    dropout: every stochastic layer samples, batch norm keeps its inference statistics), then back in inference
    mode. Training mode reaches every module so that a layer that reads its own flag (an attention block passing
    its dropout rate to SDPA, stochastic depth) samples too."""
    model.train()
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._NormBase):
            module.eval()
    try:
        yield
    finally:
        model.eval()


def ensemble_members(
    perturbation: Perturbation,
    count: int,
    latitudes: np.ndarray,
    longitudes: np.ndarray,
    model: nn.Module,
    predict: Callable[[torch.Tensor], torch.Tensor],
    seed: int,
) -> EnsembleMembers:
    """The ``count - 1`` members beside the control of a ``perturbation`` of ``model`` (whose inference step is
    ``predict``); a ConfigError for dropout on a model without any, or a length the grid cannot measure."""
    if perturbation.kind == DROPOUT:
        if not has_dropout(model):
            raise ConfigError(
                "--perturb dropout: the model has no dropout (no dropout layer with a rate above 0; the ViT's is "
                "model.dropout, set when it was trained): use --perturb gaussian:SCALE"
            )

        def predict_with_dropout(state: torch.Tensor) -> torch.Tensor:
            with dropout_on(model):
                return predict(state)

        return EnsembleMembers(
            count, control_copies(count), predict_with_dropout, seed, perturbation.describe()
        )
    if perturbation.kind == NOISE:
        return noise_input_members(count, model, predict, seed, perturbation.describe())
    noise = noise_for_grid(perturbation, latitudes, longitudes, seed)
    scale = channel_scale(perturbation)

    def perturb(starts: Sequence[ForecastStart], state: torch.Tensor) -> torch.Tensor:
        drawn = noise.draw(starts, count - 1, state.shape[1]).to(state.device)
        if isinstance(scale, torch.Tensor) and len(scale) != state.shape[1]:
            raise ConfigError(f"{len(scale)} per-channel scales for a state of {state.shape[1]} channels")
        return (
            state.unsqueeze(1)
            + (scale.to(state.device) if isinstance(scale, torch.Tensor) else scale) * drawn
        )

    length = "white noise" if noise.length_km == 0 else f"correlated over {noise.length_km:g} km"
    if perturbation.channel_scales is not None:
        sizes = ", ".join(f"{value:.3g}" for value in perturbation.channel_scales)
        source = perturbation.scales_from
        description = (
            f"Gaussian initial-state noise of per-channel scales ({sizes} standard deviations, from {source}), "
            f"{length}"
        )
    else:
        description = f"Gaussian initial-state noise of {scale:g} standard deviations, {length}"
    return EnsembleMembers(count, perturb, predict, seed, description)


def channel_scale(perturbation: Perturbation) -> float | torch.Tensor:
    """A gaussian perturbation's scale: one number, or (C, 1, 1) per-channel scales (``gaussian:auto``)."""
    if perturbation.channel_scales is None:
        return perturbation.scale
    return torch.tensor(perturbation.channel_scales, dtype=torch.float32).view(-1, 1, 1)
