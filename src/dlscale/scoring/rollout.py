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
from dlscale.scoring.forecast_scores import ForecastScores
from dlscale.scoring.spectra import ZonalSpectra

MODEL, PERSISTENCE, CLIMATOLOGY = "model", "persistence", "climatology"


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
    forecasts: np.ndarray | None  # (N, steps, C, H, W) float32, physical units, when kept
    maps: RolloutMaps | None
    first_nonfinite_lead: int | None  # the first lead index where the model's forecast held NaN/inf
    # The model's and the truth's zonal energy spectra at mid-latitudes; None on a grid without that band.
    spectra: ZonalSpectra | None = None

    @property
    def forecast_steps(self) -> int:
        """Model forward passes of one initial time each (a batch of B initial times is B of them)."""
        return int(self.scores[MODEL].count[1:].sum()) if MODEL in self.scores else 0


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
) -> Rollout:
    """Roll ``predict`` forward ``steps`` model steps from every start, ``batch_size`` starts at a time, scoring
    the model, persistence and (with a climatology) the climatology at leads 0..steps. ``show_progress`` wraps
    the list of batches (a progress bar). ``keep_forecasts`` keeps every forecast (to write them); ``map_leads``
    keeps the first start's forecast and truth at those lead indices (the rollout figure). ``climatology``: the
    ACC's reference and the climatology forecaster, at each valid time (None: no ACC and no climatology
    forecaster)."""
    n_leads, n_channels = steps + 1, len(trajectories.channel_names)
    scores = forecaster_scores(
        (MODEL, PERSISTENCE), n_leads, n_channels, trajectories.latitudes, climatology is not None
    )
    spectra = ZonalSpectra.for_grid(n_leads, n_channels, trajectories.latitudes, trajectories.longitudes)
    kept = None
    maps = RolloutMaps(starts[0]) if map_leads and starts else None
    first_nonfinite: int | None = None
    model_seconds, began = 0.0, time.perf_counter()
    with torch.inference_mode():
        batches = [list(starts[at : at + batch_size]) for at in range(0, len(starts), batch_size)]
        first = 0
        for batch in show_progress(batches):
            initial = trajectories.states(batch, 0).to(device)
            if kept is None and keep_forecasts:
                kept = np.empty((len(starts), steps, *initial.shape[1:]), dtype=np.float32)
            reference = _reference(climatology, batch, 0, device)
            # the model starts from the truth
            score_lead(scores, 0, {MODEL: initial, PERSISTENCE: initial}, initial, reference)
            if spectra is not None:
                spectra.add(0, initial, initial)
            state = trajectories.normalize(initial)
            for lead in range(1, n_leads):
                synchronize()
                tick = time.perf_counter()
                prediction = predict(state)
                synchronize()
                model_seconds += time.perf_counter() - tick
                _check_feeds_back(prediction, state)
                state = prediction.float()
                forecast = trajectories.to_physical(state)
                truth = trajectories.states(batch, lead).to(device)
                reference = _reference(climatology, batch, lead, device)
                score_lead(scores, lead, {MODEL: forecast, PERSISTENCE: initial}, truth, reference)
                if spectra is not None:
                    spectra.add(lead, forecast, truth)
                if first_nonfinite is None and not bool(torch.isfinite(forecast).all()):
                    first_nonfinite = lead
                if kept is not None:
                    kept[first : first + len(batch), lead - 1] = forecast.cpu().numpy()
                if maps is not None and first == 0 and lead in map_leads:
                    maps.leads.append(lead)
                    maps.forecasts.append(forecast[0].cpu().numpy())
                    maps.truths.append(truth[0].cpu().numpy())
            first += len(batch)
    seconds = time.perf_counter() - began
    return Rollout(scores, steps, model_seconds, seconds, kept, maps, first_nonfinite, spectra)


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
