"""``dlscale data climatology`` refuses years the data lacks, reversed years, an unknown split and a window
WeatherBench2's weights cannot have: one line, exit status 2, nothing written. A full or read-only disk is one
line with exit status 74 and no temporary store left (zarr's writer threads included), another process writing
the store is refused with exit status 75, what a killed run left is removed by the next, and the days of the
year the store has no data for are named on the console."""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from pathlib import Path

import pytest
from mounted_disks import mounted_tmpfs

from dlscale.cli import main
from dlscale.runtime.output_directory import OutputDirectoryLock

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


def copy_of(tiny_era5: Path, root: Path, stats: Path | None = None) -> Path:
    """The tiny data set's year files under ``root``, its stats/ in ``stats`` (default root/stats)."""
    for split in ("train", "valid", "test"):
        shutil.copytree(Path(tiny_era5) / split, root / split)
    stats = stats or root / "stats"
    stats.mkdir(parents=True, exist_ok=True)
    for path in (Path(tiny_era5) / "stats").glob("*.npy"):
        shutil.copy2(path, stats / path.name)
    return root


def stats_names(root: Path) -> list[str]:
    return sorted(path.name for path in (root / "stats").iterdir())


def test_a_full_disk_is_one_line_exit_74_and_leaves_no_temporary(tiny_era5, tmp_path, capsys):
    root = tmp_path / "era5"
    with mounted_tmpfs(root / "stats", "size=1m"):  # holds the statistics, not a climatology of 20 channels
        copy_of(tiny_era5, root)
        before = stats_names(root)
        assert main(["data", "climatology", "--root", str(root)]) == 74
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1, error
        assert error[0].startswith(
            f"dlscale: error: {root / 'stats' / 'climatology.zarr'}: cannot write the "
        ), error
        assert (
            "No space left on device (ENOSPC); the disk is full: free some space or choose another --root"
            in (error[0])
        )
        assert stats_names(root) == before  # no temporary store, no lock


def test_zarr_writer_threads_still_running_after_a_failed_chunk_leave_no_temporary(
    tiny_era5, tmp_path, monkeypatch, capsys
):
    """zarr 3 writes an assignment's chunks in threads: one fails (a full disk) while the others still write, and
    each recreates the store's directories; the temporary store must be removed after they end, not before."""
    local = pytest.importorskip(
        "zarr.storage._local", reason="zarr 3 writes chunks in threads; zarr 2 does not"
    )
    root = copy_of(tiny_era5, tmp_path / "era5")
    before = stats_names(root)
    write_chunk = local._put
    late = 0.3

    def full_on_one_chunk(path: Path, *args, **kwargs):
        if path.parent.name == "2m_temperature" and path.name[:1].isdigit():  # its 3 chunks, written at once
            if path.name.startswith("0.0."):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            time.sleep(late)  # still writing when the failure is reported
        return write_chunk(path, *args, **kwargs)

    monkeypatch.setattr(local, "_put", full_on_one_chunk)
    status = main(["data", "climatology", "--root", str(root)])
    time.sleep(2 * late)  # any thread still running has written by now
    assert stats_names(root) == before
    assert status == 74 and "No space left on device (ENOSPC)" in capsys.readouterr().err


def test_what_a_killed_climatology_left_is_removed_by_the_next_one(tiny_era5, tmp_path, capsys):
    root = copy_of(tiny_era5, tmp_path / "era5")
    unfinished = root / "stats" / ".climatology.zarr.tmp-99999-0a1b2c3d"
    (unfinished / "2m_temperature").mkdir(parents=True)
    (unfinished / "2m_temperature" / "0.0.0.0").write_bytes(b"x" * 1000)
    assert main(["data", "climatology", "--root", str(root)]) == 0
    assert stats_names(root) == sorted([*stats_names(Path(tiny_era5)), "climatology.zarr"])
    assert f"Removed {unfinished}" in capsys.readouterr().out


def test_a_climatology_another_process_writes_now_is_refused_with_exit_75(tiny_era5, tmp_path, capsys):
    root = copy_of(tiny_era5, tmp_path / "era5")
    store = root / "stats" / "climatology.zarr"
    with OutputDirectoryLock(store, "--root"):
        assert main(["data", "climatology", "--root", str(root)]) == 75
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and f"{store}: another process is writing it now: pid {os.getpid()}" in error[0], (
        error
    )
    assert not store.exists()


def test_a_read_only_stats_directory_is_one_line_exit_74_naming_root(tiny_era5, tmp_path, capsys):
    root = copy_of(tiny_era5, tmp_path / "era5", stats=tmp_path / "stats")
    with mounted_tmpfs(root / "stats", "ro,size=1m", copy_from=tmp_path / "stats"):
        assert main(["data", "climatology", "--root", str(root)]) == 74
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "Read-only file system (EROFS)" in error[0], error
    assert error[0].endswith("the file system is read-only: choose a writable --root"), error


def test_the_days_of_the_year_without_data_are_named_with_what_a_forecast_does_there(
    tiny_era5, tmp_path, capsys
):
    root = copy_of(tiny_era5, tmp_path / "era5")
    assert main(["data", "climatology", "--root", str(root)]) == 0
    attributes = json.loads((root / "stats" / "climatology.zarr" / ".zattrs").read_text())
    missing = attributes["days_without_data"]
    assert missing  # the tiny years cover a few weeks of January
    # One run of days: from beyond the reach of the last January state's window to before the first's wraps.
    assert missing == list(range(missing[0], missing[-1] + 1)) and 300 < missing[-1] < 366
    printed = capsys.readouterr().out
    warning = [line for line in printed.splitlines() if "WARNING" in line and "no climatology for" in line]
    assert len(warning) == 1, printed
    assert (
        f"no climatology for {len(missing)} of the 366 days of the year, days {missing[0]}-{missing[-1]} ("
    ) in warning[0]
    assert "stops before its rollout" in warning[0] and "--climatology time-mean" in warning[0]


def test_a_store_this_command_did_not_write_is_never_replaced_and_its_own_is_replaced_saying_so(
    tiny_era5, tmp_path, capsys
):
    root = copy_of(tiny_era5, tmp_path / "era5")
    store = root / "stats" / "climatology.zarr"
    store.mkdir()
    (store / ".zattrs").write_text(json.dumps({"title": "WeatherBench2's 1990-2019 climatology"}))
    assert main(["data", "climatology", "--root", str(root)]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert (
        len(error) == 1 and f"{store}: holds a store that dlscale data climatology did not write" in error[0]
    )
    assert sorted(path.name for path in store.iterdir()) == [".zattrs"]
    shutil.rmtree(store)
    assert main(["data", "climatology", "--root", str(root), "--years", "1979-1979"]) == 0
    capsys.readouterr()
    assert main(["data", "climatology", "--root", str(root)]) == 0
    assert f"climatology: replaces {store} (years 1979, written " in capsys.readouterr().out
    assert json.loads((store / ".zattrs").read_text())["years"] == [1979, 1980]
