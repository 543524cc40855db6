"""The coordinates of an ERA5 split's grid: the files' own datasets, checked, else the tutorial's formula."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from dlscale.data.era5.coordinates import (
    GridCoordinates,
    check_same_grid,
    formula_latitudes,
    formula_longitudes,
    read_coordinates,
)
from dlscale.errors import DataError
from dlscale.workloads.era5_metrics import grid_extent

EQUIANGULAR = GridCoordinates(87.1875 - 5.625 * np.arange(32), 5.625 * np.arange(64), True, True)


def year_file(path: Path, **coordinates: np.ndarray) -> h5py.File:
    with h5py.File(path, "w") as handle:
        for key, values in coordinates.items():
            handle.create_dataset(key, data=values)
    return h5py.File(path, "r")


def test_the_formula_is_the_tutorials_grid_with_pole_rows():
    np.testing.assert_allclose(formula_latitudes(721)[[0, 360, 720]], [90.0, 0.0, -90.0])
    np.testing.assert_allclose(formula_longitudes(1440)[[0, 1, 1439]], [0.0, 0.25, 359.75])


def test_a_file_without_coordinates_gets_the_formula_and_says_so(tmp_path):
    with year_file(tmp_path / "2018.h5") as handle:
        grid = read_coordinates(handle, tmp_path / "2018.h5", 5, 8)
    np.testing.assert_array_equal(grid.latitudes, [90.0, 45.0, 0.0, -45.0, -90.0])
    np.testing.assert_array_equal(grid.longitudes, 45.0 * np.arange(8))
    assert "the files hold no latitude/longitude" in grid.describe()


def test_each_axis_the_file_holds_is_read_and_the_other_comes_from_the_formula(tmp_path):
    latitudes = np.array([80.0, 40.0, 0.0, -40.0, -80.0])
    with year_file(tmp_path / "2018.h5", latitude=latitudes) as handle:
        grid = read_coordinates(handle, tmp_path / "2018.h5", 5, 8)
    np.testing.assert_array_equal(grid.latitudes, latitudes)
    np.testing.assert_array_equal(grid.longitudes, 45.0 * np.arange(8))
    assert "latitude from the files, longitude (absent there) from the tutorial's grid" in grid.describe()


@pytest.mark.parametrize(
    ("coordinates", "message"),
    [
        (
            {"latitude": np.zeros((5, 1))},
            "dataset 'latitude' has shape (5, 1); expected one value in degrees",
        ),
        (
            {"latitude": np.linspace(90, -90, 4)},
            "has shape (4,); expected one value in degrees per grid row (5 rows)",
        ),
        ({"longitude": np.arange(7.0)}, "per grid column (8 columns)"),
        ({"latitude": np.array([80.0, 40.0, np.nan, -40.0, -80.0])}, "holds a non-finite value"),
        ({"latitude": np.array([80.0, 40.0, 40.0, -40.0, -80.0])}, "not strictly increasing or decreasing"),
        ({"longitude": np.array([0.0, 45, 90, 80, 180, 225, 270, 315])}, "not strictly increasing"),
        (
            {"latitude": np.array([100.0, 50, 0, -50, -100])},
            "a value of 100 degrees, expected latitudes within",
        ),
        ({"latitude": np.array(["a", "b", "c", "d", "e"], dtype="S1")}, "has dtype |S1"),
    ],
)
def test_bad_coordinates_name_the_file_the_dataset_and_what_was_expected(tmp_path, coordinates, message):
    path = tmp_path / "2018.h5"
    with year_file(path, **coordinates) as handle, pytest.raises(DataError, match="2018.h5") as caught:
        read_coordinates(handle, path, 5, 8)
    assert message in str(caught.value)


def test_files_of_one_split_must_share_their_grid(tmp_path):
    shifted = GridCoordinates(EQUIANGULAR.latitudes - 1.0, EQUIANGULAR.longitudes, True, True)
    check_same_grid(EQUIANGULAR, tmp_path / "2017.h5", EQUIANGULAR, tmp_path / "2018.h5")
    with pytest.raises(DataError, match=r"2018.h5: its latitudes .* differ from those of 2017.h5"):
        check_same_grid(EQUIANGULAR, tmp_path / "2017.h5", shifted, tmp_path / "2018.h5")
    # The same values, but one file has them from the formula: its grid is a guess, not the same grid.
    guessed = GridCoordinates(EQUIANGULAR.latitudes, EQUIANGULAR.longitudes, True, False)
    with pytest.raises(DataError, match="its longitudes"):
        check_same_grid(EQUIANGULAR, tmp_path / "2017.h5", guessed, tmp_path / "2018.h5")


def test_the_figures_extent_lies_half_a_cell_beyond_the_outer_rows_and_columns():
    extent, region = grid_extent(EQUIANGULAR, 32, 64)
    # (west, east, bottom edge, top edge): 90 S to 90 N exactly on a grid without pole rows.
    assert extent == pytest.approx((-2.8125, 357.1875, -90.0, 90.0))
    assert region is None
    extent, region = grid_extent(EQUIANGULAR, 16, 32)
    assert extent == pytest.approx((-2.8125, 177.1875, 0.0, 90.0))
    assert region == "top-left 16x32 crop of the 32x64 grid"
    south_to_north = GridCoordinates(EQUIANGULAR.latitudes[::-1].copy(), EQUIANGULAR.longitudes, True, True)
    extent, _ = grid_extent(south_to_north, 32, 64)
    assert extent[2:] == pytest.approx((90.0, -90.0))  # row 0 (south) drawn at the top, labelled as such
