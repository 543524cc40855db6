"""The spherical harmonic transform (SHT) of real fields on an equiangular latitude-longitude grid, and its inverse.

A real field f(theta, phi) on the sphere (theta the colatitude, phi the longitude) is a sum of orthonormal
spherical harmonics Y_l^m(theta, phi) = P_l^m(cos theta) exp(i m phi), where P_l^m is the associated Legendre
function normalized so that the integral of |Y_l^m|^2 over the sphere is 1, with the Condon-Shortley phase
(-1)^m (so Y_1^1 = -sqrt(3 / (8 pi)) sin(theta) exp(i phi)). As f is real, a_l^-m = (-1)^m conj(a_l^m) and only
m >= 0 is kept. :class:`SphericalHarmonicTransform` computes

    a_l^m = integral of f conj(Y_l^m) dOmega
          = sum_j w_j P_l^m(cos theta_j) * (2 pi / nlon) sum_k f(theta_j, phi_k) exp(-i m phi_k),

a real FFT over each row (exact for m < nlon / 2) and a Legendre transform with the quadrature weights w_j of
the rows in cos(theta) (:func:`quadrature_weights`); :class:`InverseSphericalHarmonicTransform` sums
P_l^m(cos theta_j) a_l^m over l and takes the inverse real FFT over longitude. Truncation is triangular: degrees
l < lmax, orders m < mmax with m <= l; coefficients come as (..., lmax, mmax) complex, zero where m > l.
Longitudes are phi_k = 2 pi k / nlon from the first column, so the coefficients are relative to the first column.

Grids: the rows must be equally spaced in latitude (north to south or south to north), each at most one row
spacing from its pole: ERA5's 721 rows with both poles (Clenshaw-Curtis weights), WeatherBench2's cell centres
(Fejer's first rule), rows spaced 180 / (n + 1) degrees without the poles (Fejer's second rule), and the crops
dlscale reads (``data.img_size`` keeps the top rows, e.g. 720 of 721, so the patch centres of a ViT's token grid
lie 0.875 degrees from one pole and 1.125 from the other), for which the weights are those of the interpolatory
rule through the rows, solved from the Chebyshev moments. With n rows every rule integrates polynomials in
cos(theta) of degree n - 1 exactly, so the transform of a field with l < lmax is exact when 2 (lmax - 1) <= n - 1:
``lmax`` defaults to (n - 1) // 2 + 1, and a larger one is refused, as are rows outside [-90, 90], duplicated,
unsorted or unequally spaced rows, and rows that leave a pole uncovered.

dlscale writes its own transform rather than using torch-harmonics (NVIDIA's library, which SFNO and makani use):
its 0.9.x wheels carry C++ extensions built for one torch minor (0.9.2 needs torch 2.11, 0.9.3 torch 2.14; 0.9.2
fails to import under torch 2.13 with an undefined symbol), and 0.8.x is a source build that compiles C++ at
install, so no release runs on dlscale's whole torch range on a CPU-only machine without a compiler.

Precision: the Legendre functions come from the stable three-term recurrence in float64 at construction and are
kept as float32 buffers (not saved in state dicts: they follow from the grid); the transforms always run in
float32, under autocast too (half precision would lose the small coefficients), and return float32/complex64.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from dlscale.errors import InvalidValue

# Rows within this fraction of a row spacing of their ideal place count as equally spaced (latitudes stored in
# float32 are off by ~1e-6 degrees); the same tolerance decides a pole row and a symmetric grid.
SPACING_TOLERANCE = 1e-4
# The interpolatory rule through the rows is accepted when its weights are stable: sum |w| within this of
# sum w = 2 (no cancelling positive and negative weights).
STABILITY_TOLERANCE = 1e-6


def describe_latitudes(lats_deg: np.ndarray) -> str:
    """The rows in a message: the first three and the last, and how many."""
    values = [f"{value:g}" for value in np.asarray(lats_deg, dtype=np.float64).ravel()]
    shown = ", ".join(values) if len(values) <= 4 else f"{', '.join(values[:3])}, ..., {values[-1]}"
    return f"[{shown}] ({len(values)} rows)"


class LatitudeRows:
    """The rows of an equiangular grid, checked, as colatitudes: ``theta`` (radians, in the rows' order), the
    quadrature ``weights`` in cos(theta) and the ``rule`` that gave them. Raises :class:`InvalidValue` (key
    ``key``) for a grid the transform cannot integrate (see the module docstring)."""

    def __init__(self, lats_deg, key: str = "latitudes"):
        lats = np.asarray(lats_deg, dtype=np.float64)
        self.key = key
        self._check_values(lats)
        self.theta, self.rule = self._ideal_colatitudes(lats)
        self.weights = quadrature_weights(self.theta, self.rule)
        self._check_stable(lats)

    @property
    def count(self) -> int:
        return len(self.theta)

    @property
    def exact_degree(self) -> int:
        """The highest degree in cos(theta) the weights integrate exactly."""
        return self.count - 1

    def _refuse(self, lats: np.ndarray, problem: str) -> InvalidValue:
        return InvalidValue(self.key, f"{describe_latitudes(lats)}: {problem}")

    def _check_values(self, lats: np.ndarray) -> None:
        if lats.ndim != 1:
            raise self._refuse(lats, f"expected one latitude per row (a 1-D array), got shape {lats.shape}")
        if len(lats) < 2:
            raise self._refuse(lats, "the spherical harmonic transform needs at least 2 rows, pole to pole")
        bad = np.flatnonzero(~np.isfinite(lats))
        if bad.size:
            raise self._refuse(lats, f"row {bad[0]} is {lats[bad[0]]}, expected a latitude in degrees")
        outside = np.flatnonzero(np.abs(lats) > 90.0 + 1e-9)
        if outside.size:
            row = outside[0]
            raise self._refuse(lats, f"row {row} at {lats[row]:g} degrees is outside -90 to 90")
        values, counts = np.unique(lats, return_counts=True)
        if (counts > 1).any():
            value = values[counts > 1][0]
            rows = np.flatnonzero(lats == value)
            raise self._refuse(
                lats, f"rows {rows[0]} and {rows[1]} are both at {value:g} degrees (duplicated)"
            )
        steps = np.diff(lats)
        if not ((steps > 0).all() or (steps < 0).all()):
            raise self._refuse(lats, "the rows must be sorted, north to south or south to north")
        ideal = np.linspace(lats[0], lats[-1], len(lats))
        spacing = abs(lats[-1] - lats[0]) / (len(lats) - 1)
        worst = int(np.argmax(np.abs(lats - ideal)))
        if abs(lats[worst] - ideal[worst]) > SPACING_TOLERANCE * spacing:
            raise self._refuse(
                lats,
                f"the rows are not equally spaced (row {worst} is at {lats[worst]:g}, an equiangular grid with "
                f"these ends has it at {ideal[worst]:g}); the transform's quadrature needs an equiangular grid",
            )

    def _ideal_colatitudes(self, lats: np.ndarray) -> tuple[np.ndarray, str]:
        """The colatitudes of the equiangular grid the rows lie on (within the tolerance), and its rule."""
        count = len(lats)
        theta = np.radians(90.0 - lats)
        spacing = abs(theta[-1] - theta[0]) / (count - 1)
        north_gap, south_gap = min(theta[0], theta[-1]), math.pi - max(theta[0], theta[-1])
        tolerance = SPACING_TOLERANCE * spacing
        if north_gap > spacing + tolerance or south_gap > spacing + tolerance:
            raise self._refuse(
                lats,
                f"the rows leave {math.degrees(north_gap):g} degrees uncovered at the north pole and "
                f"{math.degrees(south_gap):g} at the south pole, more than the row spacing "
                f"{math.degrees(spacing):g}; the transform integrates over the whole sphere, so it needs rows "
                "from pole to pole (a grid cropped to a region cannot be transformed)",
            )
        index = np.arange(count) if theta[-1] > theta[0] else np.arange(count)[::-1]
        symmetric = abs(north_gap - south_gap) <= tolerance
        for rule, start, divisions in (
            ("clenshaw-curtis", 0.0, count - 1),  # both poles
            ("fejer-1", 0.5, count),  # cell centres
            ("fejer-2", 1.0, count + 1),  # interior rows, no pole
        ):
            if symmetric and abs(north_gap - start * spacing) <= tolerance:
                return math.pi * (index + start) / divisions, rule
        direction = 1.0 if theta[-1] > theta[0] else -1.0
        return theta[0] + direction * spacing * np.arange(count), "interpolatory"

    def _check_stable(self, lats: np.ndarray) -> None:
        total = np.abs(self.weights).sum()
        if not np.isfinite(total) or total > 2.0 * (1.0 + STABILITY_TOLERANCE):
            raise self._refuse(
                lats,
                f"the quadrature through these rows is unstable (its weights' absolute sum is {total:.6g}, "
                "expected 2); use the data's whole grid, pole to pole",
            )


def quadrature_weights(theta: np.ndarray, rule: str) -> np.ndarray:
    """Weights w_j with sum_j w_j p(cos theta_j) = integral_{-1}^{1} p(x) dx for every polynomial p of degree
    below len(theta), for the rows at colatitudes ``theta`` (radians, any order).

    ``clenshaw-curtis`` (n = N + 1 rows at j pi / N, both poles), ``fejer-1`` (n rows at (j + 1/2) pi / n) and
    ``fejer-2`` (n rows at (j + 1) pi / (n + 1)) are the closed forms; each comes from integrating the
    interpolating cosine series term by term, using integral_0^pi cos(2 k t) sin(t) dt = -2 / (4 k^2 - 1):

    - Clenshaw-Curtis: w_j = (c_j / N) (1 - sum_{k=1}^{N/2} b_k cos(2 k theta_j) / (4 k^2 - 1)), c_j = 1 at a
      pole and 2 elsewhere, b_k = 1 for k = N / 2 and 2 below;
    - Fejer 1: w_j = (2 / n) (1 - 2 sum_{k=1}^{n/2} cos(2 k theta_j) / (4 k^2 - 1));
    - Fejer 2: w_j = (4 sin theta_j / (n + 1)) sum_{k=1}^{(n+1)/2} sin((2 k - 1) theta_j) / (2 k - 1).

    ``interpolatory`` solves the moment equations sum_j w_j T_k(cos theta_j) = integral of T_k, k < n, for any
    rows (the same weights as the closed forms on their grids: the interpolatory rule is unique).
    """
    theta = np.asarray(theta, dtype=np.float64)
    count = len(theta)
    if rule == "clenshaw-curtis":
        divisions = count - 1
        k = np.arange(1, divisions // 2 + 1)
        b = np.where(2 * k == divisions, 1.0, 2.0)
        at_pole = np.isclose(np.sin(theta), 0.0, atol=1e-12)
        c = np.where(at_pole, 1.0, 2.0)
        return c / divisions * (1.0 - (np.cos(2.0 * np.outer(theta, k)) * (b / (4.0 * k**2 - 1))).sum(axis=1))
    if rule == "fejer-1":
        k = np.arange(1, count // 2 + 1)
        return 2.0 / count * (1.0 - 2.0 * (np.cos(2.0 * np.outer(theta, k)) / (4.0 * k**2 - 1)).sum(axis=1))
    if rule == "fejer-2":
        odd = 2 * np.arange(1, (count + 1) // 2 + 1) - 1
        return 4.0 * np.sin(theta) / (count + 1) * (np.sin(np.outer(theta, odd)) / odd).sum(axis=1)
    if rule == "interpolatory":
        degrees = np.arange(count)
        moments = np.zeros(count)
        even = degrees % 2 == 0
        moments[even] = 2.0 / (1.0 - degrees[even].astype(np.float64) ** 2)
        return np.linalg.solve(np.cos(np.outer(degrees, theta)), moments)
    raise ValueError(f"unknown quadrature rule {rule!r}")


def legendre_table(lmax: int, mmax: int, theta: np.ndarray) -> np.ndarray:
    """(mmax, lmax, n) float64: the orthonormal associated Legendre functions P_l^m(cos theta_j) with the
    Condon-Shortley phase (so that P_l^m(cos theta) exp(i m phi) is Y_l^m), zero where m > l.

    The recurrences keep every value normalized, so nothing overflows (values near the poles at high m
    underflow to 0, where they are below 1e-300 anyway):
    P_0^0 = 1 / sqrt(4 pi); P_m^m = -sqrt((2m + 1) / (2m)) sin(theta) P_{m-1}^{m-1};
    P_{m+1}^m = sqrt(2m + 3) cos(theta) P_m^m;
    P_l^m = sqrt((4l^2 - 1) / (l^2 - m^2)) (cos(theta) P_{l-1}^m - sqrt(((l-1)^2 - m^2) / (4(l-1)^2 - 1)) P_{l-2}^m).
    """
    x, s = np.cos(theta), np.sin(theta)
    table = np.zeros((mmax, lmax, len(theta)))
    diagonal = np.full(len(theta), 1.0 / math.sqrt(4.0 * math.pi))
    for m in range(min(mmax, lmax)):
        if m > 0:
            diagonal = -math.sqrt((2 * m + 1) / (2 * m)) * s * diagonal
        table[m, m] = diagonal
        if m + 1 < lmax:
            table[m, m + 1] = math.sqrt(2 * m + 3) * x * diagonal
    # The three-term recurrence in l, for all orders m <= l - 2 at once.
    for degree in range(2, lmax):
        m = np.arange(min(degree - 1, mmax))[:, None]
        a = np.sqrt((4.0 * degree**2 - 1) / (degree**2 - m**2))
        b = np.sqrt(((degree - 1.0) ** 2 - m**2) / (4.0 * (degree - 1) ** 2 - 1))
        rows = slice(0, len(m))
        table[rows, degree] = a * (x * table[rows, degree - 1] - b * table[rows, degree - 2])
    return table


def default_truncation(nlat: int, nlon: int) -> tuple[int, int]:
    """The (lmax, mmax) a transform on nlat rows and nlon columns takes by default (:func:`resolve_truncation`)."""
    lmax = (nlat - 1) // 2 + 1
    return lmax, min(lmax, (nlon + 1) // 2)


def resolve_truncation(
    rows: LatitudeRows, nlon: int, lmax: int | None, mmax: int | None, key: str
) -> tuple[int, int]:
    """The (lmax, mmax) of a transform on these rows and ``nlon`` columns: the largest the quadrature and the
    FFT integrate exactly by default (2 (lmax - 1) <= n - 1; m < nlon / 2, below the Nyquist wavenumber whose
    sine part a real grid cannot hold); given values are checked against the same limits."""
    if isinstance(nlon, bool) or not isinstance(nlon, int) or nlon < 1:
        raise InvalidValue(key, f"nlon must be a positive number of columns, got {nlon!r}")
    exact_lmax = rows.exact_degree // 2 + 1
    fft_mmax = (nlon + 1) // 2
    if lmax is None and mmax is None:
        return default_truncation(rows.count, nlon)
    if lmax is None:
        lmax = exact_lmax
    elif isinstance(lmax, bool) or not isinstance(lmax, int) or not 1 <= lmax <= exact_lmax:
        raise InvalidValue(
            key,
            f"lmax {lmax!r} cannot be integrated on {rows.count} rows: their quadrature is exact to degree "
            f"{rows.exact_degree} in cos(theta), enough for degrees l < lmax = {exact_lmax} at most "
            f"(2 (lmax - 1) <= {rows.exact_degree}); use lmax between 1 and {exact_lmax}, or more rows",
        )
    if mmax is None:
        mmax = min(lmax, fft_mmax)
    elif isinstance(mmax, bool) or not isinstance(mmax, int) or not 1 <= mmax <= min(lmax, fft_mmax):
        raise InvalidValue(
            key,
            f"mmax {mmax!r} must be between 1 and {min(lmax, fft_mmax)}: at most lmax = {lmax} (m <= l) and "
            f"below the Nyquist wavenumber of {nlon} columns ({fft_mmax})",
        )
    return lmax, mmax


class _TransformBase(nn.Module):
    def __init__(self, lats_deg, nlon: int, lmax: int | None, mmax: int | None, key: str):
        super().__init__()
        self.rows = LatitudeRows(lats_deg, key=key)
        self.nlat, self.nlon = self.rows.count, nlon
        self.lmax, self.mmax = resolve_truncation(self.rows, nlon, lmax, mmax, key)
        self.rule = self.rows.rule

    def extra_repr(self) -> str:
        return f"nlat={self.nlat}, nlon={self.nlon}, lmax={self.lmax}, mmax={self.mmax}, rule={self.rule}"

    def _buffer(self, name: str, table: np.ndarray) -> None:
        # float32: the tests' round trips hold to ~1e-6. Persistent: a checkpoint or an exported model carries
        # the tables of the grid it was trained on, so a model rebuilt where the data (and so its latitudes) is
        # not at hand still computes what it was trained to.
        self.register_buffer(name, torch.tensor(table, dtype=torch.float32))


def _saved_copy(table: torch.Tensor) -> torch.Tensor:
    """The table as autograd should keep it for the backward pass: a copy when gradients are recorded. DDP
    broadcasts a module's buffers in place at every forward (``broadcast_buffers``), so with several forwards
    before one backward (multi-step training) the buffer autograd saved would have changed under it (torch 2.11
    refuses that backward); the copy is the patch grid's table, a fraction of a MB per block."""
    return table.clone() if torch.is_grad_enabled() else table


class SphericalHarmonicTransform(_TransformBase):
    """(..., nlat, nlon) real -> (..., lmax, mmax) complex64 coefficients of the orthonormal Y_l^m (module
    docstring); ``lats_deg`` the rows' latitudes in degrees, in the order of the input's rows."""

    def __init__(
        self, lats_deg, nlon: int, lmax: int | None = None, mmax: int | None = None, key: str = "latitudes"
    ):
        super().__init__(lats_deg, nlon, lmax, mmax, key)
        legendre = legendre_table(self.lmax, self.mmax, self.rows.theta)
        # 2 pi: the longitude integral is 2 pi times the mean that rfft(norm="forward") gives.
        self._buffer("analysis", 2.0 * math.pi * legendre * self.rows.weights)

    def forward(self, field: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=field.device.type, enabled=False):
            rows = torch.fft.rfft(field.float(), dim=-1, norm="forward")[
                ..., : self.mmax
            ]  # (..., nlat, mmax)
            parts = torch.view_as_real(rows)  # (..., nlat, mmax, 2)
            coefficients = torch.einsum("...jmc,mlj->...lmc", parts, _saved_copy(self.analysis))
            return torch.view_as_complex(coefficients.contiguous())


class InverseSphericalHarmonicTransform(_TransformBase):
    """(..., lmax, mmax) complex coefficients -> (..., nlat, nlon) float32 field: the sum of a_l^m Y_l^m
    over l < lmax and -l <= m <= l, with a_l^-m = (-1)^m conj(a_l^m) (a real field; the imaginary part of
    a_l^0 is ignored)."""

    def __init__(
        self, lats_deg, nlon: int, lmax: int | None = None, mmax: int | None = None, key: str = "latitudes"
    ):
        super().__init__(lats_deg, nlon, lmax, mmax, key)
        self._buffer("synthesis", legendre_table(self.lmax, self.mmax, self.rows.theta))

    def forward(self, coefficients: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=coefficients.device.type, enabled=False):
            parts = torch.view_as_real(coefficients.to(torch.complex64))  # (..., lmax, mmax, 2)
            rows = torch.einsum("...lmc,mlj->...jmc", parts, _saved_copy(self.synthesis))
            # irfft pads the orders above mmax with zeros; norm="forward" makes it the plain sum over m.
            return torch.fft.irfft(
                torch.view_as_complex(rows.contiguous()), n=self.nlon, dim=-1, norm="forward"
            )


def sht_flops(nlat: int, nlon: int, lmax: int, mmax: int) -> int:
    """Forward FLOPs of one transform (either direction) of one channel, as it runs: the real FFTs of the rows,
    counted as a complex FFT's 5 n log2 n each (the count :func:`dlscale.models.afno.afno_flops_per_token_grid`
    uses), and the dense Legendre product, a multiply-add for the real and imaginary part of each
    (m, l, row): 4 * mmax * lmax * nlat (the zeros at m > l are multiplied too)."""
    ffts = round(5 * nlon * math.log2(nlon)) * nlat if nlon > 1 else 0
    return ffts + 4 * mmax * lmax * nlat
