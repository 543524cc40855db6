"""A toy atmosphere whose 20 ERA5-like channels have learnable 6-hourly dynamics.

Three latent fields (a streamfunction ``psi``, a temperature anomaly ``temp`` and a moisture anomaly
``moist``) are sums of smooth spherical-ish modes ``sin(n * colatitude) * cos(m * longitude + phase)``. Each
mode travels eastward at its own speed (a jet speed minus a Rossby-like drift that depends on the zonal
wavenumber), so patterns are advected *and* change shape; amplitudes breathe slowly. All three fields move
with the same mode speeds (one flow carries them). The 20 channels are physical-looking functions of the
latent fields and their gradients: winds from the streamfunction (geostrophic-like), upper winds sheared by
the temperature gradient (thermal-wind-like), geopotential and pressure from the streamfunction, relative
humidity and water vapour as saturating / exponential functions of moisture and temperature, plus fixed
latitude climatologies and a static orography under surface pressure.

So the state at t + 6 h is (almost) a deterministic function of the state at t: a model can learn it, and
predicting "no change" (persistence) is clearly beaten by one that has. Fields are functions of continuous
coordinates, so every grid size samples the same atmosphere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlscale.data.era5.dataset import ERA5_CHANNELS

# Mode truncation: meridional (n) and zonal (m) wavenumbers. Low enough that fields are smooth on a patch.
MERIDIONAL_MODES = 6
ZONAL_MODES = 8
LATENT_FIELDS = ("psi", "temp", "moist")
OROGRAPHY_REFERENCE_GRID = (181, 360)  # (rows, columns) on which the orography's mean and spread are measured


@dataclass(frozen=True)
class AtmosphereModes:
    """Random but fixed mode amplitudes, phases, speeds and breathing of the latent fields."""

    amplitude: np.ndarray  # (field, n, m) mode amplitude
    phase: np.ndarray  # (field, n, m) initial phase (radians)
    speed: np.ndarray  # (n, m) eastward angular speed (radians of longitude per 6-hourly step)
    breathing_rate: np.ndarray  # (field, n, m) angular frequency of the amplitude modulation (per step)
    breathing_phase: np.ndarray  # (field, n, m)
    orography: np.ndarray  # (n, m) static modes of the orography (cosine coefficients)

    @classmethod
    def random(cls, seed: int) -> AtmosphereModes:
        rng = np.random.default_rng(seed)
        n = np.arange(1, MERIDIONAL_MODES + 1)[:, None]
        m = np.arange(0, ZONAL_MODES + 1)[None, :]
        shape = (len(LATENT_FIELDS), MERIDIONAL_MODES, ZONAL_MODES + 1)
        # A red spectrum keeps the fields smooth: most variance in the largest scales.
        spectrum = 1.0 / (1.0 + (n**2 + m**2) / 4.0) ** 1.25
        amplitude = rng.standard_normal(shape) * spectrum
        # Normalise each latent field to unit variance over the sphere (mode variance averaged over a circle and
        # over colatitude: 1/2 for the cosine in longitude (1 for m = 0), 1/2 for sin(n theta)).
        variance = (amplitude**2 * np.where(m == 0, 1.0, 0.5) * 0.5).sum(axis=(1, 2), keepdims=True)
        amplitude /= np.sqrt(variance)
        jet = rng.uniform(0.09, 0.21, size=(MERIDIONAL_MODES, 1))
        speed = jet - 0.1 / (1.0 + m.astype(float) ** 2)
        speed = np.broadcast_to(speed, (MERIDIONAL_MODES, ZONAL_MODES + 1)).copy()
        speed[:, 0] = 0.0  # zonal-mean modes do not travel; they only breathe
        period = rng.uniform(40.0, 400.0, size=shape)
        return cls(
            amplitude=amplitude,
            phase=rng.uniform(0, 2 * np.pi, size=shape),
            speed=speed,
            breathing_rate=2 * np.pi / period,
            breathing_phase=rng.uniform(0, 2 * np.pi, size=shape),
            orography=rng.standard_normal((MERIDIONAL_MODES, ZONAL_MODES + 1)) * spectrum,
        )


class Grid:
    """A regular latitude-longitude grid: ``height`` rows from +90 to -90 (inclusive), ``width`` columns."""

    def __init__(self, height: int, width: int):
        self.height, self.width = height, width
        self.colatitude = np.linspace(0.0, np.pi, height)  # row 0 is the north pole
        self.latitude = np.pi / 2 - self.colatitude
        self.longitude = np.arange(width) * (2 * np.pi / width)
        n = np.arange(1, MERIDIONAL_MODES + 1)
        m = np.arange(0, ZONAL_MODES + 1)
        self.sin_n = np.sin(np.outer(self.colatitude, n))  # (H, n): meridional basis
        self.dsin_n = np.cos(np.outer(self.colatitude, n)) * n  # (H, n): its colatitude derivative
        self.cos_m = np.cos(np.outer(m, self.longitude))  # (m, W)
        self.sin_m = np.sin(np.outer(m, self.longitude))  # (m, W)
        self.m = m


class SyntheticAtmosphere:
    """Evaluates the 20 channels at any set of 6-hourly time steps on a grid."""

    def __init__(self, grid: Grid, seed: int = 0, noise: float = 0.0):
        self.grid = grid
        self.modes = AtmosphereModes.random(seed)
        self.noise = noise
        self._noise_rng = np.random.default_rng(seed + 1)
        # Standardise with statistics of a fixed reference grid, so that every grid samples the same field.
        reference = self._raw_orography(Grid(*OROGRAPHY_REFERENCE_GRID))
        self.orography = np.clip((self._raw_orography(grid) - reference.mean()) / reference.std(), 0.0, None)

    def _raw_orography(self, grid: Grid) -> np.ndarray:
        """The orography's modes on ``grid`` (land height up to an offset and a scale)."""
        return np.einsum("hn,nm,mw->hw", grid.sin_n, self.modes.orography, grid.cos_m)

    def _latent(self, steps: np.ndarray) -> dict[str, np.ndarray]:
        """Latent fields and their derivatives at ``steps``: each (T, field, H, W)."""
        g, modes = self.grid, self.modes
        t = steps.astype(np.float64)[:, None, None, None]
        breathing = 1.0 + 0.5 * np.sin(modes.breathing_rate[None] * t + modes.breathing_phase[None])
        amplitude = modes.amplitude[None] * breathing  # (T, F, n, m)
        phase = modes.phase[None] - g.m[None, None, None, :] * modes.speed[None, None] * t
        a, b = amplitude * np.cos(phase), -amplitude * np.sin(phase)  # a cos(m lon) + b sin(m lon)
        zonal = np.einsum("tfnm,mw->tfnw", a, g.cos_m) + np.einsum("tfnm,mw->tfnw", b, g.sin_m)
        zonal_dlon = np.einsum("tfnm,mw->tfnw", b * g.m, g.cos_m) - np.einsum(
            "tfnm,mw->tfnw", a * g.m, g.sin_m
        )
        return {
            "value": np.einsum("hn,tfnw->tfhw", g.sin_n, zonal),
            "d_lon": np.einsum("hn,tfnw->tfhw", g.sin_n, zonal_dlon),
            "d_colat": np.einsum("hn,tfnw->tfhw", g.dsin_n, zonal),
        }

    def channels(self, steps: np.ndarray) -> np.ndarray:
        """The (T, 20, H, W) float32 fields at the given time steps, in ERA5_CHANNELS order."""
        return self.add_noise(self.noiseless_channels(steps))

    def noiseless_channels(self, steps: np.ndarray) -> np.ndarray:
        """:meth:`channels` without the noise: a pure function of ``steps``, so several threads can compute
        blocks of steps at once (numpy releases the GIL in its array loops); the noise then goes on in order."""
        latent = self._latent(np.asarray(steps))
        psi, temp, moist = (latent["value"][:, i] for i in range(3))
        # Winds: u from the meridional, v from the zonal derivative of the streamfunction (unit-scaled by the
        # typical wavenumbers so that u and v have comparable spread), and upper-level winds sheared by the
        # temperature gradient.
        psi_y, psi_x = latent["d_colat"][:, 0] / 3.0, latent["d_lon"][:, 0] / 3.0
        temp_y, temp_x = latent["d_colat"][:, 1] / 3.0, latent["d_lon"][:, 1] / 3.0
        lat = self.grid.latitude[None, :, None]
        sin2, cos2 = np.sin(lat) ** 2, np.cos(lat) ** 2
        jet = np.sin(2 * lat) ** 2  # climatological westerlies in both mid-latitudes
        oro = self.orography[None]

        def sigmoid(x: np.ndarray) -> np.ndarray:
            return 1.0 / (1.0 + np.exp(-x))

        fields = {
            "u10": 2.0 + 4.0 * jet + 5.0 * psi_y,
            "v10": 5.0 * psi_x,
            "t2m": 300.0 - 50.0 * sin2 - 6.5 * oro + 6.0 * temp + 1.5 * psi,
            "sp": 101000.0 - 9000.0 * oro + 900.0 * psi,
            "msl": 101300.0 + 1100.0 * psi + 150.0 * temp,
            "t850": 290.0 - 45.0 * sin2 + 5.0 * temp + 1.0 * psi,
            "u1000": 2.0 + 5.0 * jet + 6.0 * psi_y,
            "v1000": 6.0 * psi_x,
            "z1000": 900.0 + 850.0 * psi,
            "u850": 4.0 + 8.0 * jet + 8.0 * psi_y + 3.0 * temp_y,
            "v850": 8.0 * psi_x + 3.0 * temp_x,
            "z850": 14300.0 - 600.0 * sin2 + 900.0 * psi + 250.0 * temp,
            "u500": 8.0 + 15.0 * jet + 12.0 * psi_y + 7.0 * temp_y,
            "v500": 12.0 * psi_x + 7.0 * temp_x,
            "z500": 57000.0 - 4000.0 * sin2 + 1200.0 * psi + 700.0 * temp,
            "t500": 262.0 - 25.0 * sin2 + 4.0 * temp + 0.5 * psi,
            "z50": 202000.0 - 6000.0 * sin2 + 700.0 * psi + 900.0 * temp,
            "r500": 100.0 * sigmoid(1.6 * moist + 0.6 * psi - 0.4),
            "r850": 100.0 * sigmoid(1.4 * moist - 0.5 * temp + 0.6),
            "tcwv": (8.0 + 30.0 * cos2) * np.exp(0.35 * moist + 0.25 * temp),
        }
        return np.stack([np.broadcast_to(fields[name], psi.shape) for name in ERA5_CHANNELS], axis=1)

    def add_noise(self, stacked: np.ndarray) -> np.ndarray:
        """``stacked`` (from :meth:`noiseless_channels`) with this atmosphere's i.i.d. noise, as float32. The
        noise comes from one generator in call order: blocks must arrive in time order for the same data."""
        if self.noise > 0:
            spread = stacked.std(axis=(0, 2, 3), keepdims=True)
            stacked = stacked + self.noise * spread * self._noise_rng.standard_normal(stacked.shape)
        return stacked.astype(np.float32)
