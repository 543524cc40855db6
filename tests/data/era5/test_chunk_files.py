"""Where a local zarr array keeps its chunks (format 2 with either separator, format 3 with either key encoding),
the checks of a read against a format 3 store as against a format 2 one, and the rule for links: a chunk that is a
link out of the store is read when its target is a valid chunk."""

from __future__ import annotations

import inspect
import shutil

import numpy as np
import pytest

xarray = pytest.importorskip("xarray")
pytest.importorskip("zarr")

from damaged_stores import chunk_of, damage  # noqa: E402
from era5_stores import grid, random_truth, six_hourly_times, write_wb2  # noqa: E402

from dlscale.data.era5.chunk_files import ChunkLayout  # noqa: E402
from dlscale.data.era5.truth_reading import TruthStore  # noqa: E402
from dlscale.errors import DataError  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Consolidated metadata:UserWarning")
HEIGHT, WIDTH, STEPS = 4, 8, 3
TIMES = six_hourly_times([2018], STEPS).astype("datetime64[ns]")


@pytest.mark.parametrize(
    ("metadata", "chunk"),
    [
        ({"shape": [5, 4, 6], "chunks": [2, 4, 3], "dtype": "<f4"}, "t/2.0.1"),
        ({"shape": [5, 4, 6], "chunks": [2, 4, 3], "dtype": "<f4", "dimension_separator": "/"}, "t/2/0/1"),
        (
            {
                "zarr_format": 3,
                "shape": [5, 4, 6],
                "data_type": "float32",
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 4, 3]}},
            },
            "t/c/2/0/1",
        ),
        (
            {
                "zarr_format": 3,
                "shape": [5, 4, 6],
                "data_type": "float32",
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 4, 3]}},
                "chunk_key_encoding": {"name": "v2", "configuration": {"separator": "."}},
            },
            "t/2.0.1",
        ),
    ],
    ids=["v2", "v2-slash", "v3", "v3-v2-keys"],
)
def test_chunk_names_of_each_format(metadata, chunk, tmp_path):
    layout = ChunkLayout._from_metadata(tmp_path, "t", metadata)
    # time steps 4 and the last (4) lie in the third chunk along time; all of axis 1, columns 3..5 the second
    selection = {0: [4], 2: [3, 5]}
    assert [layout.name(index) for index in layout.indices(selection)] == [chunk]
    assert len(list(layout.indices({}))) == 3 * 1 * 2
    assert layout.largest_bytes is not None and layout.largest_bytes >= 2 * 4 * 3 * 4


def test_a_chunk_linked_to_a_valid_chunk_outside_the_store_is_read(tmp_path):
    truth = random_truth(STEPS, HEIGHT, WIDTH)
    path = write_wb2(tmp_path / "truth.zarr", truth, TIMES)
    chunk = chunk_of(path, "2m_temperature", 1)
    outside = tmp_path / "kept-elsewhere"
    shutil.move(chunk, outside)
    chunk.symlink_to(outside)
    store = TruthStore.open(str(path), ["t2m"], *grid(HEIGHT, WIDTH))
    try:
        np.testing.assert_array_equal(store.read(TIMES)[:, 0], truth["t2m"])
        assert store.unusable_times(TIMES) == {}
    finally:
        store.close()


@pytest.mark.skipif(
    "zarr_format" not in inspect.signature(xarray.Dataset.to_zarr).parameters,
    reason="this xarray writes zarr format 2 only",
)
def test_a_format_3_store_is_checked_as_a_format_2_one(tmp_path):
    latitude, longitude = grid(HEIGHT, WIDTH)
    values = random_truth(STEPS, HEIGHT, WIDTH)["t2m"]
    dataset = xarray.Dataset(
        {"2m_temperature": (("time", "latitude", "longitude"), values)},
        coords={"time": TIMES, "latitude": latitude, "longitude": longitude},
    )
    dataset["2m_temperature"].encoding["chunks"] = (1, HEIGHT, WIDTH)
    path = tmp_path / "v3.zarr"
    dataset.to_zarr(path, zarr_format=3, consolidated=True)
    damage(path / "2m_temperature" / "c" / "1" / "0" / "0", "missing")
    damage(path / "2m_temperature" / "c" / "2" / "0" / "0", "directory")
    store = TruthStore.open(str(path), ["t2m"], latitude, longitude)
    try:
        np.testing.assert_array_equal(store.read(TIMES[:1])[:, 0], values[:1])
        with pytest.raises(
            DataError, match=r"at 2018-01-01T12: its chunk 2m_temperature/c/2/0/0 is a directory"
        ):
            store.read(TIMES[1:])
        with pytest.raises(DataError, match="is a directory"):
            store.unusable_times(TIMES)
        unusable = store.unusable_times(TIMES[:2])
        assert (
            list(unusable) == [TIMES[1]]
            and "its chunk 2m_temperature/c/1/0/0 is missing" in unusable[TIMES[1]]
        )
    finally:
        store.close()
