"""What ``dlscale forecast`` reports: the scores document, its CSV, the headline table and the figures.

``forecast/<split>-<checkpoint>/`` holds ``scores.json`` (strict JSON: NaN is ``null``), ``scores.csv`` (one row per
forecaster, channel and lead), ``skill_vs_lead.png`` (RMSE and ACC against lead time, with both baselines) and
``rollout_maps.png`` (one initial time at a few leads: truth, forecast, error), and ``forecast.nc`` or
``forecast.zarr`` when asked (:mod:`dlscale.report.forecast_files`). The headline table is WeatherBench2's: z500,
t850, t2m and u10 at 1, 3, 5, 7 and 10 days, as far as the rollout reaches.
"""

from __future__ import annotations

import csv
import io
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from dlscale.data.trajectories import Trajectories
from dlscale.training.rollout import CLIMATOLOGY, MODEL, PERSISTENCE, Rollout, RolloutMaps

log = logging.getLogger("dlscale.train")

SCORES_JSON = "scores.json"
SCORES_CSV = "scores.csv"
SKILL_FIGURE = "skill_vs_lead.png"
MAPS_FIGURE = "rollout_maps.png"
HEADLINE_CHANNELS = ("z500", "t850", "t2m", "u10")
HEADLINE_DAYS = (1, 3, 5, 7, 10)
MAP_DAYS = (1, 3, 5, 10)
CONVENTIONS = {
    "rmse": "latitude-weighted (cos(latitude), averaging 1 over the rows) mean squared error over the grid per "
    "initial time; the square root after the mean over initial times (WeatherBench2)",
    "acc": "weighted, uncentred correlation of forecast and truth anomalies against the climatology per initial "
    "time, then the mean over initial times; undefined (null) for the climatology itself",
    "units": "the data's physical units (the model's output de-normalized with the training statistics)",
}


def lead_indices_at_days(days: Sequence[float], step_hours: float, steps: int) -> list[tuple[float, int]]:
    """(day, lead index) for each of ``days`` that is a whole number of model steps within the rollout."""
    found = []
    for day in days:
        index = day * 24 / step_hours
        if abs(index - round(index)) < 1e-9 and 1 <= round(index) <= steps:
            found.append((day, int(round(index))))
    return found


def forecast_document(
    rollout: Rollout, trajectories: Trajectories, identity: dict[str, Any], initial_times: list[str]
) -> dict[str, Any]:
    """``scores.json``: ``identity``, the leads and channels, every forecaster's RMSE (and ACC) per channel and
    lead, the headline table, throughput and the conventions."""
    names, step_hours = list(trajectories.channel_names), trajectories.step_hours
    scores: dict[str, Any] = {}
    for forecaster, sums in rollout.scores.items():
        rmse, acc = sums.rmse(), sums.acc()
        scores[forecaster] = {
            "rmse": {name: rmse[:, c].tolist() for c, name in enumerate(names)},
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
        "headline": headline_rows(scores, names, step_hours, rollout.steps),
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
        "conventions": CONVENTIONS,
    }
    return document


def headline_rows(
    scores: dict[str, Any], names: Sequence[str], step_hours: float, steps: int
) -> list[dict[str, Any]]:
    """One row per headline channel the data has and headline day the rollout reaches: each forecaster's RMSE
    and ACC."""
    rows = []
    for name in (channel for channel in HEADLINE_CHANNELS if channel in names):
        for day, lead in lead_indices_at_days(HEADLINE_DAYS, step_hours, steps):
            row: dict[str, Any] = {"channel": name, "lead_days": day}
            for forecaster, entry in scores.items():
                row[f"{forecaster}_rmse"] = entry["rmse"][name][lead]
                row[f"{forecaster}_acc"] = None if entry["acc"] is None else entry["acc"][name][lead]
            rows.append(row)
    return rows


def scores_csv(document: dict[str, Any]) -> str:
    """``forecaster,channel,lead_hours,rmse,acc,unit`` rows, every lead of every channel."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(("forecaster", "channel", "lead_hours", "rmse", "acc", "unit"))
    for forecaster, entry in document["scores"].items():
        for name in document["channels"]:
            accs = entry["acc"][name] if entry["acc"] is not None else [None] * len(document["lead_hours"])
            for hours, rmse, acc in zip(document["lead_hours"], entry["rmse"][name], accs, strict=True):
                writer.writerow(
                    (forecaster, name, repr(float(hours)), _cell(rmse), _cell(acc), document["units"][name])
                )
    return out.getvalue()


def _cell(value: float | None) -> str:
    return "" if value is None or not np.isfinite(value) else repr(float(value))


def headline_lines(document: dict[str, Any]) -> list[str]:
    """The headline table as aligned text lines: each forecaster's RMSE in the channel's unit, then its ACC."""
    rows = document["headline"]
    if not rows:
        return ["(no headline channel (z500, t850, t2m, u10) at 1, 3, 5, 7 or 10 days in this rollout)"]
    forecasters = [f for f in (MODEL, PERSISTENCE, CLIMATOLOGY) if f in document["forecasters"]]
    correlated = [f for f in forecasters if f != CLIMATOLOGY and rows[0].get(f"{f}_acc") is not None]
    width = max(len(f) for f in forecasters) + 2
    header = f"{'':<8}{'':>5}  {'':<9}" + f"{'RMSE':^{width * len(forecasters)}}"
    header += f"{'ACC':^{width * len(correlated)}}" if correlated else ""
    names = f"{'channel':<8}{'lead':>5}  {'unit':<9}" + "".join(f"{f:>{width}}" for f in forecasters)
    names += "".join(f"{f:>{width}}" for f in correlated)
    lines = [header.rstrip(), names]
    for row in rows:
        unit = document["units"].get(row["channel"], "")
        line = f"{row['channel']:<8}{row['lead_days']:>4g}d  {unit:<9}"
        line += "".join(f"{_number(row[f + '_rmse']):>{width}}" for f in forecasters)
        line += "".join(f"{_number(row[f + '_acc'], 3):>{width}}" for f in correlated)
        lines.append(line)
    return lines


def _number(value: float | None, digits: int = 4) -> str:
    return "-" if value is None or not np.isfinite(value) else f"{value:.{digits}g}"


def skill_figure(document: dict[str, Any]) -> Figure:
    """RMSE (and ACC) against lead time in days for the headline channels the data has (else the first four),
    each forecaster a line."""
    names = [name for name in HEADLINE_CHANNELS if name in document["channels"]] or document["channels"][:4]
    has_acc = any(entry["acc"] is not None for entry in document["scores"].values())
    rows = 2 if has_acc else 1
    figure = Figure(figsize=(3.6 * len(names), 3.0 * rows + 0.6), layout="constrained")
    axes = np.atleast_2d(figure.subplots(rows, len(names), squeeze=False))
    days = np.asarray(document["lead_hours"]) / 24
    styles = {
        MODEL: ("C0", "-", "model"),
        PERSISTENCE: ("C1", "--", "persistence"),
        CLIMATOLOGY: ("C2", ":", "climatology"),
    }
    for column, name in enumerate(names):
        unit = document["units"].get(name, "")
        for forecaster, entry in document["scores"].items():
            color, style, label = styles[forecaster]
            axes[0, column].plot(days, _finite(entry["rmse"][name]), style, color=color, label=label)
            if has_acc and entry["acc"] is not None and forecaster != CLIMATOLOGY:
                axes[1, column].plot(days, _finite(entry["acc"][name]), style, color=color, label=label)
        axes[0, column].set_title(name)
        axes[0, column].set_ylabel(f"RMSE [{unit}]" if unit else "RMSE")
        axes[rows - 1, column].set_xlabel("lead time [days]")
        if has_acc:
            axes[1, column].set_ylabel("ACC")
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
    count = document["initial_time_count"]
    figure.suptitle(
        f"{document['workload']}, {document['split']} split, {document['checkpoint_name']}: "
        f"{count} initial time{'s' if count != 1 else ''}"
    )
    return figure


def _finite(values: Sequence[float | None]) -> np.ndarray:
    return np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)


def maps_figure(maps: RolloutMaps, trajectories: Trajectories, channel: str, step_hours: float) -> Figure:
    """Truth, forecast and error of ``channel`` at each kept lead of one initial time."""
    c = list(trajectories.channel_names).index(channel)
    unit = trajectories.units[c]
    columns = len(maps.leads)
    figure = Figure(figsize=(3.4 * columns + 0.8, 6.6), layout="constrained")
    axes = np.atleast_2d(figure.subplots(3, columns, squeeze=False))
    truths = np.stack([truth[c] for truth in maps.truths])
    forecasts = np.stack([forecast[c] for forecast in maps.forecasts])
    errors = forecasts - truths
    low, high = float(np.nanmin(truths)), float(np.nanmax(truths))
    bound = float(np.nanmax(np.abs(errors))) or 1.0
    extent = _extent(trajectories.latitudes, trajectories.longitudes)
    for column, lead in enumerate(maps.leads):
        days = lead * step_hours / 24
        for row, (field, kind) in enumerate(((truths, "truth"), (forecasts, "forecast"), (errors, "error"))):
            axis = axes[row, column]
            limits = (
                {"vmin": -bound, "vmax": bound, "cmap": "RdBu_r"}
                if kind == "error"
                else {"vmin": low, "vmax": high}
            )
            image = axis.imshow(field[column], extent=extent, aspect="auto", **limits)
            axis.set_title(f"{kind}, +{days:g} d", fontsize="small")
            if column == 0:
                axis.set_ylabel("latitude [deg]")
            if row == 2:
                axis.set_xlabel("longitude [deg E]")
            if column == columns - 1:
                figure.colorbar(image, ax=axes[row, :], label=f"{channel} [{unit}]" if unit else channel)
    figure.suptitle(f"{channel} from {maps.start.describe()}: truth, forecast and error by lead time")
    return figure


def _extent(latitudes: np.ndarray, longitudes: np.ndarray) -> tuple[float, float, float, float]:
    """(west, east, south, north) pixel edges of a grid whose rows run north to south."""
    dlat = abs(float(latitudes[1] - latitudes[0])) if len(latitudes) > 1 else 1.0
    dlon = float(longitudes[1] - longitudes[0]) if len(longitudes) > 1 else 1.0
    return (
        float(longitudes[0]) - dlon / 2,
        float(longitudes[-1]) + dlon / 2,
        float(latitudes[-1]) - dlat / 2,
        float(latitudes[0]) + dlat / 2,
    )


def map_channel(names: Sequence[str]) -> str:
    """The channel of the rollout maps: z500 (the field's favourite), else the first headline channel, else the
    first channel."""
    for name in HEADLINE_CHANNELS:
        if name in names:
            return name
    return names[0]


def log_forecast(document: dict[str, Any], written: Sequence[Any]) -> None:
    """The headline table, the throughput and where the files are."""
    log.info(
        "Forecast (%s split, %d initial times, leads up to %g d, %s):",
        document["split"],
        document["initial_time_count"],
        document["lead_hours"][-1] / 24,
        document["checkpoint_name"],
    )
    for line in headline_lines(document):
        log.info("  %s", line)
    if document["nonfinite_from_lead_hours"] is not None:
        log.warning(
            "The model's forecast holds NaN or infinite values from lead %g h on: its scores from there are NaN",
            document["nonfinite_from_lead_hours"],
        )
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
