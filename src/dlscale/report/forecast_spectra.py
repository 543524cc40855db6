"""The ``spectra`` entry of the forecast's ``scores.json``: the model's and the truth's zonal energy spectra at
mid-latitudes (:mod:`dlscale.scoring.spectra`) at the report's leads, and the model's small-scale energy ratio
at every lead.

Only the report's leads (:func:`dlscale.report.forecast_selection.report_leads` of the headline days: five
spectra per channel and forecaster, not one per lead of a 10-day rollout) keep the file small; the ratio, one
number per lead, is kept for all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dlscale.scoring.spectra import BAND_DEGREES, ZonalSpectra

SPECTRA_CONVENTION = (
    "zonal energy spectrum of each grid row with 30 <= |latitude| <= 60 degrees (both hemispheres), as "
    "WeatherBench2's ZonalEnergySpectrum: S[k] = m_k * C * |F[k]|^2 with F = rfft(row) / L, C the row's "
    "circumference in m and m_k = 2 for 0 < k < L/2, else 1 (WeatherBench2 doubles k = L/2 too), so that "
    "sum_k S[k] = C * mean(row^2); the rows' spectra averaged with cos(latitude) weights, then over initial "
    "times; wavelength_km at the band's mean |latitude|; unit: m times the channel's unit squared. "
    "small_scale_ratio: the model's energy over the truth's summed over the upper half of the non-zero "
    "wavenumbers (k > K/2, K the largest): 1 as sharp as the truth, below 1 blurred"
)


def spectra_entry(
    spectra: ZonalSpectra | None,
    names: Sequence[str],
    units: Sequence[str],
    step_hours: float,
    leads: Sequence[int],
) -> dict[str, Any] | None:
    """``scores.json``'s ``spectra``: the band, the wavenumber axis, the spectra of the model and the truth per
    channel at the lead indices ``leads`` (``energy[channel][i]`` is at ``lead_hours[i]``), and the model's
    ``small_scale_ratio`` per channel at every lead of the rollout; None for a grid without spectra."""
    if spectra is None:
        return None
    forecast, truth, ratio = spectra.forecast(), spectra.truth(), spectra.small_scale_ratio()
    return {
        "band_latitudes": list(BAND_DEGREES),
        "mean_latitude": spectra.mean_latitude,
        "rows": int(len(spectra.rows)),
        "wavenumbers": spectra.wavenumbers.tolist(),
        "wavelength_km": spectra.wavelengths_km.tolist(),
        "lead_hours": [lead * step_hours for lead in leads],
        "units": {name: _energy_unit(unit) for name, unit in zip(names, units, strict=True)},
        "model": {
            "energy": {name: forecast[list(leads), c].tolist() for c, name in enumerate(names)},
            "small_scale_ratio": {name: ratio[:, c].tolist() for c, name in enumerate(names)},
        },
        "truth": {"energy": {name: truth[list(leads), c].tolist() for c, name in enumerate(names)}},
    }


def _energy_unit(unit: str) -> str:
    """The spectrum's unit for a channel in ``unit``: metres times the unit squared (``m`` without one)."""
    return f"m ({unit})^2" if unit else "m"
