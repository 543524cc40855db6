"""What ``dlscale forecast`` reports: the scores document, its CSV, the headline table and the figures.

``forecast/<split>-<checkpoint>/`` holds ``scores.json`` (strict JSON: NaN is ``null``), ``scores.csv`` (one row per
forecaster, channel and lead), ``skill_vs_lead.png`` (RMSE and ACC against lead time, with both baselines),
``rollout_maps.png`` (one initial time at a few leads: truth, forecast, error), ``bias.png`` and ``spectra.png``
(the bias against lead, and the zonal energy spectra at mid-latitudes: :mod:`dlscale.report.forecast_figures`;
the spectra in ``scores.json``: :mod:`dlscale.report.forecast_spectra`), and ``forecast.nc`` or
``forecast.zarr`` when asked (:mod:`dlscale.report.forecast_files`). The headline table is WeatherBench2's
(z500, t850, t2m and u10 at 1, 3, 5, 7 and 10 days) where the data has those channels and the rollout those
leads; :mod:`dlscale.report.forecast_selection` says what the table, skill figure and maps show otherwise.

Units: RMSE in each channel's physical unit (the trajectories' ``units``; labelled by it), ACC a fraction (1:
perfect), in the log, the files and the figures alike.
"""

from __future__ import annotations

import csv
import io
import logging
import textwrap
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from dlscale.data.trajectories import Trajectories
from dlscale.report.ensemble_report import (
    ENSEMBLE_COLUMNS,
    ensemble_cells,
    ensemble_entry,
    ensemble_lines,
    nonfinite_members_warning,
    rank_histogram_lines,
)
from dlscale.report.forecast_figures import forecaster_styles, origin_text
from dlscale.report.forecast_selection import headline_channels, lead_text, report_leads
from dlscale.report.forecast_spectra import SPECTRA_CONVENTION, spectra_entry
from dlscale.scoring.rollout import CLIMATOLOGY, Rollout, RolloutMaps

log = logging.getLogger("dlscale.train")

SCORES_JSON = "scores.json"
SCORES_CSV = "scores.csv"
SKILL_FIGURE = "skill_vs_lead.png"
MAPS_FIGURE = "rollout_maps.png"
HEADLINE_DAYS = (1, 3, 5, 7, 10)  # the table's day marks, for a rollout that reaches two of them
MAP_DAYS = (1, 3, 5, 10)  # the maps' columns, likewise
CONVENTIONS = {
    "rmse": "latitude-weighted (cos(latitude), averaging 1 over the rows) mean squared error over the grid per "
    "initial time; the square root after the mean over initial times (WeatherBench2)",
    "bias": "latitude-weighted mean over the grid of forecast minus truth per initial time, then the mean over "
    "initial times (WeatherBench2's Bias; positive: the forecast runs high)",
    "acc": "weighted, uncentred correlation of forecast and truth anomalies against the climatology per initial "
    "time, then the mean over initial times; undefined (null) for the climatology itself. The climatology is "
    "the one 'climatology' names: by day of year and hour of day at each valid time (WeatherBench2's), or one "
    "mean field for every time (time_mean)",
    "spectra": SPECTRA_CONVENTION,
    "units": "the data's physical units (the model's output de-normalized with the training statistics); ACC "
    "a fraction (1: perfect)",
}


def forecast_document(
    rollout: Rollout, trajectories: Trajectories, identity: dict[str, Any], initial_times: list[str]
) -> dict[str, Any]:
    """``scores.json``: ``identity``, the leads and channels, every forecaster's RMSE (and ACC) per channel and
    lead, the headline channels and table, throughput and the conventions."""
    names, step_hours = list(trajectories.channel_names), trajectories.step_hours
    headline = headline_channels(trajectories)
    scores: dict[str, Any] = {}
    for forecaster, sums in rollout.scores.items():
        rmse, bias, acc = sums.rmse(), sums.bias(), sums.acc()
        scores[forecaster] = {
            "rmse": {name: rmse[:, c].tolist() for c, name in enumerate(names)},
            "bias": {name: bias[:, c].tolist() for c, name in enumerate(names)},
            "acc": None if acc is None else {name: acc[:, c].tolist() for c, name in enumerate(names)},
        }
    document = {
        **identity,
        "initial_times": initial_times,
        "initial_time_count": len(initial_times),
        "step_hours": step_hours,
        "lead_hours": [lead * step_hours for lead in range(rollout.steps + 1)],
        "channels": names,
        "units": dict(zip(names, trajectories.units, strict=True)),
        "forecasters": list(rollout.scores),
        "scores": scores,
        "headline_channels": list(headline.names),
        "headline_note": headline.note,
        "headline": headline_rows(scores, headline.names, step_hours, rollout.steps),
        "nonfinite_from_lead_hours": None
        if rollout.first_nonfinite_lead is None
        else rollout.first_nonfinite_lead * step_hours,
        "throughput": {
            "forecast_steps": rollout.forecast_steps,
            "model_seconds": rollout.model_seconds,
            "seconds": rollout.seconds,
            "forecast_steps_per_second": rollout.forecast_steps / rollout.model_seconds
            if rollout.model_seconds > 0
            else None,
            "rollout_days_per_second": rollout.forecast_steps * step_hours / 24 / rollout.seconds
            if rollout.seconds > 0
            else None,
        },
        "spectra": spectra_entry(
            rollout.spectra,
            names,
            trajectories.units,
            step_hours,
            report_leads(HEADLINE_DAYS, step_hours, rollout.steps),
        ),
        "conventions": CONVENTIONS,
    }
    ensemble = ensemble_entry(rollout.ensemble, names, step_hours, rollout.steps)
    if ensemble is not None:
        document["ensemble"] = ensemble
    return document


def headline_rows(
    scores: dict[str, Any], names: Sequence[str], step_hours: float, steps: int
) -> list[dict[str, Any]]:
    """One row per channel of ``names`` and lead the table shows (:func:`report_leads` of the headline days):
    each forecaster's RMSE and ACC."""
    rows = []
    for name in names:
        for lead in report_leads(HEADLINE_DAYS, step_hours, steps):
            hours = lead * step_hours
            row: dict[str, Any] = {"channel": name, "lead_days": hours / 24, "lead_hours": hours}
            for forecaster, entry in scores.items():
                row[f"{forecaster}_rmse"] = entry["rmse"][name][lead]
                row[f"{forecaster}_acc"] = None if entry["acc"] is None else entry["acc"][name][lead]
            rows.append(row)
    return rows


def scores_csv(document: dict[str, Any]) -> str:
    """``forecaster,channel,lead_hours,rmse,acc,bias,unit,climatology`` rows, every lead of every channel (the
    climatology column: what the ACC and the climatology forecaster were scored against,
    :func:`climatology_label`); an ensemble's has ``crps,spread,spread_skill`` after them
    (:mod:`dlscale.report.ensemble_report`)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    extra = ENSEMBLE_COLUMNS if document.get("ensemble") is not None else ()
    writer.writerow(
        ("forecaster", "channel", "lead_hours", "rmse", "acc", "bias", "unit", "climatology", *extra)
    )
    reference = climatology_label(document.get("climatology"))
    for forecaster, entry in document["scores"].items():
        for name in document["channels"]:
            accs = entry["acc"][name] if entry["acc"] is not None else [None] * len(document["lead_hours"])
            columns = zip(document["lead_hours"], entry["rmse"][name], accs, entry["bias"][name], strict=True)
            for lead, (hours, rmse, acc, bias) in enumerate(columns):
                writer.writerow(
                    (
                        forecaster,
                        name,
                        repr(float(hours)),
                        _cell(rmse),
                        _cell(acc),
                        _cell(bias),
                        document["units"][name],
                        reference,
                        *(_cell(value) for value in ensemble_cells(document, forecaster, name, lead)),
                    )
                )
    return out.getvalue()


def climatology_label(description: dict[str, Any] | None) -> str:
    """What the ACC was scored against, in a few words: ``by day of year and hour, 1990-2019, 61-day window``,
    ``time mean`` or ``none``."""
    if description is None:
        return "none"
    if description.get("kind") != "day_of_year_and_hour":
        return "time mean"
    years = description.get("years")
    label = "by day of year and hour"
    if years:
        label += f", {years[0]}-{years[1]}" if years[0] != years[1] else f", {years[0]}"
    if description.get("window_days"):
        label += f", {description['window_days']}-day window"
    return label


def _cell(value: float | None) -> str:
    return "" if value is None or not np.isfinite(value) else repr(float(value))


def headline_lines(document: dict[str, Any]) -> list[str]:
    """The headline table as aligned text lines: each forecaster's RMSE in the channel's unit, then its ACC."""
    rows = document["headline"]
    if not rows:
        return ["(no lead to show: the rollout has no step)"]
    forecasters = list(document["forecasters"])  # the model (or the forecasts compared), then the baselines
    correlated = [f for f in forecasters if f != CLIMATOLOGY and rows[0].get(f"{f}_acc") is not None]
    width = max(len(f) for f in forecasters) + 2
    channel = max(8, *(len(row["channel"]) + 1 for row in rows))
    header = f"{'':<{channel}}{'':>5}  {'':<9}" + f"{'RMSE':^{width * len(forecasters)}}"
    header += f"{'ACC':^{width * len(correlated)}}" if correlated else ""
    names = f"{'channel':<{channel}}{'lead':>5}  {'unit':<9}" + "".join(f"{f:>{width}}" for f in forecasters)
    names += "".join(f"{f:>{width}}" for f in correlated)
    lines = [header.rstrip(), names]
    for row in rows:
        unit = document["units"].get(row["channel"], "")
        line = f"{row['channel']:<{channel}}{lead_text(row['lead_hours']):>5}  {unit:<9}"
        line += "".join(f"{_number(row[f + '_rmse']):>{width}}" for f in forecasters)
        line += "".join(f"{_number(row[f + '_acc'], 3):>{width}}" for f in correlated)
        lines.append(line)
    return lines


def _number(value: float | None, digits: int = 4) -> str:
    return "-" if value is None or not np.isfinite(value) else f"{value:.{digits}g}"


def skill_figure(document: dict[str, Any]) -> Figure:
    """RMSE (in each channel's unit) and ACC (a fraction) against lead time for the headline channels, each
    forecaster a line; leads in days, or in hours for a rollout shorter than two days."""
    names = document["headline_channels"]
    has_acc = any(entry["acc"] is not None for entry in document["scores"].values())
    rows = 2 if has_acc else 1
    figure = Figure(figsize=(max(3.6 * len(names), 6.0), 3.0 * rows + 0.6), layout="constrained")
    axes = np.atleast_2d(figure.subplots(rows, len(names), squeeze=False))
    in_hours = document["lead_hours"][-1] < 48
    leads = np.asarray(document["lead_hours"]) / (1 if in_hours else 24)
    marker = "o" if len(leads) <= 13 else None  # a short rollout's few leads stay visible as points
    styles = forecaster_styles(list(document["scores"]))
    for column, name in enumerate(names):
        unit = document["units"].get(name, "")
        for forecaster, entry in document["scores"].items():
            color, style = styles[forecaster]
            line = {"color": color, "label": forecaster, "marker": marker, "markersize": 3}
            axes[0, column].plot(leads, _finite(entry["rmse"][name]), style, **line)
            if has_acc and entry["acc"] is not None and forecaster != CLIMATOLOGY:
                axes[1, column].plot(leads, _finite(entry["acc"][name]), style, **line)
        axes[0, column].set_title(name)
        axes[0, column].set_ylabel(f"RMSE [{unit}]" if unit else "RMSE")
        axes[rows - 1, column].set_xlabel(f"lead time [{'hours' if in_hours else 'days'}]")
        if has_acc:
            axes[1, column].set_ylabel("ACC (1: perfect)")
            correlations = [
                _finite(entry["acc"][name])
                for entry in document["scores"].values()
                if entry["acc"] is not None
            ]
            lowest = float(np.nanmin(np.concatenate(correlations)))
            axes[1, column].set_ylim(min(0.0, lowest) - 0.05, 1.05)
        for row in range(rows):
            axes[row, column].grid(alpha=0.3)
    axes[0, 0].legend(loc="upper left", fontsize="small")
    title = origin_text(document)
    if has_acc:
        title += f"; ACC against the climatology {climatology_label(document.get('climatology'))}"
    if document.get("headline_note"):
        title += f"\n{document['headline_note']}"
    figure.suptitle(title)
    return figure


def _finite(values: Sequence[float | None]) -> np.ndarray:
    return np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)


MAP_PANEL_INCHES = (3.2, 1.9)  # one map's (width, height): a 2:1 longitude-latitude grid at a readable size
MAP_MARGIN_INCHES = (1.6, 1.3)  # the latitude label and colour bars; the title and longitude label


def maps_figure(maps: RolloutMaps, trajectories: Trajectories, channel: str, step_hours: float) -> Figure:
    """Truth, forecast and error of ``channel`` at each kept lead of one initial time: a column per lead (one
    or many), the title wrapped to the figure's width.

    Truth and forecast share the truth's colour range, so a forecast that drifts beyond it saturates: the
    colour bar's pointed ends say so (``extend``) where it does. The error row has one scale for every lead,
    symmetric about 0 and as wide as the largest error, so the row shows the error growing with lead (limits
    per panel would make every lead look alike) and never saturates."""
    c = list(trajectories.channel_names).index(channel)
    unit = trajectories.units[c]
    columns = len(maps.leads)
    width = max(MAP_PANEL_INCHES[0] * columns, 4.0) + MAP_MARGIN_INCHES[0]
    figure = Figure(figsize=(width, 3 * MAP_PANEL_INCHES[1] + MAP_MARGIN_INCHES[1]), layout="constrained")
    axes = np.atleast_2d(figure.subplots(3, columns, squeeze=False))
    truths = np.stack([truth[c] for truth in maps.truths])
    forecasts = np.stack([forecast[c] for forecast in maps.forecasts])
    errors = forecasts - truths
    low, high = _finite_range(truths)
    bound = max(abs(value) for value in _finite_range(errors)) or 1.0
    extend = _beyond(forecasts, low, high)
    extent = _extent(trajectories.latitudes, trajectories.longitudes)
    value_label = f"{channel} [{unit}]" if unit else channel
    bar_labels = {
        "truth": value_label,
        "forecast": value_label,
        "error": f"error [{unit}]" if unit else "error",
    }
    for column, lead in enumerate(maps.leads):
        when = lead_text(lead * step_hours)
        for row, (field, kind) in enumerate(((truths, "truth"), (forecasts, "forecast"), (errors, "error"))):
            axis = axes[row, column]
            limits = (
                {"vmin": -bound, "vmax": bound, "cmap": "RdBu_r"}
                if kind == "error"
                else {"vmin": low, "vmax": high}
            )
            image = axis.imshow(
                field[column], extent=extent, aspect="auto", interpolation="nearest", **limits
            )
            axis.set_title(f"{kind}, +{when}", fontsize="small")
            axis.tick_params(labelsize="small")
            if extent is None:  # row and column numbers: whole ones
                axis.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
                axis.yaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
            if column == 0:
                axis.set_ylabel("latitude [deg]" if extent is not None else "row", fontsize="small")
            if row == 2:
                axis.set_xlabel("longitude [deg E]" if extent is not None else "column", fontsize="small")
            if column == columns - 1:
                bar = figure.colorbar(
                    image,
                    ax=axes[row, :],
                    extend=extend if kind == "forecast" else "neither",
                    label=bar_labels[kind],
                )
                bar.ax.tick_params(labelsize="small")
    title = f"{channel} from {maps.start.describe()}: truth, forecast and error by lead time"
    if extend != "neither":
        title += " (the forecast leaves the truth's colour range: pointed bar ends)"
    # About 0.6 em per character of the title's 12-point font: wrap to the figure's width.
    figure.suptitle("\n".join(textwrap.wrap(title, width=int(width * 72 / (0.6 * 12)))))
    return figure


def _finite_range(values: np.ndarray) -> tuple[float, float]:
    """(min, max) of the finite values; (0, 1) when there is none (a forecast that is NaN everywhere)."""
    finite = values[np.isfinite(values)]
    return (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)


def _beyond(values: np.ndarray, low: float, high: float) -> str:
    """matplotlib's colour bar ``extend`` for ``values`` on the scale ``low``..``high``: which ends they pass."""
    below, above = bool(np.any(values < low)), bool(np.any(values > high))  # NaN compares False: not counted
    return {(False, False): "neither", (True, False): "min", (False, True): "max"}.get((below, above), "both")


def _extent(latitudes: np.ndarray, longitudes: np.ndarray) -> tuple[float, float, float, float] | None:
    """matplotlib's ``extent`` in degrees, (west, east, last row's edge, first row's edge): the grid's first row
    is drawn at the top, so rows that run north to south show north up. None (row and column numbers) unless
    both axes have two or more coordinates in strict order (not so on a grid that is not on the Earth)."""
    if not (_monotonic(latitudes) and _monotonic(longitudes)):
        return None
    dlat = float(latitudes[1] - latitudes[0])  # signed: negative for rows that run north to south
    dlon = float(longitudes[1] - longitudes[0])
    return (
        float(longitudes[0]) - dlon / 2,
        float(longitudes[-1]) + dlon / 2,
        float(latitudes[-1]) + dlat / 2,
        float(latitudes[0]) - dlat / 2,
    )


def _monotonic(coordinates: np.ndarray) -> bool:
    steps = np.diff(np.asarray(coordinates, dtype=np.float64))
    return len(steps) > 0 and bool(np.all(steps > 0) or np.all(steps < 0))


def map_channel(headline: Sequence[str]) -> str:
    """The channel of the rollout maps: the first headline channel (z500, the field's favourite, for ERA5)."""
    return headline[0]


def log_forecast(document: dict[str, Any], written: Sequence[Any]) -> None:
    """The headline table, the throughput and where the files are."""
    log.info(
        "Forecast (%s split, %d initial times, leads up to %s, %s):",
        document["split"],
        document["initial_time_count"],
        lead_text(document["lead_hours"][-1]),
        document["checkpoint_name"],
    )
    for line in headline_lines(document):
        log.info("  %s", line)
    if document.get("climatology") is not None:
        # The mean field's ACC keeps the seasonal and daily cycles: said where the numbers are read.
        caveat = (
            "; not WeatherBench2's: this ACC is not comparable with published ones"
            if document["climatology"].get("kind") != "day_of_year_and_hour"
            else ""
        )
        log.info(
            "  (ACC and the climatology forecaster: the climatology %s%s)",
            climatology_label(document["climatology"]),
            caveat,
        )
    if document.get("headline_note"):
        log.info("  (the table shows %s)", document["headline_note"])
    ensemble = document.get("ensemble")
    if ensemble is not None:
        log.info("Ensemble of %d members (%s):", ensemble["members"], ensemble["perturbation"])
        for line in ensemble_lines(document):
            log.info("  %s", line)
        for line in rank_histogram_lines(document):
            log.info("  %s", line)
    if document["nonfinite_from_lead_hours"] is not None:
        log.warning(
            "The model's forecast holds NaN or infinite values from lead %g h on: its scores from there are NaN",
            document["nonfinite_from_lead_hours"],
        )
    members_warning = nonfinite_members_warning(document)
    if members_warning is not None:
        log.warning("%s", members_warning)
    rate = document["throughput"]["forecast_steps_per_second"]
    if rate is not None:
        log.info(
            "Throughput: %.1f forecast steps/s in the model (%d steps in %.1f s; %.1f s with reading and scoring)",
            rate,
            document["throughput"]["forecast_steps"],
            document["throughput"]["model_seconds"],
            document["throughput"]["seconds"],
        )
    if written:
        log.info("Outputs of this forecast:")
        for path in written:
            log.info("  %s", path)
