"""The results directories of ``dlscale forecast --write`` and ``dlscale score`` under faults: what a killed write
left beside them is removed by the next run, another process writing the same directory is refused with exit
status 75 (its temporaries untouched), and a full or read-only disk is one line with exit status 74 that names
the command's own option, with nothing left behind. (The lock and the clean-up themselves:
tests/runtime/test_output_directory.py.)"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
from mounted_disks import mounted_tmpfs
from run_configs import tiny_run_config

from dlscale.cli import main
from dlscale.run.training import train
from dlscale.runtime.output_directory import OutputDirectoryLock, lock_path

xarray = pytest.importorskip("xarray", reason="the era5 extra (xarray, zarr) writes and reads the stores")
from era5_stores import grid, random_truth, six_hourly_times, write_wb2  # noqa: E402

# zarr 3 warns of the consolidated metadata xarray writes.
pytestmark = pytest.mark.filterwarnings("ignore:Consolidated metadata:UserWarning")
CONFIGS = Path(__file__).resolve().parents[2] / "configs"
FORECAST = ["--lead", "6h", "--init-count", "2", "--write", "zarr", "--no-figures"]
FORECAST_DIR = "test-ckpt_latest-lead6h-init2-zarr-clim-timemean"  # the directory those options write


@pytest.fixture(scope="module")
def era5_run(tiny_era5: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny ERA5 run (one epoch)."""
    expdir = tmp_path_factory.mktemp("faults_runs")
    assert train(tiny_run_config(CONFIGS / "vit_era5.yaml", tiny_era5, expdir, "train.num_epochs=1")) == 0
    return expdir / "tiny" / "00"


@pytest.fixture(scope="module")
def forecast_and_truth(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A WeatherBench2 truth store of 2m temperature (8 x 16, eight 6-hourly states) and a forecast of it in
    WeatherBench2's layout (the truth plus 0.5 K, two initial times, leads 0-12 h)."""
    root = tmp_path_factory.mktemp("score_faults")
    height, width, steps = 8, 16, 8
    times = six_hourly_times([2018], steps)
    t2m = random_truth(steps, height, width)["t2m"]
    truth = write_wb2(root / "truth.zarr", {"t2m": t2m}, times)
    latitude, longitude = grid(height, width)
    starts = [0, 2]
    values = np.stack([t2m[start : start + 3] for start in starts]) + np.float32(0.5)
    leads = np.array([0, 6, 12], dtype="timedelta64[h]").astype("timedelta64[ns]")
    dims = ("time", "prediction_timedelta", "latitude", "longitude")
    coords = {
        "time": times[starts],
        "prediction_timedelta": leads,
        "latitude": latitude,
        "longitude": longitude,
    }
    forecast = root / "forecast.zarr"
    xarray.Dataset({"2m_temperature": (dims, values)}, coords=coords).to_zarr(forecast, mode="w")
    return forecast, truth


def score_command(forecast_and_truth: tuple[Path, Path], out: Path) -> list[str]:
    forecast, truth = forecast_and_truth
    return ["score", str(forecast), "--truth", str(truth), "--no-figures", "--out", str(out)]


def beside(directory: Path) -> list[str]:
    """What belongs to ``directory`` beside it: its temporaries, set-aside copies and lock."""
    return sorted(
        entry.name for entry in directory.parent.iterdir() if entry.name.startswith(f".{directory.name}.")
    )


def killed_writes(directory: Path) -> list[Path]:
    """What writes of ``directory`` killed with SIGKILL leave: a half-filled temporary (a zarr store inside) and,
    from one killed after its new directory was in place, the earlier one set aside."""
    half = directory.with_name(f".{directory.name}.tmp-99999-0a1b2c3d")
    (half / "forecast.zarr" / "2m_temperature").mkdir(parents=True)
    (half / "forecast.zarr" / "2m_temperature" / "0.0.0").write_bytes(b"x" * 10000)
    aside = directory.with_name(f".{directory.name}.old-99998-ff")
    aside.mkdir()
    (aside / "scores.json").write_text("{}")
    return [half, aside]


def fill_disk(directory: Path, room: int) -> None:
    """Fill the file system of ``directory`` but ``room`` bytes (the lock and the first files fit, not all)."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    os.truncate(filler, filler.stat().st_size - room)


def one_error_line(capsys) -> str:
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("dlscale: error: "), error
    return error[0]


# ------------------------------------------------------------------------------------------- forecast --write


def test_a_forecast_removes_what_killed_forecasts_left(era5_run, capsys):
    directory = era5_run / "forecast" / FORECAST_DIR
    assert main(["forecast", str(era5_run), *FORECAST]) == 0
    left = killed_writes(directory)
    assert main(["forecast", str(era5_run), *FORECAST]) == 0
    assert beside(directory) == [] and (directory / "forecast.zarr").is_dir()
    printed = capsys.readouterr().out
    assert all(f"Removed {path}" in printed for path in left), printed


def test_a_forecast_another_process_writes_now_is_refused_with_exit_75(era5_run, capsys):
    directory = era5_run / "forecast" / FORECAST_DIR
    being_written = directory.with_name(f".{directory.name}.tmp-{os.getpid()}-0a1b")
    being_written.mkdir(parents=True)
    with OutputDirectoryLock(directory):
        assert main(["forecast", str(era5_run), *FORECAST]) == 75
    line = one_error_line(capsys)
    assert f"{directory}: another process is writing it now: pid {os.getpid()} on host" in line
    assert being_written.is_dir()  # the writer's temporary, which runs on
    being_written.rmdir()


def test_a_forecast_on_a_full_disk_is_one_line_exit_74_naming_where_it_writes(era5_run, capsys):
    forecasts = era5_run / "forecast"
    with mounted_tmpfs(forecasts, "size=256k"):
        fill_disk(forecasts, room=40_000)  # a forecast.zarr of 2 x 20 fields of 16 x 32 is 82 kB
        assert main(["forecast", str(era5_run), *FORECAST]) == 74
        line = one_error_line(capsys)
        assert sorted(path.name for path in forecasts.iterdir()) == ["filler"]  # no temporary, no lock
    assert f"{forecasts / FORECAST_DIR}: cannot write the forecast (an earlier one is unchanged): " in line, (
        line
    )
    assert "No space left on device (ENOSPC)" in line and "--expdir" not in line, line
    assert "choose another RUN_DIR|CHECKPOINT (a checkpoint file outside its run directory" in line, line


def test_a_forecast_into_a_read_only_directory_stops_before_its_rollout(era5_run, capsys):
    forecasts = era5_run / "forecast"
    with mounted_tmpfs(forecasts, "ro,size=256k"):
        capsys.readouterr()
        assert main(["forecast", str(era5_run), *FORECAST]) == 74
        printed = capsys.readouterr()
    assert "Forecasting with" not in printed.out, "refused before the rollout, not after it"
    error = printed.err.strip().splitlines()
    assert len(error) == 1 and "Read-only file system (EROFS)" in error[0], error
    assert "choose a writable RUN_DIR|CHECKPOINT" in error[0], error


# ---------------------------------------------------------------------------------------------------- score


def test_a_score_removes_what_killed_scores_left(forecast_and_truth, tmp_path, capsys):
    out = tmp_path / "scores"
    assert main(score_command(forecast_and_truth, out)) == 0
    left = killed_writes(out)
    assert main(score_command(forecast_and_truth, out)) == 0
    assert beside(out) == [] and (out / "scores.json").is_file()
    printed = capsys.readouterr().out
    assert all(f"Removed {path}" in printed for path in left), printed


def test_a_score_another_process_writes_now_is_refused_with_exit_75(forecast_and_truth, tmp_path, capsys):
    out = tmp_path / "scores"
    being_written = tmp_path / f".scores.tmp-{os.getpid()}-0a1b"
    being_written.mkdir()
    with OutputDirectoryLock(out, "--out"):
        assert main(score_command(forecast_and_truth, out)) == 75
    line = one_error_line(capsys)
    assert f"{out}: another process is writing it now" in line and f"delete {lock_path(out)}" in line
    assert being_written.is_dir() and not out.exists()


@pytest.mark.parametrize("disk", ["full", "read-only"])
def test_a_score_on_a_full_or_read_only_disk_is_one_line_exit_74_naming_out(
    forecast_and_truth, tmp_path, capsys, disk
):
    place = tmp_path / "place"
    with mounted_tmpfs(place, "size=256k" if disk == "full" else "ro,size=256k"):
        if disk == "full":
            fill_disk(place, room=8192)  # the lock and scores.csv, not scores.json
        assert main(score_command(forecast_and_truth, place / "scores")) == 74
        line = one_error_line(capsys)
        assert sorted(path.name for path in place.iterdir()) == (["filler"] if disk == "full" else [])
    advice = {
        "full": "No space left on device (ENOSPC); the disk is full: free some space or choose another --out",
        "read-only": "Read-only file system (EROFS); the file system is read-only: choose a writable --out",
    }[disk]
    assert line.endswith(advice), line
    if disk == "full":  # the directory's own write failed, not its lock's
        assert f"{place / 'scores'}: cannot write the scores (an earlier one is unchanged): " in line, line
