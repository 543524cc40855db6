"""The reference solver: 2D heat conduction in a heterogeneous medium on a periodic grid (numpy).

The equation is ``du/dt = div(kappa(x, y) grad u)`` on the unit square with periodic boundaries: ``u`` is a
temperature (or a concentration), ``kappa > 0`` a diffusivity that varies in space. The surrogate learns one
frame-to-frame step of this solver.

Discretization: finite volumes on N x N cells of side ``dx = 1 / N`` (arrays are indexed ``[..., y, x]``). The
heat that crosses a face in unit time is ``kappa_face * (u_neighbour - u_cell) / dx`` per unit length, with
``kappa_face`` the mean of the two cells the face separates. Every face's exchange is added to one cell and
taken from the other, so ``sum(u)`` (total heat) changes only by float rounding; a centred
``kappa * laplacian(u)`` form would not have that property once kappa varies.

Time stepping is explicit (forward Euler). The update of a cell is a weighted mean of itself and its four
neighbours with non-negative weights as long as ``dt * (sum of its four face kappas) / dx^2 <= 1``, which
``dt <= dx^2 / (4 max kappa)`` guarantees: the scheme is then stable and obeys the discrete maximum principle
(no new extrema, so ``max |u|`` never grows). :func:`stable_dt` takes a safety factor below that bound.

Leading-order truncation errors are O(dx^2) in space and O(dt) = O(dx^2) in time. A Fourier mode
``cos(2 pi (m x + n y))`` under uniform kappa is an exact eigenvector of the discrete operator, with rate
``kappa * (4 / dx^2) * (sin^2(pi m dx) + sin^2(pi n dx))`` (continuum: ``kappa * 4 pi^2 (m^2 + n^2)``).
"""

from __future__ import annotations

import numpy as np

SAFETY = 0.8  # fraction of the stability limit dx^2 / (4 max kappa) that a time step takes


def stable_dt(dx: float, kappa_max: float, safety: float = SAFETY) -> float:
    """A time step ``safety`` times the explicit scheme's stability limit for diffusivities up to ``kappa_max``."""
    return safety * dx * dx / (4.0 * kappa_max)


def face_diffusivities(kappa: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """kappa on the east faces (between x-cells i and i+1) and on the north faces (y-cells j and j+1)."""
    east = 0.5 * (kappa + np.roll(kappa, -1, axis=-1))
    north = 0.5 * (kappa + np.roll(kappa, -1, axis=-2))
    return east, north


def heat_rate(u: np.ndarray, faces: tuple[np.ndarray, np.ndarray], dx: float) -> np.ndarray:
    """``du/dt = div(kappa grad u)`` in conservative form; ``faces`` from :func:`face_diffusivities`."""
    east, north = faces
    # What each face passes to the cell on its low side; the same amount leaves the cell on its high side.
    through_east = east * (np.roll(u, -1, axis=-1) - u)
    through_north = north * (np.roll(u, -1, axis=-2) - u)
    net = (
        through_east - np.roll(through_east, 1, axis=-1) + through_north - np.roll(through_north, 1, axis=-2)
    )
    return net / (dx * dx)


def advance(u: np.ndarray, kappa: np.ndarray, dt: float, dx: float, steps: int) -> np.ndarray:
    """``u`` after ``steps`` forward-Euler steps of ``dt`` (a new array; leading axes are independent problems).

    Raises ValueError for a ``dt`` beyond the stability limit, where the result would be noise growing without
    bound rather than diffusion.
    """
    if np.any(kappa <= 0):
        raise ValueError("kappa must be positive everywhere")
    limit = dx * dx / (4.0 * float(np.max(kappa)))
    if dt > limit:
        raise ValueError(
            f"dt={dt:.3g} exceeds the explicit stability limit dx^2 / (4 max kappa) = {limit:.3g}"
        )
    faces = face_diffusivities(np.asarray(kappa, dtype=np.float64))
    u = np.array(u, dtype=np.float64)
    for _ in range(steps):
        u += dt * heat_rate(u, faces, dx)
    return u
