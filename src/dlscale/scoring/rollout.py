"""Autoregressive rollouts: a model's prediction fed back as its next input, scored at every lead time.

What ``dlscale forecast`` runs. The data side is a :class:`~dlscale.data.trajectories.Trajectories` (a workload
offers one through its optional ``forecast_data`` member; the ERA5 workload's is
:class:`dlscale.data.era5.trajectories.ERA5Trajectories`): states along time in physical units, how to
normalize them for the model and back, the grid's latitudes. The climatology, the ACC's reference, is the
caller's (:mod:`dlscale.scoring.climatologies`: a field per valid time, or one mean field). The rollout streams: a batch of initial times at a time, one lead at a time, so memory holds a
few (batch, C, H, W) fields, never the whole forecast, unless the caller asks to keep it (to write it).

Three forecasters are scored the same way (:mod:`dlscale.scoring.forecast_scores`): the model, persistence
(the initial state at every lead: what a forecast must beat at short leads) and the climatology (what it must
beat at long ones; only where the data has one). The model's and the truth's zonal energy spectra at
mid-latitudes are kept per lead too (:mod:`dlscale.scoring.spectra`: how much the model blurs as it rolls out).

An ensemble (``members``, :class:`EnsembleMembers`): member 0 is the control, the model's forecast from the
unperturbed state (still scored as ``model``); the other members start from perturbed states or run with dropout
on (:mod:`dlscale.scoring.perturbations`), all of a batch's members through the model in one call. The
ensemble's mean is a fourth forecaster (``ensemble``: RMSE, bias and ACC of the mean), and the ensemble's own
scores (:class:`~dlscale.scoring.ensemble_scores.EnsembleScores`: CRPS, spread, spread/skill, rank histogram)
are kept beside the control's as a one-member ensemble (its CRPS is its mean absolute error).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from dlscale.data.trajectories import ForecastStart, Trajectories
from dlscale.errors import DataError
from dlscale.scoring.climatologies import Climatology
from dlscale.scoring.ensemble_scores import EnsembleScores
from dlscale.scoring.forecast_scores import ForecastScores
from dlscale.scoring.spectra import ZonalSpectra

MODEL, ENSEMBLE, PERSISTENCE, CLIMATOLOGY = "model", "ensemble", "persistence", "climatology"


@dataclass(frozen=True)
class EnsembleMembers:
    """How an ensemble's members besides the control are made: ``perturb`` maps the batch's starts and their
    normalized initial states (N, C, H, W) to the other members' (N, count - 1, C, H, W); ``predict`` is the
    model step they take (the control's, or the same model with dropout on); ``seed`` seeds the rank
    histogram's tie-breaking."""

    count: int
    perturb: Callable[[Sequence[ForecastStart], torch.Tensor], torch.Tensor]
    predict: Callable[[torch.Tensor], torch.Tensor]
    seed: int = 0
    description: str = ""  # how the members differ, for the log and the document
    # a model with noise inputs: the other members' noise for the batch's starts at model step k (1 the first),
    # (N * (count - 1), noise channels, H, W), read beside their states
    noise: Callable[[Sequence[ForecastStart], int], torch.Tensor] | None = None


@dataclass
class EnsembleRollout:
    """An ensemble's scores (every member, the control included) and the control's as a one-member ensemble."""

    members: EnsembleScores
    control: EnsembleScores
    description: str = ""  # how the members differ (EnsembleMembers.description)

    @classmethod
    def empty(
        cls,
        n_leads: int,
        n_channels: int,
        members: int,
        latitudes: np.ndarray,
        seed: int = 0,
        description: str = "",
    ) -> EnsembleRollout:
        """Empty sums for an ensemble of ``members`` and for its first member alone."""
        return cls(
            EnsembleScores(n_leads, n_channels, members, latitudes, seed),
            EnsembleScores(n_leads, n_channels, 1, latitudes),
            description,
        )


@dataclass
class RolloutMaps:
    """One initial time's forecast and truth at a few lead indices, for the rollout figure."""

    start: ForecastStart
    leads: list[int] = field(default_factory=list)
    forecasts: list[np.ndarray] = field(default_factory=list)  # each (C, H, W), physical units
    truths: list[np.ndarray] = field(default_factory=list)


@dataclass
class Rollout:
    """The scores of every forecaster, timings, and what the caller asked to keep."""

    scores: dict[str, ForecastScores]
    steps: int  # model steps per rollout
    model_seconds: float  # time inside the model's forward passes (device synchronized)
    seconds: float  # the whole rollout, reading the truth and scoring included
    forecasts: np.ndarray | None  # (N, steps, C, H, W) float32, physical units, when kept; (N, M, steps, ...)
    # for an ensemble of M members
    maps: RolloutMaps | None
    # the first lead index where the model's forecast (an ensemble's control) held NaN/inf; the members':
    # ensemble.members.nonfinite_members()
    first_nonfinite_lead: int | None
    # The model's and the truth's zonal energy spectra at mid-latitudes; None on a grid without that band.
    spectra: ZonalSpectra | None = None
    ensemble: EnsembleRollout | None = None

    @property
    def members(self) -> int:
        return self.ensemble.members.n_members if self.ensemble is not None else 1

    @property
    def forecast_steps(self) -> int:
        """Model forward passes of one initial time and member each (a batch of B initial times of M members is
        B x M of them)."""
        return int(self.scores[MODEL].count[1:].sum()) * self.members if MODEL in self.scores else 0


def roll_out(
    predict: Callable[[torch.Tensor], torch.Tensor],
    trajectories: Trajectories,
    starts: Sequence[ForecastStart],
    steps: int,
    batch_size: int,
    device: torch.device,
    synchronize: Callable[[], None] = lambda: None,
    keep_forecasts: bool = False,
    map_leads: Sequence[int] = (),
    show_progress: Callable[[list[list[ForecastStart]]], Iterable[list[ForecastStart]]] = iter,
    climatology: Climatology | None = None,
    members: EnsembleMembers | None = None,
) -> Rollout:
    """Roll ``predict`` forward ``steps`` model steps from every start, ``batch_size`` starts at a time, scoring
    the model, persistence and (with a climatology) the climatology at leads 0..steps. ``show_progress`` wraps
    the list of batches (a progress bar). ``keep_forecasts`` keeps every forecast (to write them); ``map_leads``
    keeps the first start's forecast and truth at those lead indices (the rollout figure). ``climatology``: the
    ACC's reference and the climatology forecaster, at each valid time (None: no ACC and no climatology
    forecaster). ``members``: roll out an ensemble (the control is ``predict``'s forecast, as without)."""
    n_leads, n_channels = steps + 1, len(trajectories.channel_names)
    forecasters = (MODEL, PERSISTENCE) if members is None else (MODEL, ENSEMBLE, PERSISTENCE)
    scores = forecaster_scores(
        forecasters, n_leads, n_channels, trajectories.latitudes, climatology is not None
    )
    ensemble = None
    if members is not None:
        latitudes = trajectories.latitudes
        ensemble = EnsembleRollout.empty(
            n_leads, n_channels, members.count, latitudes, members.seed, members.description
        )
    spectra = ZonalSpectra.for_grid(n_leads, n_channels, trajectories.latitudes, trajectories.longitudes)
    grid = (n_channels, len(trajectories.latitudes), len(trajectories.longitudes))
    member_shape = () if members is None else (members.count,)
    kept = np.empty((len(starts), *member_shape, steps, *grid), dtype=np.float32) if keep_forecasts else None
    maps = RolloutMaps(starts[0]) if map_leads and starts else None
    first_nonfinite: int | None = None
    model_seconds, began = 0.0, time.perf_counter()
    with torch.inference_mode():
        batches = [list(starts[at : at + batch_size]) for at in range(0, len(starts), batch_size)]
        first = 0
        for batch in show_progress(batches):
            initial = trajectories.states(batch, 0).to(device)
            reference = _reference(climatology, batch, 0, device)
            state = trajectories.normalize(initial)
            # the model starts from the truth, the other members from its perturbations
            forecasts = {MODEL: initial, PERSISTENCE: initial}
            if members is not None:
                others = members.perturb(batch, state).to(device)  # (N, M - 1, C, H, W)
                member_states = others.flatten(0, 1)
                ensemble_forecast = _with_control(initial, trajectories.to_physical(member_states), members)
                forecasts[ENSEMBLE] = score_members(ensemble, 0, ensemble_forecast, initial)
            score_lead(scores, 0, forecasts, initial, reference)
            if spectra is not None:
                spectra.add(0, initial, initial)
            for lead in range(1, n_leads):
                synchronize()
                tick = time.perf_counter()
                prediction = predict(state)
                if members is not None:
                    member_input = member_states
                    if members.noise is not None:
                        noise = members.noise(batch, lead).to(device=device, dtype=member_states.dtype)
                        member_input = torch.cat([member_states, noise], dim=1)
                    member_prediction = members.predict(member_input)
                synchronize()
                model_seconds += time.perf_counter() - tick
                _check_feeds_back(prediction, state)
                state = prediction.float()
                forecast = trajectories.to_physical(state)
                truth = trajectories.states(batch, lead).to(device)
                reference = _reference(climatology, batch, lead, device)
                forecasts = {MODEL: forecast, PERSISTENCE: initial}
                kept_forecast = forecast
                if members is not None:
                    member_states = member_prediction.float()
                    kept_forecast = _with_control(forecast, trajectories.to_physical(member_states), members)
                    forecasts[ENSEMBLE] = score_members(ensemble, lead, kept_forecast, truth)
                score_lead(scores, lead, forecasts, truth, reference)
                if spectra is not None:
                    spectra.add(lead, forecast, truth)
                # the model's own forecast (the control); an ensemble's members count theirs in its scores
                if first_nonfinite is None and not bool(torch.isfinite(forecast).all()):
                    first_nonfinite = lead
                if kept is not None:
                    kept[first : first + len(batch), ..., lead - 1, :, :, :] = kept_forecast.cpu().numpy()
                if maps is not None and first == 0 and lead in map_leads:
                    maps.leads.append(lead)
                    maps.forecasts.append(forecast[0].cpu().numpy())
                    maps.truths.append(truth[0].cpu().numpy())
            first += len(batch)
    seconds = time.perf_counter() - began
    return Rollout(scores, steps, model_seconds, seconds, kept, maps, first_nonfinite, spectra, ensemble)


def _with_control(control: torch.Tensor, others: torch.Tensor, members: EnsembleMembers) -> torch.Tensor:
    """(N, M, C, H, W): the control (N, C, H, W) as member 0, then the other members ((N * (M - 1), C, H, W),
    each start's members together)."""
    others = others.view(control.shape[0], members.count - 1, *control.shape[1:])
    return torch.cat([control.unsqueeze(1), others], dim=1)


def score_members(
    ensemble: EnsembleRollout | None, lead: int, forecast: torch.Tensor, truth: torch.Tensor
) -> torch.Tensor:
    """Add an (N, M, C, H, W) ensemble forecast (member 0: the control) to the ensemble's scores and its control
    to the control's; the ensemble mean (N, C, H, W), the forecast the ``ensemble`` forecaster is scored by."""
    assert ensemble is not None  # roll_out creates it with the members
    ensemble.members.add(lead, forecast, truth)
    ensemble.control.add(lead, forecast[:, :1], truth)
    return forecast.mean(dim=1)


def forecaster_scores(
    forecasters: Sequence[str], n_leads: int, n_channels: int, latitudes: np.ndarray, with_climatology: bool
) -> dict[str, ForecastScores]:
    """Empty sums for each of ``forecasters`` and, ``with_climatology``, the climatology forecaster (last)."""
    names = [*forecasters, *([CLIMATOLOGY] if with_climatology else [])]
    return {name: ForecastScores(n_leads, n_channels, latitudes) for name in names}


def score_lead(
    scores: dict[str, ForecastScores],
    lead: int,
    forecasts: dict[str, torch.Tensor],
    truth: torch.Tensor,
    climatology: torch.Tensor | None,
) -> None:
    """Score each forecaster's (N, C, H, W) forecast of ``forecasts`` (the model's, persistence's: the initial
    states) and, with a ``climatology``, the climatology itself against ``truth`` at lead index ``lead``, the
    truth's anomaly computed once for all."""
    anomaly = truth - climatology if climatology is not None else None
    for name, forecast in forecasts.items():
        scores[name].add(lead, forecast, truth, climatology, anomaly)
    if climatology is not None:
        scores[CLIMATOLOGY].add(lead, climatology.expand_as(truth), truth, climatology, anomaly)


def _reference(
    climatology: Climatology | None, batch: Sequence[ForecastStart], lead: int, device: torch.device
) -> torch.Tensor | None:
    """The climatology at the batch's valid times ``lead`` steps on, on ``device``."""
    return None if climatology is None else climatology.fields(batch, lead).to(device)


def _check_feeds_back(prediction: torch.Tensor, state: torch.Tensor) -> None:
    """A rollout feeds the prediction back as the next input: the shapes must agree."""
    if prediction.shape != state.shape:
        raise DataError(
            f"cannot roll out: the model maps inputs of shape {tuple(state.shape)} to predictions of shape "
            f"{tuple(prediction.shape)}, and a forecast feeds each prediction back as the next input"
        )
