"""``dlscale score``: score forecasts made anywhere, in WeatherBench2's layout, against a truth store, with the code
that scores ``dlscale forecast``'s rollouts.

What is read: each forecast (a zarr store or a netCDF file: ours from ``forecast --write``, or one from
elsewhere; :mod:`dlscale.data.era5.forecast_reading`), the truth (any store ``import-era5`` reads, or a dlscale
data root such as the demo's ``data/era5_demo``: its year files by their dates, on their grid or the crop a run
reads; :mod:`dlscale.data.era5.truth_reading`) and, when named, a climatology store by day of year and hour of day
(:mod:`dlscale.run.forecast_climatology`: the ACC's reference and the climatology forecaster; without one there
is no ACC). What is scored (:mod:`dlscale.run.score_matching`): the truth's whole grid, which every forecast
must be on (in any order); the channels all of them and the truth hold (or ``--channels``); the initial times
and leads all of them have (or those of ``--times``), each found by value, and only the initial times whose
valid times (time + prediction_timedelta) the truth has at every lead, without a missing chunk or a NaN or
infinite value (one scan of the truth before scoring finds those, so every lead and score averages over the
same initial times; ``truth_unusable`` in the document names each one left out and why). The console and the document's ``notes``
say what was left out, and too little left is refused. The fields are scored in the forecasts' precision
(float64 for a float64 forecast, the truth promoted to it; float32 otherwise, bit for bit as before); a NaN or
infinite value is said per forecast, lead and channel (``nonfinite`` in the document), its scores NaN.

Leads: the step is the greatest common divisor of the leads scored (6 h for WeatherBench2's 6-hourly ones),
lead index ``k`` is ``k`` steps; an index the files lack (lead 0 in ours, which start at the first step) has no
score (null). Persistence: the truth at each initial time, as ``dlscale forecast`` scores it (so the two agree),
scored when the truth has every initial time; a forecast's own lead 0, where it has one, is that forecast's
score at lead 0.

Streams, in blocks: a batch of initial times (the forecast file's chunk along time, at least
:data:`BATCH_INITIAL_TIMES`) at as many leads as fit in :data:`BLOCK_BYTES` is read at once, each variable with
its levels in one read, and the truth's valid times of the block once each; then scored lead by lead. So each
chunk of a forecast file is decoded once per block, not once per channel, lead and few initial times (the
demo's 10-day forecast, chunked by zarr's defaults in 12 initial times, 20 leads and 2 levels, had each chunk
decoded up to 120 times: slower than the forecast that made it), and memory holds a block, never a whole
forecast. A progress display counts the initial times scored (:class:`ScoringProgress`: a bar on a terminal, a
line every :data:`PROGRESS_INTERVAL_S` in a batch log, with an ETA). The scores are
:class:`~dlscale.scoring.forecast_scores.ForecastScores` and :class:`~dlscale.scoring.spectra.ZonalSpectra`
(the model's and the truth's spectra: one forecast; a comparison has none), the document
:func:`~dlscale.report.forecast_report.forecast_document`'s, the directory written in one piece
(:mod:`dlscale.report.scores_directory`). One forecast is the forecaster ``model`` (its document reads as a
forecast's); a comparison names each forecast by its label.

An ensemble (a ``number`` dimension: ``dlscale forecast --members``, WeatherBench2's IFS ENS) is scored as
``dlscale forecast`` scores its own, through :func:`~dlscale.scoring.rollout.score_members`: its first member
(number 0, the control; see :mod:`dlscale.data.era5.forecast_reading` for a file without one) is ``model``, the
members' mean ``ensemble``, and the document's ``ensemble`` entry holds the CRPS, spread, spread/skill and rank
histograms (:mod:`dlscale.report.ensemble_report`); the spectra are the first member's. A batch's initial times
are read with all their members (as many as fit in :data:`BLOCK_BYTES` with them, at least one). An
ensemble is scored alone: ``--compare`` with one is refused, as a comparison's document has one forecaster per
forecast and no room for several ensembles' CRPS and rank histograms, and scoring each by its mean alone would
hide what makes it an ensemble.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dlscale.data.era5.climatology.store_layout import climatology_path
from dlscale.data.era5.data_root_truth import DataRootSource
from dlscale.data.era5.forecast_reading import MEMBER, ForecastFile
from dlscale.data.era5.importing.names import weatherbench2_name
from dlscale.data.era5.truth_reading import TruthStore
from dlscale.data.trajectories import ForecastStart
from dlscale.errors import DataError
from dlscale.report.forecast_report import forecast_document, headline_lines
from dlscale.report.forecast_selection import lead_text
from dlscale.report.progress_display import PassProgress
from dlscale.report.run_dir import early_logging
from dlscale.report.scores_directory import SCORE_OPTION, score_figures, write_scores_directory
from dlscale.run.forecast_climatology import choose_climatology
from dlscale.run.score_inputs import NamedForecast, ScoreInputs, check_score_inputs
from dlscale.run.score_matching import (
    LinedUp,
    Notes,
    check_truth_channels,
    forecast_channels,
    line_up,
    open_truth,
)
from dlscale.runtime.progress_text import format_duration
from dlscale.runtime.storage import probe_creatable
from dlscale.runtime.strict_json import to_json
from dlscale.scoring.climatologies import Climatology
from dlscale.scoring.rollout import (
    CLIMATOLOGY,
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

log = logging.getLogger("dlscale.score")

BATCH_INITIAL_TIMES = 4  # initial times read and scored together (an ensemble's: divided by its members)
# The most the forecasts' fields of one block (a batch's initial times at some leads) hold: every forecast's, every
# member's. The truth's fields of a block take no more than one forecast's.
BLOCK_BYTES = 256 << 20
MINUTE = np.timedelta64(1, "m")
# The progress display: a bar on a terminal, a line this often in a batch log (as log.progress's auto).
PROGRESS_MODE = "auto"
PROGRESS_INTERVAL_S = 30.0


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
class NonFinite:
    """Where a field held a NaN or infinite value, (leads, C) each: every forecast's, by label, and the truth's."""

    forecasts: dict[str, np.ndarray]
    truth: np.ndarray


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
    channels: str | Sequence[str] | None = None,
    times: str | None = None,
) -> ScoreResult:
    """Score ``forecasts`` (paths, or ``LABEL=PATH``; several: a comparison) against ``truth`` (see the module's
    docstring); bad input raises a DlscaleError before anything is written. ``figures``: draw the PNGs.
    ``channels`` (``"z500,t2m"`` or names) and ``times`` (``"FIRST..LAST"``): score exactly these
    (:mod:`dlscale.run.score_inputs`)."""
    chosen = str(climatology) if climatology is not None else None
    inputs = check_score_inputs([str(f) for f in forecasts], str(truth), chosen, out, channels, times)
    named = inputs.forecasts
    probe_creatable(
        inputs.directory, SCORE_OPTION
    )  # a place that cannot take the scores, said before scoring
    with early_logging(True):
        files: list[ForecastFile] = []
        store: TruthStore | None = None
        try:
            for forecast in named:
                files.append(ForecastFile(forecast.path))
            _check_no_ensemble_compared(named, files)
            notes = Notes()
            for file in files:
                notes.info(file.level_note)
                notes.info(file.lead_note)
                if file.unnamed:  # fields meant as channels, under a name no channel has
                    notes.channels_left_out.update((field, "no channel's name") for field in file.unnamed)
                    notes.warn(
                        f"{file.path}: left out of the scores: {'; '.join(file.left_out)} (a pressure-level field "
                        "is read under WeatherBench2's name, e.g. geopotential, or its short one, z)"
                    )
                elif file.left_out:  # variables on other dimensions (bounds, ...): no field at all
                    notes.info(f"{file.path}: left out of the scores: {'; '.join(file.left_out)}")
            wanted = forecast_channels(named, files, inputs.channels, notes)
            store = open_truth(str(truth), wanted, named, files)
            check_truth_channels(named[0], files[0], store, str(truth), inputs.channels, notes)
            return _score(named, files, store, str(truth), chosen, inputs, notes, figures)
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
    inputs: ScoreInputs,
    notes: Notes,
    figures: bool = True,
) -> ScoreResult:
    began = time.perf_counter()
    directory = inputs.directory
    lined = line_up(named, files, store, inputs.times, notes)
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
    if climatology_path is None:
        _say_no_climatology(store)
    else:
        climatology = choose_climatology(climatology_path, grid, starts, steps)  # type: ignore[arg-type]
    single = len(named) == 1
    labels = [MODEL] if single else [forecast.label for forecast in named]
    dtype = np.result_type(*(file.dtype for file in files))
    log.info(
        "Scoring %s against %s: %d channels, %d initial times (%s .. %s), %d leads up to %s, in %s%s",
        ", ".join(str(forecast.path) for forecast in named),
        truth,
        len(channels),
        len(lined.times),
        lined.times[0].astype("datetime64[m]"),
        lined.times[-1].astype("datetime64[m]"),
        len(lined.leads),
        lead_text(steps * step_hours),
        dtype,
        "" if lined.persistence else "; no persistence: the truth lacks some initial times",
    )
    if first.members is not None:
        log.info(
            "An ensemble of %d members; %s is scored alone as %r", first.member_count, first.control, MODEL
        )
    rollout, nonfinite = _rollout(files, store, lined, grid, starts, labels, climatology, single, dtype)
    rollout.seconds = time.perf_counter() - began
    _say_nonfinite(nonfinite, named, labels, grid, truth, notes)
    if rollout.ensemble is not None:
        _say_nonfinite_members(rollout.ensemble, first, grid, notes)
    _say_partial_acc(rollout, grid, notes)
    identity = _identity(named, files, store, truth, climatology, lined, labels, inputs, dtype)
    identity["nonfinite"] = {
        "forecasts": {
            label: _nonfinite_entry(flags, grid)
            for label, flags in nonfinite.forecasts.items()
            if flags.any()
        },
        "truth": _nonfinite_entry(nonfinite.truth, grid),
    }
    identity["notes"] = notes.lines
    initial_times = [str(t) for t in lined.times.astype("datetime64[m]")]
    document = forecast_document(rollout, grid, identity, initial_times)  # type: ignore[arg-type]
    document.pop("throughput")
    document["seconds"] = rollout.seconds
    drawn = score_figures(document) if figures else {}
    if inputs.replaces is not None:
        log.info(
            "Replacing the earlier scores in %s (%s, written by dlscale %s)",
            directory,
            inputs.replaces.get("title", "untitled"),
            inputs.replaces.get("dlscale_version", "of an unknown version"),
        )
    written = write_scores_directory(directory, document, drawn, "the scores")
    for line in headline_lines(document):
        log.info("  %s", line)
    _say_channels(channels, notes)
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
    dtype: np.dtype,
) -> tuple[Rollout, NonFinite]:
    """Every forecast's scores (and one forecast's spectra) over the common initial times and leads, as a
    :class:`Rollout` (no model ran: its seconds are 0); one ensemble's with its :class:`EnsembleRollout`. The
    fields are scored in ``dtype`` (the forecasts' precision: the truth and the climatology are promoted to it).
    Beside it, where the forecasts and the truth held NaN or infinite values."""
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
    precision = torch.from_numpy(np.empty(0, dtype)).dtype
    nonfinite = NonFinite(
        {label: np.zeros((n_leads, len(channels)), bool) for label in labels},
        np.zeros((n_leads, len(channels)), bool),
    )
    per_batch, per_block = _block_sizes(files, len(channels), grid, dtype, len(lined.leads))
    batches = [
        np.arange(at, min(at + per_batch, len(lined.times))) for at in range(0, len(lined.times), per_batch)
    ]
    for batch in ScoringProgress(batches, len(lined.times)):
        times = lined.times[batch]
        initial = torch.from_numpy(store.read(times)).to(precision) if lined.persistence else None
        for first in range(0, len(lined.leads), per_block):
            block = np.arange(first, min(first + per_block, len(lined.leads)))
            # every valid time of the block once (the batch's initial times share most of them), then each lead's
            valid = times[:, None] + lined.leads[block][None, :]
            held = np.unique(valid)
            states = store.read(held)
            block_forecasts = {
                label: file.read_leads(
                    lined.time_at[f][batch],
                    lined.lead_at[f][block],
                    channels,
                    lined.rows[f],
                    lined.columns[f],
                    dtype,
                )
                for f, (label, file) in enumerate(zip(labels, files, strict=True))
            }
            for at, position in enumerate(block):
                index = int(lined.leads[position] // lined.step)
                truth = torch.from_numpy(states[np.searchsorted(held, valid[:, at])]).to(precision)
                nonfinite.truth[index] |= _nonfinite_channels(truth)
                forecasts = {label: torch.from_numpy(read[:, at]) for label, read in block_forecasts.items()}
                # one forecast's every value: the model's (N, C, H, W), or an ensemble's members (N, M, C, H, W)
                own = forecasts[MODEL] if single else None
                if ensemble is not None and own is not None:  # score_members counts non-finite members
                    forecasts[ENSEMBLE] = score_members(ensemble, index, own, truth)
                    forecasts[MODEL] = own[:, 0]
                for label in labels:  # an ensemble's: its first member's, scored alone as the model
                    nonfinite.forecasts[label][index] |= _nonfinite_channels(forecasts[label])
                if initial is not None:
                    forecasts[PERSISTENCE] = initial
                reference = None
                if climatology is not None:
                    reference = climatology.fields([starts[i] for i in batch], index).to(precision)
                score_lead(scores, index, forecasts, truth, reference)
                if spectra is not None:
                    spectra.add(index, forecasts[MODEL], truth)
    flagged = np.flatnonzero(nonfinite.forecasts[labels[0]].any(axis=1))
    first_nonfinite = int(flagged[0]) if len(flagged) else None
    rollout = Rollout(scores, n_leads - 1, 0.0, 0.0, None, None, first_nonfinite, spectra, ensemble)
    return rollout, nonfinite


def _block_sizes(
    files: list[ForecastFile], n_channels: int, grid: ScoredGrid, dtype: np.dtype, n_leads: int
) -> tuple[int, int]:
    """(initial times per batch, leads per block). A batch is the first forecast's chunk along time (so each
    chunk is decoded once per block of leads, not once per few initial times), at least
    :data:`BATCH_INITIAL_TIMES` (an ensemble's divided by its members); no more than fit one lead of every
    forecast and member in :data:`BLOCK_BYTES`, and at least one. A block is as many leads as fit in it."""
    state = n_channels * len(grid.latitudes) * len(grid.longitudes) * np.dtype(dtype).itemsize
    # one initial time at one lead, every forecast, every member
    per_lead = state * sum(file.member_count for file in files)
    wanted = max(BATCH_INITIAL_TIMES // files[0].member_count, files[0].time_chunk)
    per_batch = max(1, min(wanted, BLOCK_BYTES // per_lead))
    return per_batch, max(1, min(n_leads, BLOCK_BYTES // (per_lead * per_batch)))


class ScoringProgress(PassProgress):
    """The batches of initial times being scored, shown as the house shows a pass (a bar on a terminal, a plain
    line every :data:`PROGRESS_INTERVAL_S` in a batch log), the lines counting initial times."""

    def __init__(self, batches: list[np.ndarray], total_times: int):
        super().__init__(batches, "scoring", PROGRESS_MODE, PROGRESS_INTERVAL_S, logger=log)
        self.total_times = total_times
        self.times_done = np.cumsum([len(batch) for batch in batches])

    def status_line(self, done: int, total: int | None, elapsed: float) -> str:
        """e.g. ``scoring: 48/236 initial times (20%), 3.1 initial times/s, ETA 1m16s``."""
        times = int(self.times_done[done - 1])
        rate = times / elapsed if elapsed > 0 else 0.0
        eta = format_duration((self.total_times - times) / rate) if rate > 0 else "?"
        return (
            f"scoring: {times}/{self.total_times} initial times ({100 * times / max(self.total_times, 1):.0f}%), "
            f"{rate:.3g} initial times/s, ETA {eta}"
        )


def _nonfinite_channels(fields: torch.Tensor) -> np.ndarray:
    """(C,) bool: the channels of (N, [M,] C, H, W) ``fields`` with a NaN or infinite value anywhere."""
    finite = torch.isfinite(fields).movedim(-3, 0).flatten(1).all(dim=1)
    return (~finite).numpy()


def _nonfinite_entry(flags: np.ndarray, grid: ScoredGrid) -> dict[str, list[float]]:
    """channel -> the leads in hours at which ``flags`` (leads, C) says it held a NaN or infinite value."""
    return {
        channel: [index * grid.step_hours for index in np.flatnonzero(flags[:, c])]
        for c, channel in enumerate(grid.channel_names)
        if flags[:, c].any()
    }


def _say_nonfinite(
    nonfinite: NonFinite,
    named: list[NamedForecast],
    labels: list[str],
    grid: ScoredGrid,
    truth: str,
    notes: Notes,
) -> None:
    """A warning per forecast (and for the truth) holding NaN or infinite values: at which leads, in which
    channels; its scores there are NaN, as ``dlscale forecast`` warns of a model's."""
    said = [
        (f"The forecast {forecast.path}", nonfinite.forecasts[label], "its scores")
        for label, forecast in zip(labels, named, strict=True)
    ]
    said.append((f"The truth {truth}", nonfinite.truth, "every forecaster's scores"))
    for what, flags, scored in said:
        if not flags.any():
            continue
        leads = ", ".join(f"{index * grid.step_hours:g} h" for index in np.flatnonzero(flags.any(axis=1)))
        where = ", ".join(channel for c, channel in enumerate(grid.channel_names) if flags[:, c].any())
        notes.warn(
            f"{what} holds NaN or infinite values at lead {leads} in {where}: {scored} there are NaN "
            "(null in scores.json; nonfinite lists them)"
        )


def _say_no_climatology(store: TruthStore) -> None:
    """Without ``--climatology`` there is no ACC; a data root with its climatology store is told how to get it
    (the reference ``dlscale forecast`` scored against by default), as score looks for no store itself."""
    if not isinstance(store.source, DataRootSource):
        return
    built = climatology_path(store.source.root)
    if built.exists():
        log.info("No ACC: no --climatology; --climatology %s gives the ACC dlscale forecast reports", built)


def _say_channels(channels: tuple[str, ...], notes: Notes) -> None:
    """After the table (which shows the headline channels only): how many channels were scored, every one in
    scores.csv, and which were left out and why (said before scoring too, where progress lines may hide it)."""
    scored = f"Scored {len(channels)} channel{'s' if len(channels) != 1 else ''} (every one in scores.csv)"
    if not notes.channels_left_out:
        log.info("%s; none left out", scored)
        return
    why: dict[str, list[str]] = {}
    for channel, reason in notes.channels_left_out.items():
        why.setdefault(reason, []).append(channel)
    log.warning(
        "%s; left out: %s",
        scored,
        "; ".join(f"{', '.join(names)} ({reason})" for reason, names in why.items()),
    )


def _say_nonfinite_members(
    ensemble: EnsembleRollout, file: ForecastFile, grid: ScoredGrid, notes: Notes
) -> None:
    """A warning when members of an ensemble file held NaN or infinite values: which, from which lead; the
    ensemble's scores (its mean's, the CRPS, the spread) there are NaN, the first member's alone as said above."""
    flagged, first_lead = ensemble.members.nonfinite_members()
    if not flagged:
        return
    numbers = [int(file.members[at]) for at in flagged] if file.members is not None else flagged
    shown = ", ".join(map(str, numbers[:10])) + (
        f" and {len(numbers) - 10} more" if len(numbers) > 10 else ""
    )
    notes.warn(
        f"The ensemble {file.path}: {'members' if len(numbers) > 1 else 'the member'} numbered {shown} (of its "
        f"{file.member_count}) {'hold' if len(numbers) > 1 else 'holds'} NaN or infinite values from lead "
        f"{first_lead * grid.step_hours:g} h on: the "
        "ensemble's scores (ensemble mean, CRPS, spread, rank histograms) there are NaN (null in scores.json; "
        "ensemble.nonfinite_members lists them)"
    )


def _say_partial_acc(rollout: Rollout, grid: ScoredGrid, notes: Notes) -> None:
    """A warning where an ACC is the mean of fewer initial times than were scored: those at which the forecast or
    the truth has no anomaly at all (equals the climatology), where the correlation is undefined."""
    for forecaster, sums in rollout.scores.items():
        acc = sums.acc()
        if acc is None or forecaster == CLIMATOLOGY:
            continue
        partial = (sums.acc_count > 0) & (sums.acc_count < sums.count[:, None]) & np.isfinite(acc)
        for index, c in zip(*np.nonzero(partial), strict=True):
            notes.warn(
                f"The ACC of {forecaster} in {grid.channel_names[c]} at lead {index * grid.step_hours:g} h is the "
                f"mean of {int(sums.acc_count[index, c])} of the {int(sums.count[index])} initial times: at the "
                "others the forecast or the truth equals the climatology, and the correlation is undefined"
            )


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


def _identity(
    named: list[NamedForecast],
    files: list[ForecastFile],
    store: TruthStore,
    truth: str,
    climatology: Climatology | None,
    lined: LinedUp,
    labels: list[str],
    inputs: ScoreInputs,
    dtype: np.dtype,
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
            "dtype": str(file.dtype),
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
        "options": {
            "channels": list(inputs.channels) if inputs.channels is not None else None,
            "times": inputs.times.text if inputs.times is not None else None,
        },
        "dtype": str(dtype),
        "channels_left_out": store.lacking,
        "climatology": climatology.description if climatology is not None else None,
        "persistence": "the truth at each initial time"
        if lined.persistence
        else "not scored: the truth lacks some of the initial times",
        "common": f"scored on the {len(lined.times)} initial times and {len(lined.leads)} leads all "
        f"{len(named)} forecast{'s' if len(named) > 1 else ''} have, whose valid times the truth holds at every "
        f"lead and where it has no missing chunk nor NaN or infinite value ({lined.left_out_times} common "
        "initial times left out for that)",
        "initial_times_left_out": lined.left_out_times,
        "truth_unusable": {str(time.astype("datetime64[m]")): why for time, why in lined.unusable.items()},
        "output_dir": str(inputs.directory),
        "dlscale_version": __version__,
        "torch_version": str(torch.__version__),
    }
