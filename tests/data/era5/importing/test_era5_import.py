"""``import-era5``'s pieces on tiny sources in the real schemas: values land in their channel, time and latitude
from ARCO-ERA5, WeatherBench2 and CDS netCDF; the statistics equal numpy's; an interrupted import resumes;
bad input is one DataError with nothing half-written; memory stays a few blocks."""

from __future__ import annotations

import json
import re
import sys
import tracemalloc
from pathlib import Path

import h5py
import numpy as np
import pytest

pytest.importorskip("xarray")
pytest.importorskip("zarr")

from damaged_stores import chunk_of, damage  # noqa: E402
from era5_stores import (  # noqa: E402
    random_truth,
    six_hourly_times,
    write_arco,
    write_cds,
    write_wb2,
)

from dlscale.cli import main  # noqa: E402
from dlscale.data.era5.importing import importer  # noqa: E402
from dlscale.data.era5.importing.importer import ImportRequest, import_era5  # noqa: E402
from dlscale.data.era5.importing.names import resolve_channels  # noqa: E402
from dlscale.data.era5.importing.plan import parse_split, year_files  # noqa: E402
from dlscale.data.era5.importing.progress import ByteProgress  # noqa: E402
from dlscale.data.era5.importing.source import ERA5Source  # noqa: E402
from dlscale.data.era5.importing.statistics import StreamingChannelStats  # noqa: E402
from dlscale.data.era5.layout import ERA5_CHANNELS  # noqa: E402
from dlscale.errors import ConfigError, DataError  # noqa: E402

YEARS = [1979, 1980, 1981, 1982]
STEPS = 8  # 6-hourly steps per year: two days
SPLIT = "1979-1980:train,1981:valid,1982:test"
HEIGHT, WIDTH = 9, 16


@pytest.fixture(scope="module")
def times() -> np.ndarray:
    return six_hourly_times(YEARS, STEPS)


@pytest.fixture(scope="module")
def truth(times) -> dict[str, np.ndarray]:
    return random_truth(len(times), HEIGHT, WIDTH)


@pytest.fixture(scope="module")
def arco(tmp_path_factory, truth, times) -> Path:
    return write_arco(tmp_path_factory.mktemp("arco") / "arco.zarr", truth, times)


def run_import(source: Path | str, out: Path, **changes) -> object:
    settings = {"split": SPLIT, "progress": "none", "readers": 2, **changes}
    return import_era5(ImportRequest(str(source), out, **settings), report=lambda line: None)


def stacked(truth: dict[str, np.ndarray], rows: slice, channels=ERA5_CHANNELS) -> np.ndarray:
    return np.stack([truth[name][rows] for name in channels], axis=1)


def read_fields(path: Path) -> np.ndarray:
    with h5py.File(path, "r") as handle:
        return handle["fields"][...]


def assert_imported(out: Path, truth: dict[str, np.ndarray]) -> None:
    """Every year file holds the truth's steps of its year, channel by channel, north row first; the stats are
    numpy's over the train years."""
    for index, (split, year) in enumerate(zip(["train", "train", "valid", "test"], YEARS, strict=True)):
        fields = read_fields(out / split / f"{year}.h5")
        assert fields.dtype == np.float32 and fields.shape == (STEPS, 20, HEIGHT, WIDTH)
        np.testing.assert_array_equal(fields, stacked(truth, slice(index * STEPS, (index + 1) * STEPS)))
    train = stacked(truth, slice(0, 2 * STEPS)).astype(np.float64)
    np.testing.assert_array_equal(
        np.load(out / "stats" / "global_means.npy"),
        train.mean(axis=(0, 2, 3)).reshape(1, -1, 1, 1).astype(np.float32),
    )
    np.testing.assert_allclose(
        np.load(out / "stats" / "global_stds.npy")[0, :, 0, 0], train.std(axis=(0, 2, 3)), rtol=1e-6
    )
    np.testing.assert_allclose(np.load(out / "stats" / "time_means.npy"), train.mean(axis=0)[None], rtol=1e-6)


# --- sources in each schema ---------------------------------------------------------------------------------


def test_arco_hourly_store_gives_the_six_hourly_steps_in_order(arco, truth, tmp_path):
    result = run_import(arco, tmp_path / "out")
    assert result.written == ["train/1979.h5", "train/1980.h5", "valid/1981.h5", "test/1982.h5"]
    assert_imported(tmp_path / "out", truth)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["source"] == {"path": str(arco), "format": "zarr", "latitude_flipped": False}
    assert manifest["selection"]["channels"][14] == {
        "name": "z500",
        "variable": "geopotential",
        "level_hpa": 500,
    }
    assert {"xarray", "zarr", "h5py", "numpy", "dlscale"} <= manifest["versions"].keys()
    assert not (tmp_path / "out" / "import.json").exists()
    with h5py.File(tmp_path / "out" / "train" / "1979.h5", "r") as handle:
        assert handle["latitude"][0] == 90 and handle["latitude"][-1] == -90  # north to south
        assert handle["fields"].chunks is None  # contiguous: the reader's memory-map path


def test_weatherbench2_store_south_to_north_lon_lat_order_is_flipped_north_first(truth, times, tmp_path):
    store = write_wb2(tmp_path / "wb2.zarr", truth, times)
    run_import(store, tmp_path / "out", block_mb=0.025)  # blocks of 2 steps: the two buffers take turns
    assert_imported(tmp_path / "out", truth)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["source"]["latitude_flipped"] is True


@pytest.mark.parametrize("new", [True, False], ids=["new-cds", "old-cds"])
def test_cds_netcdf_files_with_short_names(new, truth, times, tmp_path):
    directory = write_cds(tmp_path / "cds", truth, times, new=new)
    run_import(directory, tmp_path / "out")
    assert_imported(tmp_path / "out", truth)


def test_a_glob_of_netcdf_files_and_another_channel_list(truth, times, tmp_path):
    write_cds(tmp_path / "cds", truth, times, new=True)
    result = run_import(f"{tmp_path}/cds/era5_*.nc", tmp_path / "out", channels=("z500", "t2m"), dt_hours=12)
    fields = read_fields(tmp_path / "out" / "train" / "1980.h5")
    assert result.channels == ["z500", "t2m"] and fields.shape == (STEPS // 2, 2, HEIGHT, WIDTH)
    np.testing.assert_array_equal(fields, stacked(truth, slice(STEPS, 2 * STEPS, 2), ["z500", "t2m"]))


# --- pieces ---------------------------------------------------------------------------------------------------


def test_channel_names_map_to_long_and_short_variables_and_missing_ones_are_named():
    long = resolve_channels(["u10", "z500"], {"10m_u_component_of_wind": None, "geopotential": [500]}, "s")
    assert [(b.variable, b.level_hpa) for b in long] == [
        ("10m_u_component_of_wind", None),
        ("geopotential", 500),
    ]
    short = resolve_channels(["u10", "z500"], {"u10": None, "z": [500, 850]}, "s")
    assert [(b.variable, b.level_hpa) for b in short] == [("u10", None), ("z", 500)]
    with pytest.raises(
        DataError, match=r"no variable for channel tcwv .*'total_column_water_vapour' or 'tcwv'.*has u10, z"
    ):
        resolve_channels(["tcwv"], {"u10": None, "z": [500]}, "s")
    with pytest.raises(
        DataError, match=r"channel r850 needs level 850 hPa of variable 'r', which has levels 500 hPa"
    ):
        resolve_channels(["r850"], {"r": [500]}, "s")


def test_streaming_statistics_equal_numpy_on_blocks_with_a_large_offset():
    rng = np.random.default_rng(3)
    data = (1e5 + 50 * rng.standard_normal((37, 3, 5, 7))).astype(np.float32)  # surface pressure's scale
    stats = StreamingChannelStats(3, 5, 7)
    for start in (0, 1, 10, 25):  # uneven blocks
        stats.update(data[start : {0: 1, 1: 10, 10: 25, 25: 37}[start]])
    exact = data.astype(np.float64)
    np.testing.assert_allclose(stats.mean, exact.mean(axis=(0, 2, 3)), rtol=1e-14)
    np.testing.assert_allclose(
        np.sqrt(stats.squared_deviations / stats.count), exact.std(axis=(0, 2, 3)), rtol=1e-10
    )
    np.testing.assert_allclose(stats.time_means()[0], exact.mean(axis=0).astype(np.float32), rtol=1e-7)

    data[3, 1, 2, 2] = np.nan
    with_gaps = StreamingChannelStats(3, 5, 7)
    with_gaps.update(data[:20])
    with_gaps.update(data[20:])
    exact = data.astype(np.float64)
    np.testing.assert_allclose(with_gaps.mean, np.nanmean(exact, axis=(0, 2, 3)), rtol=1e-14)
    np.testing.assert_allclose(with_gaps.stds()[0, :, 0, 0], np.nanstd(exact, axis=(0, 2, 3)), rtol=1e-6)
    np.testing.assert_allclose(with_gaps.time_means()[0], np.nanmean(exact, axis=0), rtol=1e-6)


def test_split_and_dt_pick_each_years_steps_from_an_hourly_axis():
    hourly = np.arange("1979-12-31T12", "1981-01-01T06", np.timedelta64(1, "h"), dtype="datetime64[h]")
    files = year_files(hourly, 6, parse_split("1979:train,1980:valid"), "src")
    assert [(f.split, f.year, len(f.times)) for f in files] == [("train", 1979, 2), ("valid", 1980, 366 * 4)]
    assert str(files[1].times[1].astype("datetime64[h]")) == "1980-01-01T06"
    with pytest.raises(DataError, match=r"no 6-hourly step in 1990.*covers 1979-1981"):
        year_files(hourly, 6, parse_split("1979:train,1990:valid"), "src")
    gappy = np.delete(hourly, 30)  # 1980-01-01T18 is missing
    with pytest.raises(
        DataError, match=r"1980-01-02T00 follows 1980-01-01T12 among the 6-hourly steps \(a gap"
    ):
        year_files(gappy, 6, parse_split("1979:train,1980:valid"), "src")
    with pytest.raises(ConfigError, match="puts 1980 in both train and valid"):
        parse_split("1979-1980:train,1980:valid")


def test_progress_is_a_bar_with_gb_per_s_on_a_terminal_and_plain_lines_in_a_log():
    import io

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    bar = ByteProgress(2_000_000_000, report=lambda line: None, stream=terminal)
    bar.advance(1_000_000_000, "train/1979.h5")
    bar.close()
    shown = terminal.getvalue()  # tqdm scales bytes by 1000: "1.00G/2.00G [..., 0.45GB/s, train/1979.h5]"
    assert bar.mode == "bar" and "1.00G/2.00G" in shown and re.search(r"B/s, train/1979\.h5\]", shown), shown

    lines: list[str] = []
    log = ByteProgress(2_000_000_000, report=lines.append, interval_s=0.0, stream=io.StringIO())
    log.advance(500_000_000, "valid/1980.h5")
    assert log.mode == "lines" and len(lines) == 1
    assert re.match(r"import-era5: 0\.50/2\.00 GB \(25%\), [\d.]+ GB/s, valid/1980\.h5, ETA ", lines[0]), (
        lines
    )


# --- resume ---------------------------------------------------------------------------------------------------


def test_an_interrupted_import_resumes_skipping_finished_years(arco, truth, tmp_path, monkeypatch):
    out = tmp_path / "out"
    original_read = ERA5Source.read_levels
    calls = {"count": 0}

    def read_then_stop(self, *args):  # one read per variable and block: 88 a year, so stop in the second year
        calls["count"] += 1
        if calls["count"] > 100:
            raise KeyboardInterrupt
        return original_read(self, *args)

    monkeypatch.setattr(ERA5Source, "read_levels", read_then_stop)
    with pytest.raises(KeyboardInterrupt):
        run_import(arco, out, block_mb=0.02)  # a block per step
    monkeypatch.setattr(ERA5Source, "read_levels", original_read)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.h5")) == ["train/1979.h5"]
    assert [p.name for p in (out / "train").iterdir() if p.name.startswith(".")] == []  # no temporary left
    assert (out / "import.json").exists() and not (out / "manifest.json").exists()
    finished = (out / "train" / "1979.h5").stat()
    stale = out / "train" / ".1980.h5.tmp-99999-deadbeef"  # what a killed import leaves
    stale.write_bytes(b"half a file")

    result = run_import(arco, out)
    assert result.skipped == ["train/1979.h5"] and "train/1980.h5" in result.written
    assert (out / "train" / "1979.h5").stat().st_mtime_ns == finished.st_mtime_ns
    assert not stale.exists()
    assert_imported(out, truth)  # statistics include the year the first run wrote

    assert run_import(arco, out).already_complete


def test_finished_training_years_reread_in_blocks_shorter_than_a_year_count_each_step_once(
    arco, truth, tmp_path
):
    out = tmp_path / "out"
    run_import(arco, out)
    (out / "manifest.json").rename(out / "import.json")  # as if stopped after both training years
    for unfinished in ("valid/1981.h5", "test/1982.h5"):
        (out / unfinished).unlink()
    for name in ("global_means.npy", "global_stds.npy", "time_means.npy"):
        (out / "stats" / name).unlink()
    step_mb = len(ERA5_CHANNELS) * HEIGHT * WIDTH * 4 / 2**20
    # Blocks of 3 steps: each finished year of 8 steps is read back as 3 + 3 + 2, with two block boundaries.
    result = run_import(arco, out, block_mb=3.5 * step_mb)
    assert result.skipped == ["train/1979.h5", "train/1980.h5"]
    assert result.written == ["valid/1981.h5", "test/1982.h5"]
    assert_imported(out, truth)  # the statistics come from the reread years alone


def test_a_finished_year_that_no_longer_matches_the_source_is_refused(arco, truth, times, tmp_path):
    out = tmp_path / "out"
    run_import(arco, out, split="1979:train,1980:valid")
    (out / "manifest.json").rename(out / "import.json")  # as if interrupted before its end
    json_plan = json.loads((out / "import.json").read_text())
    (out / "import.json").write_text(
        json.dumps({"generator": json_plan["generator"], "selection": json_plan["selection"]})
    )
    kept = 2 * STEPS - 2  # 1980 loses its last two steps
    shorter = write_arco(tmp_path / "shorter.zarr", {k: v[:kept] for k, v in truth.items()}, times[:kept])
    with h5py.File(out / "valid" / "1980.h5", "r") as handle:
        assert handle["fields"].shape[0] == STEPS
    with pytest.raises(
        DataError, match=r"1980.h5: this finished year does not match the source .* 8 time steps"
    ):
        run_import(shorter, out, split="1979:train,1980:valid")


# --- bad input: one line each, nothing written ------------------------------------------------------------------


def test_a_missing_variable_or_level_names_it_and_writes_nothing(arco, truth, times, tmp_path):
    with pytest.raises(
        DataError, match=r"no variable for channel q700 .*'specific_humidity' or 'q'.*has 10m_u_comp"
    ):
        run_import(arco, tmp_path / "out", channels=("u10", "q700"))
    with pytest.raises(
        DataError, match=r"channel t700 needs level 700 hPa of variable 'temperature', which has levels"
    ):
        run_import(arco, tmp_path / "out", channels=("t700",))
    assert not (tmp_path / "out").exists()


def test_a_time_axis_that_goes_back_is_refused(truth, times, tmp_path):
    shuffled = times.copy()
    shuffled[[3, 4]] = shuffled[[4, 3]]
    store = write_wb2(tmp_path / "wb2.zarr", truth, shuffled)
    with pytest.raises(
        DataError, match=r"time axis goes back at position 4: 1979-01-01T18 follows 1979-01-02T00"
    ):
        run_import(store, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_nan_is_reported_with_channel_and_time_and_allow_nan_keeps_it(truth, times, tmp_path):
    spoiled = {name: values.copy() for name, values in truth.items()}
    spoiled["t850"][5, 2, 3] = np.nan  # 1979-01-02T06
    store = write_wb2(tmp_path / "wb2.zarr", spoiled, times)
    with pytest.raises(
        DataError,
        match=r"channel t850 \(variable 'temperature' at 850 hPa\) has NaN at 1979-01-02T06 .*--allow-nan",
    ):
        run_import(store, tmp_path / "out")
    assert not (tmp_path / "out").exists()

    run_import(store, tmp_path / "kept", allow_nan=True)
    fields = read_fields(tmp_path / "kept" / "train" / "1979.h5")
    assert (
        np.isnan(fields[5, 5, 2, 3])
        and np.isfinite(np.delete(fields.ravel(), np.ravel_multi_index((5, 5, 2, 3), fields.shape))).all()
    )
    train = stacked(spoiled, slice(0, 2 * STEPS)).astype(np.float64)
    np.testing.assert_allclose(
        np.load(tmp_path / "kept" / "stats" / "global_stds.npy")[0, :, 0, 0],
        np.nanstd(train, axis=(0, 2, 3)),
        rtol=1e-6,
    )


@pytest.mark.parametrize("kind", ["truncated", "directory"])
def test_a_damaged_chunk_is_one_line_exit_2_no_half_file_and_the_earlier_years_kept(
    kind, truth, times, tmp_path, capsys
):
    """A chunk of 1981 (the third year) that cannot be read: one line naming the store, the variable and the
    time, through the command; the two years before it are whole, and 1981 leaves no file, half or whole."""
    store = write_wb2(tmp_path / "wb2.zarr", truth, times)
    damage(chunk_of(store, "2m_temperature", 2 * STEPS + 2), kind)  # 1981-01-01T12
    out = tmp_path / "out"
    command = ["data", "import-era5", str(store), "--out", str(out), "--split", SPLIT, "--progress", "none"]
    assert main(command) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith(f"dlscale: error: {store}: variable '2m_temperature'"), (
        error
    )
    assert "1981-01-01T12" in error[0] and "2m_temperature/18.0.0" in error[0]
    assert "2 finished year files" in error[0] and "a rerun continues" in error[0]
    for index, year in enumerate(YEARS[:2]):
        rows = slice(index * STEPS, (index + 1) * STEPS)
        np.testing.assert_array_equal(read_fields(out / "train" / f"{year}.h5"), stacked(truth, rows))
    assert not (out / "valid").exists() or not list((out / "valid").iterdir())
    assert not (out / "test").exists() and not (out / "manifest.json").exists()


def test_netcdf_files_on_different_grids_are_refused(truth, times, tmp_path):
    directory = write_cds(tmp_path / "cds", truth, times, new=True)
    coarse = {name: values[:, ::2, ::2] for name, values in truth.items()}
    write_cds(tmp_path / "coarse", coarse, times, new=True)
    (tmp_path / "coarse" / "era5_single_1982.nc").rename(directory / "era5_single_1982.nc")
    with pytest.raises(
        DataError, match=r"era5_single_1982.nc: its grid \(5 x 8, .*\) differs from that of .*\(9 x 16"
    ):
        run_import(directory, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_output_directory_holding_something_else_is_left_alone(arco, tiny_era5, tmp_path):
    with pytest.raises(
        DataError, match=r"holds another data set \(dlscale synth-era5\).*choose another --out"
    ):
        run_import(arco, tiny_era5)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match=r"is not empty \(notes.txt\) and holds no dlscale ERA5 import"):
        run_import(arco, mine)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    run_import(arco, tmp_path / "first")
    with pytest.raises(DataError, match=r"an import of another selection \(it differs in channels\)"):
        run_import(arco, tmp_path / "first", channels=("u10",))
    (tmp_path / "first" / "manifest.json").rename(tmp_path / "first" / "import.json")  # as if unfinished
    with pytest.raises(
        DataError, match=r"holds an unfinished import of another selection \(it differs in dt_hours\)"
    ):
        run_import(arco, tmp_path / "first", dt_hours=12)
    assert (tmp_path / "first" / "import.json").exists() and not (
        tmp_path / "first" / "manifest.json"
    ).exists()


def test_without_xarray_the_error_says_how_to_install_it(arco, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "xarray", None)
    with pytest.raises(ConfigError, match=r"pip install 'dlscale\[era5\]'"):
        run_import(arco, tmp_path / "out")


def test_a_cloud_url_without_its_backend_says_what_to_install(tmp_path, monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gcsfs" else real_find_spec(name, *a)
    )
    with pytest.raises(
        ConfigError, match=r"reading gs://bucket/era5.zarr needs gcsfs: pip install fsspec gcsfs"
    ):
        run_import("gs://bucket/era5.zarr", tmp_path / "out")


# --- memory ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_memory_stays_a_few_blocks_however_long_the_years(tmp_path, monkeypatch):
    """numpy's allocations (tracemalloc sees them) peak at two block buffers, the float64 statistics pass and
    the readers' temporaries: about 7 blocks here, against 32 blocks of data; the climatology computed at the
    end stays within its own budget (bands of rows, dlscale.data.era5.climatology.computing). Each phase's
    peak is taken apart: the climatology's budget is larger than the data, and would hide an import that held
    every block."""
    years, steps, height, width = [1979, 1980], 64, 32, 64
    times = six_hourly_times(years, steps)
    store = write_wb2(tmp_path / "wb2.zarr", random_truth(len(times), height, width), times)
    block_bytes = 4 * 20 * height * width * 4
    climatology_bytes = 16 * 2**20  # bands of 2 of the 32 rows
    peaks: dict[str, int] = {}
    compute_climatology = importer.ensure_climatology

    def climatology_apart(*args, **kwargs):
        peaks["import"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        return compute_climatology(*args, **kwargs)

    monkeypatch.setattr(importer, "ensure_climatology", climatology_apart)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        run_import(
            store,
            tmp_path / "out",
            split="1979:train,1980:valid",
            block_mb=block_bytes / 2**20,
            climatology_memory_bytes=climatology_bytes,
        )
        peaks["climatology"] = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(times) * 20 * height * width * 4 == 32 * block_bytes
    assert peaks["import"] < 10 * block_bytes, (
        f"import peak {peaks['import'] / 1e6:.1f} MB for blocks of {block_bytes / 1e6:.2f} MB"
    )
    assert peaks["climatology"] < 4 * block_bytes + climatology_bytes, (
        f"climatology peak {peaks['climatology'] / 1e6:.1f} MB with a budget of {climatology_bytes / 1e6:.1f} MB"
    )
    assert (tmp_path / "out" / "stats" / "climatology.zarr").is_dir()


# --- climatology ----------------------------------------------------------------------------------------------


def test_the_climatology_of_the_train_years_is_computed_at_the_end_and_other_years_on_a_rerun(arco, tmp_path):
    out = tmp_path / "out"
    run_import(arco, out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["climatology"]["years"] == [1979, 1980]  # the train years by default
    assert json.loads((out / "stats" / "climatology.zarr" / ".zattrs").read_text())["years"] == [1979, 1980]
    # The same import with other years (any split's) keeps the year files and recomputes the climatology only.
    result = run_import(arco, out, climatology_years=(1980, 1982))
    assert result.already_complete and result.climatology["years"] == [1980, 1982]
    assert json.loads((out / "manifest.json").read_text())["climatology"]["years"] == [1980, 1982]
    assert json.loads((out / "stats" / "climatology.zarr" / ".zattrs").read_text())["splits"] == [
        "train",
        "valid",
        "test",
    ]
