"""``dlscale data climatology`` refuses years the data lacks, reversed years, an unknown split and a window
WeatherBench2's weights cannot have: one line, exit status 2, nothing written."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dlscale.cli import main

pytest.importorskip("zarr", reason="the era5 extra (zarr) writes the store")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--years", "1990-2019"], "--years 1990-2019: "),  # the tiny preset's train years are 1979-1980
        (["--years", "1980-1979"], "ends before it starts"),
        (["--years", "79-80"], "expected FIRST-LAST years"),
        (["--split", "train,holdout"], "--split train,holdout: expected one or more of train, valid, test"),
        (["--window", "60"], "--window 60: a climatology's window must be an odd number of days"),
        (["--memory-gb", "0"], "--memory-gb 0"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(tiny_era5, tmp_path, capsys, arguments, message):
    root = tmp_path / "era5"
    shutil.copytree(tiny_era5, root)
    assert main(["data", "climatology", "--root", str(root), *arguments]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("dlscale: error: ") and message in error[0], error
    assert sorted(path.name for path in (root / "stats").iterdir()) == sorted(
        path.name for path in (Path(tiny_era5) / "stats").iterdir()
    )
