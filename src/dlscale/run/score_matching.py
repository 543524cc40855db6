"""What ``dlscale score`` can score of its forecasts against its truth, and what it says it leaves out: the
channels (``--channels``, else those every forecast and the truth hold), the grid (the truth's whole grid, as
sets), the initial times (``--times``, else those every forecast has whose valid times the truth holds at every
lead) and the leads, each found by value in each file (:class:`LinedUp`).

What is left out is said on the console and kept for the document (:class:`Notes`); without ``--channels`` or
``--times``, fewer than half of the first forecast's fields, or of a forecast's initial times, left to score is
refused in one line naming the option that scores them on purpose. The truth's reasons for a channel it lacks
are said in score's words, not the importer's (:func:`truth_lacks`). The scoring itself is
:mod:`dlscale.run.score`'s.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from dlscale.data.era5.file_dates import minute_text
from dlscale.data.era5.forecast_reading import ForecastFile
from dlscale.data.era5.grid_matching import coordinate_positions, grid_text, same_points
from dlscale.data.era5.importing.names import channel_request
from dlscale.data.era5.truth_reading import TruthStore, open_truth_source
from dlscale.errors import DataError, DlscaleError
from dlscale.report.forecast_selection import lead_text
from dlscale.run.score_inputs import NamedForecast, TimeChoice

log = logging.getLogger("dlscale.score")

MINUTE = np.timedelta64(1, "m")


class Notes:
    """What the console says beyond the scores (left out, read otherwise, non-finite), said at once and kept for
    the document's ``notes``."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        # channel -> why it is not scored (the truth lacks it, another forecast does), for the closing summary
        self.channels_left_out: dict[str, str] = {}

    def info(self, line: str | None) -> None:
        if line:
            log.info("%s", line)
            self.lines.append(line)

    def warn(self, line: str) -> None:
        log.warning("%s", line)
        self.lines.append(line)


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
    # initial time -> why the truth cannot score it (a missing chunk, NaN or inf at one of its valid times)
    unusable: dict[np.datetime64, str]


def forecast_channels(
    named: list[NamedForecast], files: list[ForecastFile], chosen: tuple[str, ...] | None, notes: Notes
) -> list[str]:
    """The channels to look for in the truth: ``chosen`` (``--channels``), each in every forecast; else the first
    forecast's channels that every other forecast has too (those left out said)."""
    if chosen is not None:
        for forecast, file in zip(named, files, strict=True):
            lacking = [name for name in chosen if name not in file.channel_names]
            if lacking:
                raise DataError(
                    f"--channels {','.join(chosen)}: {forecast.path} has no channel {lacking[0]} (its channels: "
                    f"{', '.join(file.channel_names)}); name channels every forecast has"
                )
        for forecast, file in zip(named, files, strict=True):
            others = [*(name for name in file.channel_names if name not in chosen), *file.unnamed]
            if others:
                notes.info(f"{forecast.path}: not scored, as --channels leaves them out: {', '.join(others)}")
        return list(chosen)
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
    for forecast, file in zip(named, files, strict=True):
        others = [name for name in file.channel_names if name not in channels]
        notes.channels_left_out.update((name, "not every forecast compared has it") for name in others)
        if others:
            notes.warn(
                f"{forecast.path}: its channels {', '.join(others)} are left out: not every forecast compared "
                "has them"
            )
    return channels


def open_truth(
    truth: str, channels: list[str], named: list[NamedForecast], files: list[ForecastFile]
) -> TruthStore:
    """The truth store with those of ``channels`` it holds, on the forecasts' grid, which must be its whole grid
    (WeatherBench2 scores a forecast on its truth's grid, never on a crop or a subsample of it)."""
    try:
        store = TruthStore.open(truth, channels, files[0].latitudes, files[0].longitudes)
    except DataError:
        _check_truth_grid(truth, named, files)  # a grid the truth lacks is said as the grid it is
        raise
    try:
        _check_grids(truth, store.source.latitude, store.source.longitude, named, files)
    except BaseException:
        store.close()
        raise
    return store


def _check_truth_grid(truth: str, named: list[NamedForecast], files: list[ForecastFile]) -> None:
    """When the truth could not be opened on the forecast's grid: whether that grid is the reason (this opens
    the store's coordinates once more; nothing when it cannot)."""
    try:
        source = open_truth_source(truth)
    except DlscaleError:
        return
    try:
        _check_grids(truth, source.latitude, source.longitude, named, files)
    finally:
        source.close()


def _check_grids(
    truth: str,
    latitudes: np.ndarray,
    longitudes: np.ndarray,
    named: list[NamedForecast],
    files: list[ForecastFile],
) -> None:
    """Every forecast's latitudes and longitudes are the truth's, as sets (any order, longitudes modulo 360)."""
    for forecast, file in zip(named, files, strict=True):
        if same_points(latitudes, file.latitudes, wrap=False) and same_points(
            longitudes, file.longitudes, wrap=True
        ):
            continue
        raise DataError(
            f"{forecast.path}: its grid, {grid_text(file.latitudes, file.longitudes)}, is not the truth's, "
            f"{grid_text(latitudes, longitudes)} ({truth}): a forecast is scored on its truth's whole grid, as "
            "WeatherBench2 scores it, never on a crop, a subsample or a shift of it; score it against a truth on "
            "the forecast's grid (WeatherBench2 publishes ERA5 on grids of 64x32, 240x121 and 1440x721 "
            "longitudes x latitudes)"
        )


def check_truth_channels(
    forecast: NamedForecast,
    file: ForecastFile,
    store: TruthStore,
    truth: str,
    chosen: tuple[str, ...] | None,
    notes: Notes,
) -> None:
    """Say which channels the truth cannot give and why; refuse a ``--channels`` one, or, without
    ``--channels``, fewer than half of the forecast's fields left."""
    for note in store.source.notes:
        notes.info(f"The truth {note}")
    variables = store.source.levels_of_variables()
    reasons = {name: truth_lacks(name, variables, message) for name, message in store.lacking.items()}
    store.lacking = reasons  # for scores.json's channels_left_out, in score's words
    if chosen is not None and reasons:
        name = next(iter(reasons))
        raise DataError(
            f"--channels {','.join(chosen)}: the truth {truth} cannot give {name}: {reasons[name]}"
        )
    fields = len(file.channels) + len(file.unnamed)
    scored = len(store.channels)
    if chosen is None and 2 * scored < fields:
        raise DataError(
            f"{forecast.path}: only {scored} of its {fields} fields can be scored ({', '.join(store.channel_names)}"
            f"; left out: {', '.join([*reasons, *file.unnamed])}), less than half; score these on purpose with "
            f"--channels {','.join(store.channel_names)}, or give a truth that holds the others"
        )
    notes.channels_left_out.update((name, "the truth lacks it") for name in reasons)
    if reasons:
        notes.warn(
            f"Left out, as the truth {truth} lacks them: "
            + "; ".join(f"{name} ({why})" for name, why in reasons.items())
        )


def truth_lacks(name: str, variables: dict[str, list[int] | None], message: str) -> str:
    """Why the truth cannot give channel ``name``, for score's user (``message``: the importer's words, which
    name its own options, kept only for a reason not recognised here)."""
    request = channel_request(name)
    found = next((candidate for candidate in request.candidates if candidate in variables), None)
    if found is None:
        looked_for = " or ".join(repr(candidate) for candidate in request.candidates)
        return f"it has no variable {looked_for}"
    levels = variables[found]
    if request.level_hpa is None and levels is not None:
        return f"its {found!r} has pressure levels ({', '.join(map(str, levels))}), the forecast's none"
    if request.level_hpa is not None and levels is None:
        return f"its {found!r} has no pressure levels, the forecast's has {request.level_hpa} hPa"
    if request.level_hpa is not None and levels is not None and request.level_hpa not in levels:
        return f"its {found!r} has no level {request.level_hpa} hPa (it has {', '.join(map(str, levels))})"
    return message.split("; ")[0]


def line_up(
    named: list[NamedForecast],
    files: list[ForecastFile],
    store: TruthStore,
    chosen: TimeChoice | None,
    notes: Notes,
) -> LinedUp:
    """The initial times (``chosen``: those of ``--times``), leads and grid positions the forecasts share, kept
    where the truth can score them; each looked up by value in each file. What is left out is said; without
    ``--times``, fewer than half of a forecast's initial times left is refused."""
    candidates = []
    for forecast, file in zip(named, files, strict=True):
        times = file.times
        if chosen is not None:
            times = times[chosen.contains(times)]
            if not len(times):
                raise DataError(
                    f"--times {chosen.text}: {forecast.path} has no initial time in it (its {len(file.times)} run "
                    f"from {minute_text(file.times.min())} to {minute_text(file.times.max())})"
                )
        candidates.append(times)
    times = candidates[0]
    for other in candidates[1:]:
        times = np.intersect1d(times, other)
    times = np.unique(times)  # sorted: the files may keep theirs in any order
    leads = np.unique(files[0].leads[files[0].leads >= np.timedelta64(0, "ns")])
    for file in files[1:]:
        leads = np.intersect1d(leads, file.leads)
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
            f"no common valid time: {which} {len(times)} initial times ({minute_text(times[0])} .. "
            f"{minute_text(times[-1])}) with leads up to {lead_text(float(leads[-1] / MINUTE) / 60)}, and "
            f"{store.source.description} holds none of their valid times at every lead (it holds "
            f"{store.holdings()}); give --truth a store or data root that holds the forecast's dates (a forecast of "
            "a data root's test split is scored against that data root)"
        )
    kept = times[covered]
    unusable = _unusable_truth(kept, leads, store)
    if len(unusable) == len(kept):
        raise DataError(
            f"{store.source.description}: its truth cannot score any of the {len(kept)} initial times: "
            + _unusable_text(unusable)
        )
    kept = kept[~np.isin(kept, np.array(list(unusable), dtype="datetime64[ns]"))]
    _say_left_out_leads(named, files, leads, notes)
    for forecast, file, candidate in zip(named, files, candidates, strict=True):
        _say_left_out_times(forecast, file, candidate, times, kept, store, chosen, notes, unusable)
    grid = files[0].latitudes, files[0].longitudes
    rows, columns = [], []
    for forecast, file in zip(named, files, strict=True):
        rows.append(_grid_positions(forecast, file.latitudes, grid[0], "latitude", False, named[0].label))
        columns.append(_grid_positions(forecast, file.longitudes, grid[1], "longitude", True, named[0].label))
    return LinedUp(
        times=kept,
        leads=leads,
        step=step,
        time_at=[_positions_of(file.times, kept) for file in files],
        lead_at=[_positions_of(file.leads, leads) for file in files],
        rows=rows,
        columns=columns,
        left_out_times=int((~covered).sum()) + len(unusable),
        persistence=bool(np.isin(kept, store.times).all()),
        unusable=unusable,
    )


def _unusable_truth(kept: np.ndarray, leads: np.ndarray, store: TruthStore) -> dict[np.datetime64, str]:
    """initial time -> why the truth cannot score it: a valid time at some lead (or the initial state itself,
    which persistence scores, where the store has it) with a missing chunk or a NaN or infinite value. Found by
    one scan before scoring (:meth:`TruthStore.unusable_times`), so that such an initial time is left out of
    every lead and every score averages over the same initial times, as the document says."""
    valid = (kept[:, None] + leads[None, :]).ravel()
    initial = kept[np.isin(kept, store.times)]
    every = np.concatenate([valid, initial])
    log.info(
        "Checking the truth's %d valid times for missing chunks and NaN or infinite values (one read of each)",
        len(np.unique(every)),
    )
    found = store.unusable_times(every)
    if not found:
        return {}
    bad = {np.datetime64(time, "ns"): why for time, why in found.items()}
    unusable: dict[np.datetime64, str] = {}
    for time in kept:
        for lead in (np.timedelta64(0, "ns"), *leads):
            why = bad.get(time + lead)
            if why is not None:
                at = "its initial state" if lead == np.timedelta64(0, "ns") else f"lead {_lead_hours(lead)}"
                unusable[time] = f"{minute_text(time)} (at {at}, {minute_text(time + lead)}: {why})"
                break
    return unusable


def _lead_hours(lead: np.timedelta64) -> str:
    return lead_text(float(lead / MINUTE) / 60)


def _unusable_text(unusable: dict[np.datetime64, str], shown: int = 3) -> str:
    """The first few initial times left out for the truth's missing or non-finite values, and how many more."""
    reasons = list(unusable.values())
    more = f"; and {len(reasons) - shown} more" if len(reasons) > shown else ""
    return "; ".join(reasons[:shown]) + more


def _positions_of(axis: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The position in ``axis`` (unique values, in any order) of each of ``values`` (each one of them)."""
    order = np.argsort(axis, kind="stable")
    return order[np.searchsorted(axis[order], values)]


def _say_left_out_leads(
    named: list[NamedForecast], files: list[ForecastFile], leads: np.ndarray, notes: Notes
) -> None:
    """Say which of each forecast's leads are not scored: negative ones, and those another forecast lacks."""
    for forecast, file in zip(named, files, strict=True):
        others = np.setdiff1d(file.leads, leads)
        if not len(others):
            continue
        negative = int((others < np.timedelta64(0, "ns")).sum())
        shown = ", ".join(
            lead_text(float(lead / MINUTE) / 60) for lead in others[others >= np.timedelta64(0, "ns")][:6]
        )
        reasons = [
            f"{negative} negative" if negative else "",
            f"{shown} (not every forecast compared has them)" if shown else "",
        ]
        notes.warn(f"{forecast.path}: leads left out: {'; '.join(r for r in reasons if r)}")


def _say_left_out_times(
    forecast: NamedForecast,
    file: ForecastFile,
    candidate: np.ndarray,
    common: np.ndarray,
    kept: np.ndarray,
    store: TruthStore,
    chosen: TimeChoice | None,
    notes: Notes,
    unusable: dict[np.datetime64, str],
) -> None:
    """Say how many of the forecast's initial times are left out and why; refuse fewer than half of them
    scored, unless ``--times`` chose them."""
    outside = len(file.times) - len(candidate)
    not_shared = len(candidate) - len(np.intersect1d(candidate, common))
    uncovered = len(common) - len(kept) - len(unusable)
    reasons = []
    if outside:
        reasons.append(f"{outside} outside --times {chosen.text if chosen else ''}")
    if not_shared:
        reasons.append(f"{not_shared} not in every forecast compared")
    if uncovered:
        reasons.append(f"{uncovered} whose valid times the truth ({store.holdings()}) lacks at some lead")
    if unusable:
        reasons.append(
            f"{len(unusable)} whose truth has a missing chunk or NaN or infinite values: {_unusable_text(unusable)}"
        )
    if not reasons:
        return
    if chosen is None and 2 * len(kept) < len(file.times):
        raise DataError(
            f"{forecast.path}: only {len(kept)} of its {len(file.times)} initial times can be scored (left out: "
            f"{'; '.join(reasons)}), less than half; score those on purpose with --times "
            f"{minute_text(kept[0]).replace(':00', '')}..{minute_text(kept[-1]).replace(':00', '')}, or give a truth "
            "that holds the others' valid times"
        )
    notes.warn(
        f"{forecast.path}: {len(kept)} of its {len(file.times)} initial times scored "
        f"({minute_text(kept[0])} .. {minute_text(kept[-1])}); left out: {'; '.join(reasons)}"
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
