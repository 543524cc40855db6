"""A read of a damaged file through xarray is one DataError line whatever failed underneath: a zarr chunk that is
truncated (numcodecs' RuntimeError), a link loop (OSError), a compressed netCDF chunk overwritten (HDF5's
OSError). The forecast reader of ``dlscale score`` uses the same pieces as the truth's: ``read_forecast_field``
below is the pattern (metadata checked before opening, chunk files before reading, values through
``read_values``); and import-era5's netCDF source names the file, the variable and the time."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

xarray = pytest.importorskip("xarray")
pytest.importorskip("zarr")

from damaged_stores import damage, name_pickle_codec  # noqa: E402
from era5_stores import ZARR_FORMAT_2  # noqa: E402

from dlscale.data.era5.chunk_files import StoreChunks  # noqa: E402
from dlscale.data.era5.damaged_reads import read_values  # noqa: E402
from dlscale.data.era5.importing.source import open_source  # noqa: E402
from dlscale.data.era5.store_metadata import check_local_zarr_metadata  # noqa: E402
from dlscale.errors import DataError  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Consolidated metadata:UserWarning")
TIMES = np.array(["2018-01-01T00", "2018-01-01T12", "2018-01-02T00"], dtype="datetime64[ns]")
LEADS = np.array([0, 6], dtype="timedelta64[h]").astype("timedelta64[ns]")


def forecast(path: Path) -> Path:
    """A forecast in WeatherBench2's layout, a chunk per initial time and lead (zarr) or compressed (netCDF)."""
    values = np.random.default_rng(0).standard_normal((3, 2, 4, 8)).astype(np.float32)
    dataset = xarray.Dataset(
        {"2m_temperature": (("time", "prediction_timedelta", "latitude", "longitude"), values)},
        coords={
            "time": TIMES,
            "prediction_timedelta": LEADS,
            "latitude": np.linspace(60, -60, 4),
            "longitude": np.arange(8) * 45.0,
        },
    )
    if path.suffix == ".nc":
        encoding = {"2m_temperature": {"zlib": True, "chunksizes": (1, 1, 4, 8)}}
        dataset.to_netcdf(path, engine="h5netcdf", encoding=encoding)
    else:
        dataset["2m_temperature"].encoding["chunks"] = (1, 1, 4, 8)
        dataset.to_zarr(path, mode="w", consolidated=True, **ZARR_FORMAT_2)
    return path


def read_forecast_field(path: Path, variable: str, selection: dict) -> np.ndarray:
    """The pattern for a reader of a user's zarr store or netCDF file (``ForecastFile``'s open and read)."""
    if path.is_dir():
        check_local_zarr_metadata(path)  # before xarray reads any metadata: a codec that runs code is refused
    with xarray.open_dataset(path, engine="zarr" if path.is_dir() else None, chunks=None) as dataset:
        array = dataset[variable]
        what = f"variable {variable!r} at initial time index {selection['time']}"
        chunks = StoreChunks(path if path.is_dir() else None)
        checked = chunks.check(variable, array.dims, selection, what)  # directories, loops, pipes: refused
        return read_values(array.isel(selection), str(path), what + checked.text())  # decoding failures


@pytest.mark.parametrize("kind", ["truncated", "link_loop", "directory", "pipe"])
def test_a_damaged_zarr_forecast_chunk_is_one_line(kind, tmp_path):
    path = forecast(tmp_path / "forecast.zarr")
    selection = {"time": 1, "prediction_timedelta": 1}
    assert read_forecast_field(path, "2m_temperature", selection).shape == (4, 8)
    damage(path / "2m_temperature" / "1.1.0.0", kind)
    with pytest.raises(DataError) as raised:
        read_forecast_field(path, "2m_temperature", selection)
    message = str(raised.value)
    assert message.startswith(f"{path}: variable '2m_temperature' at initial time index 1")
    assert "2m_temperature/1.1.0.0" in message and "\n" not in message
    assert read_forecast_field(path, "2m_temperature", {"time": 0, "prediction_timedelta": 1}).shape == (4, 8)


def test_a_forecast_naming_the_pickle_codec_is_refused_before_opening(tmp_path):
    path = forecast(tmp_path / "forecast.zarr")
    name_pickle_codec(path, "2m_temperature", tmp_path / "code-ran")
    with pytest.raises(DataError, match="names the codec 'pickle'"):
        read_forecast_field(path, "2m_temperature", {"time": 0, "prediction_timedelta": 0})
    assert not (tmp_path / "code-ran").exists()


def overwrite_chunk(path: Path, variable: str, index: int) -> None:
    """Overwrite the bytes of one compressed HDF5 chunk of ``variable`` in place: the file still opens."""
    with h5py.File(path, "r") as handle:
        info = handle[variable].id.get_chunk_info(index)
    with path.open("r+b") as file:
        file.seek(info.byte_offset)
        file.write(b"\xff" * info.size)


def test_an_overwritten_netcdf_chunk_is_one_line(tmp_path):
    path = forecast(tmp_path / "forecast.nc")
    overwrite_chunk(path, "2m_temperature", 3)  # time 1, lead 1
    with pytest.raises(DataError) as raised:
        read_forecast_field(path, "2m_temperature", {"time": 1, "prediction_timedelta": 1})
    assert str(raised.value).startswith(
        f"{path}: variable '2m_temperature' at initial time index 1 cannot be read"
    )
    assert "OSError" in str(raised.value) and "\n" not in str(raised.value)


def test_an_overwritten_chunk_of_a_netcdf_source_names_the_file_variable_and_time(tmp_path):
    values = np.random.default_rng(1).standard_normal((3, 5, 8)).astype(np.float32)
    path = tmp_path / "era5_single_2018.nc"
    xarray.Dataset(
        {"t2m": (("valid_time", "latitude", "longitude"), values)},
        coords={"valid_time": TIMES, "latitude": np.linspace(90, -90, 5), "longitude": np.arange(8) * 45.0},
    ).to_netcdf(path, engine="h5netcdf", encoding={"t2m": {"zlib": True, "chunksizes": (1, 5, 8)}})
    overwrite_chunk(path, "t2m", 2)
    source = open_source(str(path))
    try:
        np.testing.assert_array_equal(source.read("t2m", None, TIMES[:2]), values[:2])
        with pytest.raises(DataError) as raised:
            source.read("t2m", None, TIMES)
    finally:
        source.close()
    message = str(raised.value)
    assert message.startswith(f"{path}: variable 't2m' cannot be read at 2018-01-02T00: OSError")
    assert "the file is damaged" in message and "\n" not in message


def test_a_store_copied_with_its_links_reads_like_the_original(tmp_path):
    """The chunk checks follow links: a store of links to another store's chunks reads as that store."""
    original = forecast(tmp_path / "forecast.zarr")
    linked = tmp_path / "linked.zarr"
    shutil.copytree(original, linked, copy_function=lambda source, target: Path(target).symlink_to(source))
    selection = {"time": 2, "prediction_timedelta": 0}
    np.testing.assert_array_equal(
        read_forecast_field(linked, "2m_temperature", selection),
        read_forecast_field(original, "2m_temperature", selection),
    )
