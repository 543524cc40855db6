"""The spherical harmonic transform against independent math: exact quadrature of cos^k, round trips of
band-limited fields, closed-form Y_l^m, the phase of a longitude shift, and the grids it refuses."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dlscale.errors import InvalidValue
from dlscale.models.spherical_harmonics import (
    InverseSphericalHarmonicTransform,
    LatitudeRows,
    SphericalHarmonicTransform,
)

WITH_POLES = np.linspace(90.0, -90.0, 33)  # 33 rows, 5.625 degrees apart, both poles
CELL_CENTRES = 90.0 - 180.0 * (np.arange(32) + 0.5) / 32  # WeatherBench2's 32 rows at +-87.1875
INTERIOR = 90.0 - 180.0 * (np.arange(32) + 1) / 33  # 32 rows, no pole, a spacing from each
CROPPED = np.linspace(90.0, -90.0, 25)[:24]  # the top 24 rows of a 25-row grid: no south pole row
PATCH_CENTRES = 90.0 - 7.5 * (2 * np.arange(12) + 0.5)  # the centres of that crop's 2-row patches
GRIDS = {
    "with_poles": (WITH_POLES, "clenshaw-curtis"),
    "cell_centres": (CELL_CENTRES, "fejer-1"),
    "interior": (INTERIOR, "fejer-2"),
    "cropped": (CROPPED, "interpolatory"),
    "patch_centres": (PATCH_CENTRES, "interpolatory"),
}


@pytest.mark.parametrize("name", list(GRIDS))
def test_quadrature_integrates_powers_of_cos_theta_up_to_the_grids_degree(name):
    lats, rule = GRIDS[name]
    rows = LatitudeRows(lats)
    assert rows.rule == rule
    x = np.cos(np.radians(90.0 - lats))  # independent of the module's colatitudes
    for k in range(len(lats)):  # degree n - 1, the claimed exactness
        exact = (1 + (-1) ** k) / (k + 1)  # integral of x^k over [-1, 1]
        assert rows.weights @ x**k == pytest.approx(exact, abs=1e-12), k
    assert rows.exact_degree == len(lats) - 1


def band_limited_coefficients(lmax: int, mmax: int, batch: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """Random a_l^m for l < lmax, m <= min(l, mmax - 1), with a_l^0 real (a real field)."""
    generator = torch.Generator().manual_seed(seed)
    parts = torch.randn(*batch, lmax, mmax, 2, generator=generator, dtype=torch.float64)
    parts[..., 0, 1] = 0.0
    keep = torch.ones(lmax, mmax).tril().bool()  # m <= l
    return torch.view_as_complex(parts).where(keep, 0).to(torch.complex64)


@pytest.mark.parametrize("name", ["with_poles", "cell_centres", "cropped"])
def test_round_trip_of_a_band_limited_field(name):
    lats, _ = GRIDS[name]
    nlon = 2 * len(lats)
    sht, isht = SphericalHarmonicTransform(lats, nlon), InverseSphericalHarmonicTransform(lats, nlon)
    assert (sht.lmax, sht.mmax) == ((len(lats) - 1) // 2 + 1,) * 2
    coefficients = band_limited_coefficients(sht.lmax, sht.mmax, batch=(2, 3))
    field = isht(coefficients)
    assert field.shape == (2, 3, len(lats), nlon) and field.dtype == torch.float32
    recovered = sht(field)
    assert recovered.shape == (2, 3, sht.lmax, sht.mmax) and recovered.dtype == torch.complex64
    scale = coefficients.abs().max()
    torch.testing.assert_close(recovered, coefficients, rtol=0, atol=1e-5 * scale)
    torch.testing.assert_close(isht(recovered), field, rtol=0, atol=1e-5 * field.abs().max())


def test_rows_south_to_north_give_the_same_coefficients():
    nlon = 64
    field = InverseSphericalHarmonicTransform(WITH_POLES, nlon)(band_limited_coefficients(17, 17, batch=(1,)))
    assert field.abs().max() > 0.1  # a field to transform, not zeros
    north_first = SphericalHarmonicTransform(WITH_POLES, nlon)(field)
    south_first = SphericalHarmonicTransform(WITH_POLES[::-1].copy(), nlon)(field.flip(-2))
    torch.testing.assert_close(south_first, north_first, rtol=0, atol=1e-5)


def closed_form_harmonics(theta: np.ndarray, phi: np.ndarray) -> dict[tuple[int, int], np.ndarray]:
    """Y_l^m(theta, phi) written out (orthonormal, Condon-Shortley phase), on the (theta, phi) mesh."""
    t, p = np.meshgrid(theta, phi, indexing="ij")
    c, s = np.cos(t), np.sin(t)
    return {
        (0, 0): np.full(t.shape, 1 / math.sqrt(4 * math.pi), dtype=complex),
        (1, 0): math.sqrt(3 / (4 * math.pi)) * c + 0j,
        (1, 1): -math.sqrt(3 / (8 * math.pi)) * s * np.exp(1j * p),
        (2, 0): math.sqrt(5 / (16 * math.pi)) * (3 * c**2 - 1) + 0j,
        (2, 1): -math.sqrt(15 / (8 * math.pi)) * s * c * np.exp(1j * p),
        (3, 3): -math.sqrt(35 / (64 * math.pi)) * s**3 * np.exp(3j * p),
        (4, 2): 3 / 8 * math.sqrt(5 / (2 * math.pi)) * s**2 * (7 * c**2 - 1) * np.exp(2j * p),
    }


@pytest.mark.parametrize("name", ["with_poles", "cell_centres"])
def test_known_harmonics_synthesized_and_analysed(name):
    lats, _ = GRIDS[name]
    nlon = 2 * len(lats)
    sht, isht = SphericalHarmonicTransform(lats, nlon), InverseSphericalHarmonicTransform(lats, nlon)
    theta, phi = np.radians(90.0 - lats), 2 * math.pi * np.arange(nlon) / nlon
    for (degree, order), harmonic in closed_form_harmonics(theta, phi).items():
        # The real field with a_l^m = 1 (and a_l^-m = (-1)^m): Y_l^0, or 2 Re Y_l^m for m > 0.
        real_field = harmonic.real if order == 0 else 2 * harmonic.real
        one_hot = torch.zeros(sht.lmax, sht.mmax, dtype=torch.complex64)
        one_hot[degree, order] = 1
        expected = torch.tensor(real_field, dtype=torch.float32)
        torch.testing.assert_close(isht(one_hot), expected, rtol=0, atol=2e-6)
        # Analysis finds that one coefficient; the field 2 Im Y_l^m is a_l^m = -i.
        torch.testing.assert_close(sht(expected), one_hot, rtol=0, atol=2e-6)
        if order > 0:
            imaginary = torch.tensor(2 * harmonic.imag, dtype=torch.float32)
            torch.testing.assert_close(sht(imaginary), -1j * one_hot, rtol=0, atol=2e-6)


@pytest.mark.parametrize("shift", [1, 5, -3])
def test_a_longitude_shift_multiplies_each_order_by_its_phase(shift):
    nlon = 64
    sht = SphericalHarmonicTransform(WITH_POLES, nlon)
    field = InverseSphericalHarmonicTransform(WITH_POLES, nlon)(band_limited_coefficients(17, 17, batch=(2,)))
    assert field.abs().max() > 0.1
    # torch.roll by k: column j takes column j - k, so the field moves east by 2 pi k / nlon, and
    # f(phi - delta) has a_l^m exp(-i m delta).
    phase = torch.exp(-1j * torch.arange(sht.mmax, dtype=torch.float64) * 2 * math.pi * shift / nlon)
    expected = sht(field) * phase.to(torch.complex64)
    torch.testing.assert_close(sht(field.roll(shift, dims=-1)), expected, rtol=0, atol=1e-5)


def test_autocast_leaves_the_transform_in_float32():
    nlon = 64
    sht, isht = (
        SphericalHarmonicTransform(WITH_POLES, nlon),
        InverseSphericalHarmonicTransform(WITH_POLES, nlon),
    )
    field = isht(band_limited_coefficients(17, 17, batch=(2,)))
    assert field.abs().max() > 0.1
    with torch.autocast("cpu", dtype=torch.bfloat16):
        coefficients = sht(field)
        back = isht(coefficients)
    assert coefficients.dtype == torch.complex64 and back.dtype == torch.float32
    torch.testing.assert_close(back, field, rtol=0, atol=1e-5 * field.abs().max())


@pytest.mark.parametrize(
    "lats, options, message",
    [
        (np.array([90.0, 0.0, -60.0, -90.0]), {}, r"not equally spaced \(row 1 is at 0, .* has it at 30\)"),
        (np.array([91.0, 0.0, -89.0]), {}, "row 0 at 91 degrees is outside -90 to 90"),
        (np.array([90.0, 0.0, 0.0, -90.0]), {}, r"rows 1 and 2 are both at 0 degrees \(duplicated\)"),
        (np.array([90.0, -90.0, 0.0]), {}, "must be sorted"),
        (np.array([90.0, np.nan, -90.0]), {}, "row 1 is nan"),
        (np.array([45.0]), {}, "needs at least 2 rows"),
        (np.linspace(90.0, 30.0, 21), {}, "leave 0 degrees uncovered at the north pole and 120 at the south"),
        (WITH_POLES, {"lmax": 18}, r"lmax 18 cannot be integrated on 33 rows: .* lmax = 17 at most"),
        (WITH_POLES, {"mmax": 18}, "mmax 18 must be between 1 and 17"),
        (WITH_POLES, {"nlon": 0}, "nlon must be a positive number of columns, got 0"),
    ],
    ids=[
        "unequal",
        "outside",
        "duplicated",
        "unsorted",
        "nan",
        "one_row",
        "regional",
        "lmax",
        "mmax",
        "nlon",
    ],
)
def test_grids_the_transform_cannot_integrate_are_refused_in_one_line(lats, options, message):
    options = {"nlon": 64, **options}
    with pytest.raises(InvalidValue, match=message) as refused:
        SphericalHarmonicTransform(lats, **options)
    text = str(refused.value)
    assert text.startswith("latitudes: ") and "\n" not in text
    if "lmax" not in options and "mmax" not in options and options["nlon"]:
        assert f"({len(lats)} rows)" in text  # the message shows the latitudes it refused
