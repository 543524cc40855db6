"""Zonal energy spectra at mid-latitudes per lead: how much a forecast blurs as it rolls out.

A forecast trained on a mean squared error loses its small scales as it rolls out (the mean of the possible
futures is smoother than any of them); its RMSE rewards that, its spectrum shows it. The definition is
WeatherBench2's ``ZonalEnergySpectrum`` (``weatherbench2/derived_variables.py``). For the values
``f[l], l = 0..L-1`` of one grid row (a circle of latitude ``phi``, circumference ``C = 2 pi R cos(phi)``,
``R`` = 6367.5 km as WeatherBench2's ``EARTH_RADIUS_M``):

    F[k] = (1/L) sum_l f[l] exp(-2 pi i k l / L)          (numpy's ``rfft(norm="forward")``), k = 0..L//2
    S[k] = m_k C |F[k]|^2,   m_0 = 1, m_k = 2 for 0 < k < L/2 (the negative wavenumbers), m_{L/2} = 1 (even L)

so that Parseval holds: ``sum_k S[k] = C mean_l f[l]^2`` (the discrete integral of f^2 around the circle).
``S`` is in metres times the channel's unit squared. One difference from WeatherBench2: it doubles the
Nyquist term ``k = L/2`` too, which counts that one wavenumber's energy twice; here it counts once, so Parseval
is exact for any field (the rest of the spectrum is the same).

The band: the rows with ``30 <= |latitude| <= 60`` degrees, both hemispheres. WeatherBench2's code computes a
spectrum per row (``scripts/compute_zonal_energy_spectrum.py`` averages over time only) and leaves the
band to its figures, which show the mid-latitudes: where the weather that a medium-range forecast is judged on
(the storm tracks, the baroclinic eddies) lives, and where a row's circumference changes by less than a factor
of two (so one wavenumber is about one wavelength). Both hemispheres, so that a season's storm track and the
other hemisphere's quieter one are averaged as the whole band's area weighs them. The spectra of the band's
rows are averaged with cos(latitude) weights (each row's share of the band's area), on the wavenumber axis,
which all rows share: wavenumber k is k waves around the Earth. Its wavelength in km is given at the band's
mean latitude (the mean of |latitude| over its rows), ``C / k``.

Sums: per lead and channel the band's spectrum of every initial time is added in float64, and the count of
initial times kept, so a forecast scored in batches equals one scored at once; the spectrum is that sum over
the count: the mean over initial times.

Only the model and the truth: persistence's spectrum is the truth's at its initial time, which says nothing of
blurring, and the climatology is a smooth mean; neither is kept.

``small_scale_ratio``: per lead and channel, the forecast's energy summed over the upper half of the non-zero
wavenumbers (``k > K/2`` with ``K = L//2``, the largest) over the truth's: 1 is as sharp as the truth, below 1
blurred (0.5: half the truth's small-scale energy), above 1 noisier than the truth.

A grid with no row in the band (not on the Earth: latitudes all zero; or a crop of the tropics or the poles),
or whose rows are not whole circles of evenly spaced longitudes (a regional crop: the Fourier transform would
wrap its east edge onto its west one), gets no spectra: :meth:`ZonalSpectra.for_grid` returns None and the log
says why, once.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

log = logging.getLogger("dlscale.train")

# WeatherBench2's schema.EARTH_RADIUS_M: the mean of the polar and the equatorial radius, in metres.
EARTH_RADIUS_M = 1000 * (6357 + 6378) / 2
BAND_DEGREES = (30.0, 60.0)  # |latitude| of the mid-latitude band, both ends included
EVEN_SPACING_TOLERANCE_DEGREES = 1e-3  # as WeatherBench2's check of evenly spaced longitudes


def circumference_m(latitude_deg: np.ndarray | float) -> np.ndarray:
    """The length in metres of the circle of latitude ``latitude_deg``."""
    return 2 * np.pi * EARTH_RADIUS_M * np.cos(np.deg2rad(latitude_deg))


def zonal_energy_spectrum(rows: torch.Tensor, circumferences: torch.Tensor) -> torch.Tensor:
    """The energy spectrum ``S[k]`` (see the module's docstring) of each row of ``rows`` (..., H, L), whose
    circles have the lengths ``circumferences`` (H,) in metres: (..., H, L//2 + 1), in float64."""
    length = rows.shape[-1]
    coefficients = torch.fft.rfft(rows.double(), dim=-1, norm="forward")
    power = coefficients.real**2 + coefficients.imag**2
    multiplicity = torch.full((power.shape[-1],), 2.0, dtype=torch.float64, device=rows.device)
    multiplicity[0] = 1.0
    if length % 2 == 0:
        multiplicity[-1] = 1.0  # the Nyquist wavenumber has no negative twin
    return power * multiplicity * circumferences.to(device=rows.device, dtype=torch.float64)[:, None]


class ZonalSpectra:
    """Running float64 sums of the band's zonal energy spectrum of the model's forecast and of the truth per
    (lead, channel, wavenumber), over initial times. Make one with :meth:`for_grid`."""

    def __init__(self, n_leads: int, n_channels: int, latitudes: np.ndarray, rows: np.ndarray, length: int):
        """``rows``: the indices of the band's rows in ``latitudes``; ``length``: the points per row."""
        band = np.asarray(latitudes, dtype=np.float64)[rows]
        weights = np.cos(np.deg2rad(band))
        self.rows = torch.as_tensor(rows, dtype=torch.long)
        self.row_weights = torch.as_tensor(weights / weights.sum())  # (rows,) float64, summing to 1
        self.circumferences = torch.as_tensor(circumference_m(band))  # (rows,) metres
        self.mean_latitude = float(np.abs(band).mean())
        self.wavenumbers = np.arange(length // 2 + 1)
        self.forecast_sum = np.zeros((n_leads, n_channels, len(self.wavenumbers)))
        self.truth_sum = np.zeros((n_leads, n_channels, len(self.wavenumbers)))
        self.count = np.zeros(n_leads, dtype=np.int64)

    @classmethod
    def for_grid(
        cls, n_leads: int, n_channels: int, latitudes: np.ndarray, longitudes: np.ndarray
    ) -> ZonalSpectra | None:
        """The sums for a grid of rows at ``latitudes`` and columns at ``longitudes`` (degrees); None, said in
        the log, for a grid without rows in the band or whose rows are not whole circles."""
        latitudes = np.asarray(latitudes, dtype=np.float64)
        rows = np.flatnonzero((np.abs(latitudes) >= BAND_DEGREES[0]) & (np.abs(latitudes) <= BAND_DEGREES[1]))
        low, high = BAND_DEGREES
        if rows.size == 0:
            log.info(
                "No zonal energy spectra: the grid has no row between %g and %g degrees of latitude (its rows "
                "lie at %.4g to %.4g)",
                low,
                high,
                latitudes.min(),
                latitudes.max(),
            )
            return None
        if not whole_circle(np.asarray(longitudes, dtype=np.float64)):
            log.info(
                "No zonal energy spectra: the grid's %d columns are not evenly spaced longitudes around the "
                "whole Earth (a spectrum along a row needs the whole circle)",
                len(longitudes),
            )
            return None
        return cls(n_leads, n_channels, latitudes, rows, len(longitudes))

    @property
    def wavelengths_km(self) -> np.ndarray:
        """(K + 1,) the wavelength of each wavenumber at the band's mean latitude (inf for k = 0)."""
        with np.errstate(divide="ignore"):
            return circumference_m(self.mean_latitude) / 1000 / self.wavenumbers

    def add(self, lead: int, forecast: torch.Tensor, truth: torch.Tensor) -> None:
        """Add the (N, C, H, W) forecasts of N initial times at lead index ``lead`` and their truth."""
        self.forecast_sum[lead] += self._band_spectrum(forecast)
        self.truth_sum[lead] += self._band_spectrum(truth)
        self.count[lead] += forecast.shape[0]

    def _band_spectrum(self, fields: torch.Tensor) -> np.ndarray:
        """(C, K + 1): the sum over the N initial times of the band's row-weighted mean spectrum."""
        rows = fields.index_select(-2, self.rows.to(fields.device))
        spectra = zonal_energy_spectrum(rows, self.circumferences)  # (N, C, rows, K + 1)
        weights = self.row_weights.to(fields.device)[:, None]
        return (spectra * weights).sum(dim=(0, 2)).cpu().numpy()

    def forecast(self) -> np.ndarray:
        """(leads, C, K + 1): the model's mean spectrum over initial times (NaN at a lead with none)."""
        return self._mean(self.forecast_sum)

    def truth(self) -> np.ndarray:
        """(leads, C, K + 1): the truth's mean spectrum over initial times."""
        return self._mean(self.truth_sum)

    def _mean(self, sums: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return sums / self.count[:, None, None]

    def running_sums(self) -> list[np.ndarray]:
        """Every running sum and count, the arrays themselves (ranks add them up)."""
        return [self.forecast_sum, self.truth_sum, self.count]

    def small_scale_ratio(self) -> np.ndarray:
        """(leads, C): the forecast's energy over the truth's in the upper half of the non-zero wavenumbers
        (``k > K/2``); 1: as sharp as the truth, below 1: blurred; NaN where the truth has none there."""
        upper = self.wavenumbers > self.wavenumbers[-1] / 2
        forecast, truth = self.forecast_sum[..., upper].sum(-1), self.truth_sum[..., upper].sum(-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(truth > 0, forecast / truth, np.nan)


def whole_circle(longitudes: np.ndarray) -> bool:
    """Whether ``longitudes`` are evenly spaced and span the circle: ``len * spacing`` is 360 degrees, to a
    tenth of a column (float32 coordinates of a fine grid add up their rounding)."""
    if len(longitudes) < 2:
        return False
    spacing = (longitudes[-1] - longitudes[0]) / (len(longitudes) - 1)
    even = bool(np.all(np.abs(np.diff(longitudes) - spacing) <= EVEN_SPACING_TOLERANCE_DEGREES))
    return even and abs(abs(spacing) * len(longitudes) - 360.0) <= 0.1 * abs(spacing)
