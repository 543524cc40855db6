"""``dlscale score``: score forecasts made anywhere, in WeatherBench2's layout, against a truth store, with the code
that scores ``dlscale forecast``'s rollouts.

What is read: each forecast (a zarr store or a netCDF file: ours from ``forecast --write``, or one from
elsewhere; :mod:`dlscale.data.era5.forecast_reading`), the truth (any store ``import-era5`` reads;
:mod:`dlscale.data.era5.truth_reading`) and, when named, a climatology store by day of year and hour of day
(:mod:`dlscale.run.forecast_climatology`: the ACC's reference and the climatology forecaster; without one there
is no ACC). The forecasts are scored on the first one's grid, found in the truth and in the others by
coordinates; on the channels all of them and the truth hold; on the initial times and leads all of them have;
and only on the initial times whose valid times (time + prediction_timedelta) the truth has at every lead. The
document says what was left out.

Leads: the step is the greatest common divisor of the leads scored (6 h for WeatherBench2's 6-hourly ones),
lead index ``k`` is ``k`` steps; an index the files lack (lead 0 in ours, which start at the first step) has no
score (null). Persistence: the truth at each initial time, as ``dlscale forecast`` scores it (so the two agree),
scored when the truth has every initial time; a forecast's own lead 0, where it has one, is that forecast's
score at lead 0.

Streams: a few initial times at a time (:data:`BATCH_INITIAL_TIMES`), one lead at a time, so memory holds a
few fields of each forecast and of the truth, never a whole forecast. The scores are
:class:`~dlscale.scoring.forecast_scores.ForecastScores` and :class:`~dlscale.scoring.spectra.ZonalSpectra`
(the model's and the truth's spectra: one forecast; a comparison has none), the document
:func:`~dlscale.report.forecast_report.forecast_document`'s, the directory written in one piece
(:mod:`dlscale.report.scores_directory`). One forecast is the forecaster ``model`` (its document reads as a
forecast's); a comparison names each forecast by its label.

An ensemble (a ``number`` dimension: ``dlscale forecast --members``, WeatherBench2's IFS ENS) is scored as
``dlscale forecast`` scores its own, through :func:`~dlscale.scoring.rollout.score_members`: its first member
(number 0, the control; see :mod:`dlscale.data.era5.forecast_reading` for a file without one) is ``model``, the
members' mean ``ensemble``, and the document's ``ensemble`` entry holds the CRPS, spread, spread/skill and rank
histograms (:mod:`dlscale.report.ensemble_report`); the spectra are the first member's. A few initial times with
all their members are read at a time (:data:`BATCH_INITIAL_TIMES` divided by the members, at least one). An
ensemble is scored alone: ``--compare`` with one is refused, as a comparison's document has one forecaster per
forecast and no room for several ensembles' CRPS and rank histograms, and scoring each by its mean alone would
hide what makes it an ensemble.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dlscale.data.era5.forecast_reading import MEMBER, ForecastFile
from dlscale.data.era5.grid_matching import coordinate_positions
from dlscale.data.era5.importing.names import weatherbench2_name
from dlscale.data.era5.truth_reading import TruthStore
from dlscale.data.trajectories import ForecastStart
from dlscale.errors import DataError
from dlscale.report.forecast_report import forecast_document, headline_lines
from dlscale.report.forecast_selection import lead_text
from dlscale.report.run_dir import early_logging
from dlscale.report.scores_directory import score_figures, write_scores_directory
from dlscale.run.forecast_climatology import choose_climatology
from dlscale.run.score_inputs import NamedForecast, check_score_inputs
from dlscale.runtime.strict_json import to_json
from dlscale.scoring.climatologies import Climatology
from dlscale.scoring.rollout import (
    ENSEMBLE,
    MODEL,
    PERSISTENCE,
    EnsembleRollout,
    Rollout,
    forecaster_scores,
    score_lead,
    score_members,
)
from dlscale.scoring.spectra import ZonalSpectra
from dlscale.version import __version__

log = logging.getLogger("dlscale.train")

BATCH_INITIAL_TIMES = 4  # initial times read and scored together (an ensemble's: divided by its members)
MINUTE = np.timedelta64(1, "m")


@dataclass
class ScoredGrid:
    """The channels and grid scored, as the report and the climatology's reader see a forecast's data."""

    channel_names: tuple[str, ...]
    units: tuple[str, ...]
    long_names: tuple[str, ...]
    step_hours: float
    latitudes: np.ndarray
    longitudes: np.ndarray
    weatherbench2_names: tuple[tuple[str, int | None] | None, ...]

    @property
    def hours_per_state(self) -> float:
        return self.step_hours

    def climatology(self) -> None:
        """No mean field over training years: the ACC needs a climatology store."""
        return None


@dataclass
class LinedUp:
    """What the forecasts have in common with each other and with the truth, and where each holds it."""

    times: np.ndarray  # datetime64[ns]: the initial times scored
    leads: np.ndarray  # timedelta64[ns]: the leads scored, increasing
    step: np.timedelta64  # their greatest common divisor
    time_at: list[np.ndarray]  # per forecast: the position of each initial time in its file
    lead_at: list[np.ndarray]  # per forecast: the position of each lead in its file
    rows: list[np.ndarray]  # per forecast: its row of each of the scoring grid's latitudes
    columns: list[np.ndarray]
    left_out_times: int  # common initial times the truth cannot score at every lead
    persistence: bool  # whether the truth has every initial time


@dataclass
class ScoreResult:
    """The document (``scores.json``) and the directory it went to."""

    document: dict[str, Any]
    output_dir: Path


def score_forecasts(
    forecasts: Sequence[str | Path],
    truth: str | Path,
    climatology: str | Path | None = None,
    out: str | Path | None = None,
    figures: bool = True,
) -> ScoreResult:
    """Score ``forecasts`` (paths, or ``LABEL=PATH``; several: a comparison) against ``truth`` (see the module's
    docstring); bad input raises a DlscaleError before anything is written. ``figures``: draw the PNGs."""
    chosen = str(climatology) if climatology is not None else None
    named, directory = check_score_inputs([str(f) for f in forecasts], str(truth), chosen, out)
    with early_logging(True):
        files: list[ForecastFile] = []
        store: TruthStore | None = None
        try:
            for forecast in named:
                files.append(ForecastFile(forecast.path))
            _check_no_ensemble_compared(named, files)
            channels = _common_channels(named, files)
            store = TruthStore.open(str(truth), channels, files[0].latitudes, files[0].longitudes)
            return _score(named, files, store, str(truth), chosen, directory, figures)
        finally:
            for file in files:
                file.close()
            if store is not None:
                store.close()


def _score(
    named: list[NamedForecast],
    files: list[ForecastFile],
    store: TruthStore,
    truth: str,
    climatology_path: str | None,
    directory: Path,
    figures: bool = True,
) -> ScoreResult:
    began = time.perf_counter()
    lined = _line_up(named, files, store)
    first = files[0]
    by_name = {channel.name: channel for channel in first.channels}
    channels = store.channel_names
    step_hours = float(lined.step / MINUTE) / 60
    grid = ScoredGrid(
        channels,
        tuple(by_name[name].unit for name in channels),
        tuple(by_name[name].long_name for name in channels),
        step_hours,
        first.latitudes,
        first.longitudes,
        tuple(weatherbench2_name(name) for name in channels),
    )
    steps = int(lined.leads[-1] // lined.step)
    starts = [ForecastStart(0, i, t) for i, t in enumerate(lined.times)]
    climatology = None
    if climatology_path is not None:
        climatology = choose_climatology(climatology_path, grid, starts, steps)  # type: ignore[arg-type]
    single = len(named) == 1
    labels = [MODEL] if single else [forecast.label for forecast in named]
    log.info(
        "Scoring %s against %s: %d channels, %d initial times (%s .. %s), %d leads up to %s%s",
        ", ".join(str(forecast.path) for forecast in named),
        truth,
        len(channels),
        len(lined.times),
        lined.times[0].astype("datetime64[m]"),
        lined.times[-1].astype("datetime64[m]"),
        len(lined.leads),
        lead_text(steps * step_hours),
        "" if lined.persistence else "; no persistence: the truth lacks some initial times",
    )
    if first.members is not None:
        log.info(
            "An ensemble of %d members; %s is scored alone as %r", first.member_count, first.control, MODEL
        )
    rollout = _rollout(files, store, lined, grid, starts, labels, climatology, single)
    rollout.seconds = time.perf_counter() - began
    identity = _identity(named, files, store, truth, climatology, lined, labels, directory)
    initial_times = [str(t) for t in lined.times.astype("datetime64[m]")]
    document = forecast_document(rollout, grid, identity, initial_times)  # type: ignore[arg-type]
    document.pop("throughput")
    document["seconds"] = rollout.seconds
    drawn = score_figures(document) if figures else {}
    written = write_scores_directory(directory, document, drawn, "the scores")
    for line in headline_lines(document):
        log.info("  %s", line)
    log.info("Scores written to %s (%s)", directory, ", ".join(path.name for path in written))
    return ScoreResult(json.loads(to_json(document)), directory)


def _rollout(
    files: list[ForecastFile],
    store: TruthStore,
    lined: LinedUp,
    grid: ScoredGrid,
    starts: list[ForecastStart],
    labels: list[str],
    climatology: Climatology | None,
    single: bool,
) -> Rollout:
    """Every forecast's scores (and one forecast's spectra) over the common initial times and leads, as a
    :class:`Rollout` (no model ran: its seconds are 0); one ensemble's with its :class:`EnsembleRollout`."""
    channels = grid.channel_names
    n_leads = int(lined.leads[-1] // lined.step) + 1
    baselines = [PERSISTENCE] if lined.persistence else []
    ensemble = _ensemble_rollout(files[0], n_leads, len(channels), grid.latitudes) if single else None
    members = [ENSEMBLE] if ensemble is not None else []
    scores = forecaster_scores(
        [*labels, *members, *baselines], n_leads, len(channels), grid.latitudes, climatology is not None
    )
    spectra = (
        ZonalSpectra.for_grid(n_leads, len(channels), grid.latitudes, grid.longitudes) if single else None
    )
    first_nonfinite: int | None = None
    per_batch = max(1, BATCH_INITIAL_TIMES // files[0].member_count)
    for at in range(0, len(lined.times), per_batch):
        batch = np.arange(at, min(at + per_batch, len(lined.times)))
        times = lined.times[batch]
        initial = torch.from_numpy(store.read(times)) if lined.persistence else None
        for position, lead in enumerate(lined.leads):
            index = int(lead // lined.step)
            truth = torch.from_numpy(store.read(times + lead))
            forecasts = {
                label: torch.from_numpy(
                    file.read(
                        lined.time_at[f][batch],
                        int(lined.lead_at[f][position]),
                        channels,
                        lined.rows[f],
                        lined.columns[f],
                    )
                )
                for f, (label, file) in enumerate(zip(labels, files, strict=True))
            }
            # one forecast's every value: the model's (N, C, H, W), or an ensemble's members (N, M, C, H, W)
            own = forecasts[MODEL] if single else None
            if ensemble is not None and own is not None:
                forecasts[ENSEMBLE] = score_members(ensemble, index, own, truth)
                forecasts[MODEL] = own[:, 0]
            if initial is not None:
                forecasts[PERSISTENCE] = initial
            reference = climatology.fields([starts[i] for i in batch], index) if climatology else None
            score_lead(scores, index, forecasts, truth, reference)
            if spectra is not None:
                spectra.add(index, forecasts[MODEL], truth)
            if own is not None and first_nonfinite is None and not bool(torch.isfinite(own).all()):
                first_nonfinite = index
    return Rollout(scores, n_leads - 1, 0.0, 0.0, None, None, first_nonfinite, spectra, ensemble)


def _ensemble_rollout(
    file: ForecastFile, n_leads: int, n_channels: int, latitudes: np.ndarray
) -> EnsembleRollout | None:
    """Empty ensemble sums for ``file``'s members and its first member alone; None for a deterministic file."""
    if file.members is None:
        return None
    numbers = f"{file.members[0]}" if file.member_count == 1 else f"{file.members[0]} .. {file.members[-1]}"
    description = (
        f"the members of {file.path.name}, numbered {numbers}; {file.control} is scored as {MODEL!r}"
    )
    if file.perturbation:
        description = f"{file.perturbation}; {description}"
    return EnsembleRollout.empty(n_leads, n_channels, file.member_count, latitudes, description=description)


def _check_no_ensemble_compared(named: list[NamedForecast], files: list[ForecastFile]) -> None:
    """An ensemble is scored alone (the module's docstring says why)."""
    if len(files) < 2:
        return
    for forecast, file in zip(named, files, strict=True):
        if file.members is not None:
            raise DataError(
                f"{forecast.path}: is an ensemble of {file.member_count} members (a {MEMBER!r} dimension), and "
                "dlscale score compares deterministic forecasts only; score each ensemble alone, or compare "
                f"its mean (xarray: forecast.mean({MEMBER!r}))"
            )


def _common_channels(named: list[NamedForecast], files: list[ForecastFile]) -> list[str]:
    """The first forecast's channels that every other forecast has too."""
    channels = [
        name for name in files[0].channel_names if all(name in file.channel_names for file in files[1:])
    ]
    if not channels:
        raise DataError(
            f"the forecasts have no channel in common: {named[0].label} has {', '.join(files[0].channel_names)}, "
            + "; ".join(
                f"{n.label} has {', '.join(f.channel_names)}"
                for n, f in zip(named[1:], files[1:], strict=True)
            )
        )
    return channels


def _line_up(named: list[NamedForecast], files: list[ForecastFile], store: TruthStore) -> LinedUp:
    """The initial times, leads and grid positions the forecasts share, kept where the truth can score them."""
    times = files[0].times
    leads = files[0].leads[files[0].leads >= np.timedelta64(0, "ns")]
    for file in files[1:]:
        times = np.intersect1d(times, file.times)
        leads = np.intersect1d(leads, file.leads)
    leads = np.sort(leads)
    which = "the forecasts have" if len(files) > 1 else f"{files[0].path} has"
    if not len(times) or not (leads > np.timedelta64(0, "ns")).any():
        raise DataError(
            f"no initial time and lead beyond 0 that all the forecasts share ({len(times)} common initial times, "
            f"common leads {', '.join(lead_text(float(lead / MINUTE) / 60) for lead in leads) or 'none'})"
        )
    minutes = [int(lead // MINUTE) for lead in leads if lead > np.timedelta64(0, "ns")]
    step = np.timedelta64(math.gcd(*minutes), "m").astype("timedelta64[ns]")
    covered = np.all([np.isin(times + lead, store.times) for lead in leads], axis=0)
    if not covered.any():
        raise DataError(
            f"no common valid time: {which} {len(times)} initial times ({times[0]} .. {times[-1]}) with leads "
            f"up to {lead_text(float(leads[-1] / MINUTE) / 60)}, and {store.source.description} holds none of "
            f"their valid times at every lead (it holds {len(store.times)} times, "
            f"{store.times[0] if len(store.times) else '-'} .. {store.times[-1] if len(store.times) else '-'})"
        )
    kept = times[covered]
    grid = files[0].latitudes, files[0].longitudes
    rows, columns = [], []
    for forecast, file in zip(named, files, strict=True):
        rows.append(_grid_positions(forecast, file.latitudes, grid[0], "latitude", False, named[0].label))
        columns.append(_grid_positions(forecast, file.longitudes, grid[1], "longitude", True, named[0].label))
    return LinedUp(
        times=kept,
        leads=leads,
        step=step,
        time_at=[np.searchsorted(file.times, kept) for file in files],
        lead_at=[
            np.asarray([int(np.flatnonzero(file.leads == lead)[0]) for lead in leads]) for file in files
        ],
        rows=rows,
        columns=columns,
        left_out_times=int((~covered).sum()),
        persistence=bool(np.isin(kept, store.times).all()),
    )


def _grid_positions(
    forecast: NamedForecast, have: np.ndarray, wanted: np.ndarray, name: str, wrap: bool, first: str
) -> np.ndarray:
    positions, missing = coordinate_positions(have, wanted, wrap)
    if missing is not None:
        raise DataError(
            f"{forecast.path}: has no {name} {wanted[missing]:g} of the grid of {first}, the first forecast: "
            "forecasts compared must share a grid"
        )
    return positions


def _identity(
    named: list[NamedForecast],
    files: list[ForecastFile],
    store: TruthStore,
    truth: str,
    climatology: Climatology | None,
    lined: LinedUp,
    labels: list[str],
    directory: Path,
) -> dict[str, Any]:
    """What was scored, for scores.json: the forecasts, the truth, the climatology, what was left out."""
    title = f"{named[0].path.name}" if len(named) == 1 else f"{len(named)} forecasts"
    forecasts = [
        {
            "label": forecast.label,
            "forecaster": label,
            "path": str(forecast.path),
            "initial_time_count": len(file.times),
            "lead_count": len(file.leads),
            "channels": list(file.channel_names),
            "left_out": file.left_out,
            **(
                {"members": file.member_count, "scored_as_model": file.control}
                if file.members is not None
                else {}
            ),
        }
        for forecast, file, label in zip(named, files, labels, strict=True)
    ]
    return {
        "command": "score",
        "title": f"{title} against {Path(truth).name}",
        "forecasts": forecasts,
        "truth": truth,
        "channels_left_out": store.lacking,
        "climatology": climatology.description if climatology is not None else None,
        "persistence": "the truth at each initial time"
        if lined.persistence
        else "not scored: the truth lacks some of the initial times",
        "common": f"scored on the {len(lined.times)} initial times and {len(lined.leads)} leads all "
        f"{len(named)} forecast{'s' if len(named) > 1 else ''} have, whose valid times the truth holds at every "
        f"lead ({lined.left_out_times} common initial times left out for that)",
        "initial_times_left_out": lined.left_out_times,
        "output_dir": str(directory),
        "dlscale_version": __version__,
        "torch_version": str(torch.__version__),
    }
