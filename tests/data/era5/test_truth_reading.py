"""The truth store ``dlscale score`` reads, damaged: a deleted chunk and a chunk of NaN are times the up-front scan
reports by variable and time (``TruthStore.unusable_times``); a truncated, garbage or empty chunk, a link to a
file that is no chunk, a link loop, a dangling link and a directory in a chunk's place are one DataError naming
the store, the variable and the time, from the scan and from every read; a clean store has no unusable time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("xarray")
pytest.importorskip("zarr")

from damaged_stores import UNREADABLE, chunk_of, damage  # noqa: E402
from era5_stores import grid, random_truth, six_hourly_times, write_wb2  # noqa: E402

from dlscale.data.era5.truth_reading import TruthStore  # noqa: E402
from dlscale.errors import DataError  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Consolidated metadata:UserWarning")
HEIGHT, WIDTH, STEPS = 8, 16, 4
CHANNELS = ["z500", "t850", "t2m"]
TIMES = six_hourly_times([2018], STEPS).astype("datetime64[ns]")


@pytest.fixture(scope="module")
def clean_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_wb2(
        tmp_path_factory.mktemp("truth") / "truth.zarr", random_truth(STEPS, HEIGHT, WIDTH), TIMES
    )


def open_truth(path: Path) -> TruthStore:
    return TruthStore.open(str(path), CHANNELS, *grid(HEIGHT, WIDTH))


def test_a_clean_store_has_no_unusable_time(clean_store):
    store = open_truth(clean_store)
    try:
        # valid times repeat across initial times and leads: each is read once
        assert store.unusable_times(np.concatenate([TIMES, TIMES[1:3]])) == {}
    finally:
        store.close()


def test_a_deleted_chunk_and_a_nan_chunk_are_unusable_times_naming_the_variable(tmp_path):
    truth = random_truth(STEPS, HEIGHT, WIDTH)
    truth["t850"][2] = np.nan  # a chunk of NaN: temperature at time 2 (its other levels are finite)
    path = write_wb2(tmp_path / "truth.zarr", truth, TIMES)
    damage(chunk_of(path, "2m_temperature", 1), "missing")
    store = open_truth(path)
    try:
        unusable = store.unusable_times(TIMES)
    finally:
        store.close()
    assert sorted(unusable) == [TIMES[1], TIMES[2]]
    assert "t2m" in unusable[TIMES[1]] and "'2m_temperature'" in unusable[TIMES[1]]
    assert "missing" in unusable[TIMES[1]] and "2m_temperature/1.0.0" in unusable[TIMES[1]]
    assert "t850" in unusable[TIMES[2]] and "'temperature' at 850 hPa" in unusable[TIMES[2]]
    assert f"NaN at {HEIGHT * WIDTH} of {HEIGHT * WIDTH} grid points" in unusable[TIMES[2]]
    assert "z500" not in " ".join(unusable.values())


def test_a_time_the_store_lacks_is_unusable(clean_store):
    store = open_truth(clean_store)
    try:
        later = TIMES[-1] + np.timedelta64(6, "h")
        assert list(store.unusable_times(np.array([TIMES[0], later]))) == [later]
    finally:
        store.close()


@pytest.mark.parametrize("kind", UNREADABLE)
def test_an_unreadable_chunk_is_one_line_naming_store_variable_and_time(kind, clean_store, tmp_path):
    import shutil

    path = tmp_path / "truth.zarr"
    shutil.copytree(clean_store, path, symlinks=True)
    damage(chunk_of(path, "2m_temperature", 2), kind)
    store = open_truth(path)
    try:
        for read in (lambda: store.read(TIMES[1:]), lambda: store.unusable_times(TIMES)):
            with pytest.raises(DataError) as caught:
                read()
            message = str(caught.value)
            assert "\n" not in message
            assert message.startswith(f"{path}: variable '2m_temperature'"), message
            assert "2018-01-01T12" in message and "2m_temperature/2.0.0" in message
        assert store.read(TIMES[:2]).shape == (2, 3, HEIGHT, WIDTH)  # the other times still read
    finally:
        store.close()
