"""The forecast's figures beside the skill figure: the bias against lead time (``bias.png``) and the zonal
energy spectra at mid-latitudes (``spectra.png``), both drawn from ``scores.json``'s document alone, for the
headline channels, one panel each.

Built with ``matplotlib.figure.Figure`` (no pyplot), as :mod:`dlscale.report.figures`.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from dlscale.report.forecast_selection import lead_text
from dlscale.scoring.rollout import CLIMATOLOGY, MODEL, PERSISTENCE

BIAS_FIGURE = "bias.png"
SPECTRA_FIGURE = "spectra.png"
SPECTRA_DAYS = (1, 3, 5, 10)  # the spectra drawn, where the document has two or more of them
PANEL_INCHES = (4.2, 3.4)  # one panel's (width, height)
LEGEND_INCHES = 1.3  # the spectra's legend, right of the panels
# Lines from dark (the first lead) to light (the last): the shares of each colour map used.
DARKEST, LIGHTEST = 0.95, 0.4
# The baselines' lines; the model's, or each of the forecasts dlscale score compares, is solid, in these colours.
BASELINE_STYLES = {PERSISTENCE: ("C1", "--"), CLIMATOLOGY: ("C2", ":")}
FORECAST_COLOURS = ("C0", "C3", "C4", "C5", "C6", "C7", "C8", "C9")


def forecaster_styles(forecasters: Sequence[str]) -> dict[str, tuple[str, str]]:
    """Forecaster -> (colour, line style): the baselines their own, each other forecaster (the model, or the
    forecasts compared) a solid line in the next colour."""
    forecasts = [name for name in forecasters if name not in BASELINE_STYLES]
    styles = {name: (FORECAST_COLOURS[i % len(FORECAST_COLOURS)], "-") for i, name in enumerate(forecasts)}
    return {name: styles.get(name) or BASELINE_STYLES[name] for name in forecasters}


def origin_text(document: dict[str, Any]) -> str:
    """What was scored, for a figure's title: the run, split and checkpoint of ``dlscale forecast``, or
    ``dlscale score``'s own ``title``, and the count of initial times."""
    count = document["initial_time_count"]
    times = f"{count} initial time{'s' if count != 1 else ''}"
    if "title" in document:
        return f"{document['title']}: {times}"
    return f"{document['workload']}, {document['split']} split, {document['checkpoint_name']}: {times}"


def bias_figure(document: dict[str, Any]) -> Figure:
    """The mean error (forecast - truth) against lead time of every forecaster but the climatology (the model,
    or each forecast compared, and persistence) for each headline channel, in the channel's unit, with the zero
    line; leads in days, or in hours below two days."""
    names = document["headline_channels"]
    width, height = _size(len(names))
    figure = Figure(figsize=(width, height), layout="constrained")
    axes = figure.subplots(1, len(names), squeeze=False)[0]
    in_hours = document["lead_hours"][-1] < 48
    leads = np.asarray(document["lead_hours"]) / (1 if in_hours else 24)
    marker = "o" if len(leads) <= 13 else None
    styles = forecaster_styles(list(document["scores"]))
    for axis, name in zip(axes, names, strict=True):
        unit = document["units"].get(name, "")
        axis.axhline(0.0, color="black", linewidth=0.8)
        for forecaster, (color, style) in styles.items():
            if forecaster != CLIMATOLOGY:
                bias = float_array(document["scores"][forecaster]["bias"][name])
                axis.plot(leads, bias, style, color=color, label=forecaster, marker=marker, markersize=3)
        axis.set_title(name)
        axis.set_xlabel(f"lead time [{'hours' if in_hours else 'days'}]")
        axis.set_ylabel(f"bias, forecast - truth [{unit}]" if unit else "bias, forecast - truth")
        axis.grid(alpha=0.3)
    axes[0].legend(loc="best", fontsize="small")
    set_wrapped_title(figure, f"{origin_text(document)}: mean error (latitude-weighted) by lead time", width)
    return figure


def spectra_figure(document: dict[str, Any]) -> Figure | None:
    """Energy against zonal wavenumber (log-log) at mid-latitudes for each headline channel: the truth (greys)
    and the model (blues) at 1, 3, 5 and 10 days where the document has two or more of those leads, else at
    all its spectra's leads, from dark (early) to light (late). The wavelength at the band's mean latitude is
    the top axis; the shaded upper half of the wavenumbers is where the small-scale ratio (in each title, at
    the last lead drawn) is summed. None when the document has no spectra."""
    spectra = document.get("spectra")
    if spectra is None:
        return None
    names = document["headline_channels"]
    chosen = _drawn_leads(spectra["lead_hours"])
    wavenumbers = np.asarray(spectra["wavenumbers"], dtype=np.float64)
    shown = wavenumbers >= 1  # k = 0 (the row's mean) has no place on a log axis
    largest = wavenumbers[-1]
    width, height = _size(len(names))
    width += LEGEND_INCHES
    figure = Figure(figsize=(width, height), layout="constrained")
    axes = figure.subplots(1, len(names), squeeze=False)[0]
    shades = np.linspace(DARKEST, LIGHTEST, len(chosen))
    for axis, name in zip(axes, names, strict=True):
        for kind, colours in (("truth", "Greys"), (MODEL, "Blues")):
            colour_map = matplotlib.colormaps[colours]
            for shade, (index, hours) in zip(shades, chosen, strict=True):
                energy = float_array(spectra[kind]["energy"][name][index])
                axis.plot(
                    wavenumbers[shown],
                    energy[shown],
                    color=colour_map(shade),
                    linestyle="--" if kind == "truth" else "-",
                    linewidth=1.2,
                    label=f"{kind} +{lead_text(hours)}",
                )
        axis.axvspan(largest / 2, largest, color="C1", alpha=0.08, linewidth=0)
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("zonal wavenumber k (waves around the Earth)")
        axis.set_ylabel(f"energy [{spectra['units'][name]}]")
        top = axis.secondary_xaxis("top", functions=(_wavelength(spectra), _wavelength(spectra)))
        top.set_xlabel(f"wavelength at {spectra['mean_latitude']:.0f} deg [km]", fontsize="small")
        top.tick_params(labelsize="small")
        index, hours = chosen[-1]
        ratio = spectra[MODEL]["small_scale_ratio"][name][round(hours / document["step_hours"])]
        ratio_text = "-" if ratio is None or not np.isfinite(ratio) else f"{ratio:.3g}"
        axis.set_title(
            f"{name}\nsmall scales at +{lead_text(hours)}: {ratio_text} x the truth's", fontsize="medium"
        )
        axis.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside right center", fontsize="small")
    low, high = spectra["band_latitudes"]
    title = (
        f"{origin_text(document)}: zonal energy spectra of the rows at {low:g} to {high:g} deg N and S "
        f"(shaded: the small scales, k > {largest / 2:g})"
    )
    set_wrapped_title(figure, title, width)
    return figure


def _drawn_leads(lead_hours: Sequence[float]) -> list[tuple[int, float]]:
    """(index into the spectra's leads, hours) of the leads to draw: those at :data:`SPECTRA_DAYS` when two or
    more are there, else all."""
    marked = [(i, hours) for i, hours in enumerate(lead_hours) if hours / 24 in SPECTRA_DAYS]
    return marked if len(marked) >= 2 else list(enumerate(lead_hours))


def _wavelength(spectra: dict[str, Any]):
    """k -> wavelength in km at the band's mean latitude, and back (the same formula: lambda = C / k)."""
    kilometres_per_circle = float(spectra["wavelength_km"][1])  # k = 1: one wave around the circle

    def convert(values: np.ndarray) -> np.ndarray:
        values = np.asarray(values, dtype=np.float64)
        with np.errstate(divide="ignore"):
            return kilometres_per_circle / np.where(values > 0, values, np.nan)

    return convert


def set_wrapped_title(figure: Figure, title: str, width: float) -> None:
    """The figure's title, wrapped to its ``width`` in inches (about 0.65 em per character of the 12-point
    font)."""
    figure.suptitle("\n".join(textwrap.wrap(title, width=int(width * 72 / (0.65 * 12)))))


def _size(panels: int) -> tuple[float, float]:
    return (max(PANEL_INCHES[0] * panels, 6.0), PANEL_INCHES[1] + 0.8)


def float_array(values: Sequence[float | None]) -> np.ndarray:
    """A document's list of scores as float64, None (JSON's NaN) as NaN: a gap in a line."""
    return np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)
