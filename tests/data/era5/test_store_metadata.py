"""A store's metadata and the path given as the store, hostile or damaged, as score's truth and import-era5's source
open them (:func:`open_source`): a codec that runs code (numcodecs' pickle) or is unknown, huge or deeply nested
attributes, metadata that is no JSON or no file, an empty directory or file, a file of another format under the
expected name, a link loop as the store. Each is one DataError line naming the store (and the variable or file),
before any chunk is decoded: the pickle's code never runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import pytest

pytest.importorskip("xarray")
pytest.importorskip("zarr")

from damaged_stores import edit_array_metadata, name_pickle_codec  # noqa: E402
from era5_stores import random_truth, six_hourly_times, write_wb2  # noqa: E402

from dlscale.cli import main  # noqa: E402
from dlscale.data.era5.importing.source import open_source  # noqa: E402
from dlscale.data.era5.store_metadata import (  # noqa: E402
    MAX_METADATA_BYTES,
    MAX_NESTING,
    MappedFiles,
    check_zarr_metadata,
)
from dlscale.errors import DataError  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Consolidated metadata:UserWarning")
STEPS = 2


@pytest.fixture(scope="module")
def clean_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    times = six_hourly_times([2018], STEPS)
    return write_wb2(tmp_path_factory.mktemp("store") / "era5.zarr", random_truth(STEPS, 4, 8), times)


@pytest.fixture
def store(clean_store: Path, tmp_path: Path) -> Path:
    copy = tmp_path / clean_store.name
    shutil.copytree(clean_store, copy)
    return copy


def refused(path: Path | str) -> str:
    """The one line open_source refuses ``path`` with."""
    with pytest.raises(DataError) as raised:
        open_source(str(path)).close()
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"{path}: "), message
    return message


def test_a_store_naming_the_pickle_codec_is_refused_before_any_chunk_is_decoded(store, tmp_path, capsys):
    marker = tmp_path / "code-ran"
    name_pickle_codec(store, "2m_temperature", marker)
    message = refused(store)
    assert "variable '2m_temperature' names the codec 'pickle'" in message and "runs any code" in message
    command = [
        "data",
        "import-era5",
        str(store),
        "--out",
        str(tmp_path / "out"),
        "--split",
        "2018:train,2019:valid",
    ]
    assert main(command) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "names the codec 'pickle'" in error[0], error
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_an_unknown_codec_is_refused_naming_it(store):
    edit_array_metadata(
        store, "geopotential", lambda metadata: metadata.update(compressor={"id": "evil-zip"})
    )
    message = refused(store)
    assert "variable 'geopotential' names the codec 'evil-zip'" in message and "blosc, zstd" in message


def test_a_remote_store_is_checked_through_its_consolidated_metadata(store, tmp_path):
    fsspec = pytest.importorskip("fsspec")
    name_pickle_codec(store, "2m_temperature", tmp_path / "code-ran")
    (store / "2m_temperature" / ".zarray").unlink()  # only the consolidated metadata names it
    with pytest.raises(DataError, match=r"variable '2m_temperature' names the codec 'pickle'"):
        check_zarr_metadata(MappedFiles("gs://bucket/era5.zarr", fsspec.get_mapper(f"file://{store}")))


def test_huge_or_deeply_nested_attributes_are_refused(store):
    attributes = store / "geopotential" / ".zattrs"
    original = attributes.read_text()
    attributes.write_text(json.dumps({"history": "x" * (MAX_METADATA_BYTES + 1)}))
    size = attributes.stat().st_size
    assert f"its metadata file geopotential/.zattrs is {size:,} bytes, more than the" in refused(store)
    for depth in (MAX_NESTING + 1, 100_000):  # deeper than allowed; deeper than the JSON parser's recursion
        attributes.write_text('{"nested": ' + "[" * depth + "]" * depth + "}")
        assert "its metadata file geopotential/.zattrs nests JSON more than" in refused(store)
    attributes.write_text(original)
    (store / ".zmetadata").write_bytes(b"\x00\xff not json")
    assert "its metadata file .zmetadata is not JSON" in refused(store)


@pytest.mark.parametrize("kind", ["directory", "link_loop"])
def test_a_metadata_file_that_is_no_file_is_refused(store, kind):
    metadata = store / "temperature" / ".zarray"
    metadata.unlink()
    if kind == "directory":
        metadata.mkdir()
    else:
        metadata.symlink_to(".zarray")
    message = refused(store)
    assert "its metadata file temperature/.zarray is a" in message


def test_paths_that_are_no_store_or_netcdf_file_are_one_line(tmp_path):
    empty_directory = tmp_path / "empty.zarr"
    empty_directory.mkdir()
    assert "holds no zarr metadata" in refused(empty_directory)
    empty_file = tmp_path / "file.zarr"
    empty_file.touch()
    assert "is an empty file, not a zarr store" in refused(empty_file)
    hdf5 = tmp_path / "hdf5.zarr"
    with h5py.File(hdf5, "w") as handle:
        handle["fields"] = [1.0, 2.0]
    assert "is a file, not a zarr store" in refused(hdf5)
    text = tmp_path / "notes.nc"
    text.write_text("not netCDF\n" * 10)
    assert "is not a netCDF file" in refused(text)
    (tmp_path / "empty.nc").touch()
    assert "is an empty file, not netCDF" in refused(tmp_path / "empty.nc")
    loop = tmp_path / "loop.zarr"
    loop.symlink_to("loop.zarr")
    assert "symbolic link loop" in refused(loop)
    dangling = tmp_path / "moved.zarr"
    dangling.symlink_to(tmp_path / "elsewhere.zarr")
    assert "dangling symbolic link" in refused(dangling)
