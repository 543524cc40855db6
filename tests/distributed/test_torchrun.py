"""The real launcher: `torchrun --nproc_per_node=2 -m dlscale train` on CPU, stopped and relaunched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlscale.checkpoint.directory import CheckpointDir
from dlscale.checkpoint.files import load_checkpoint

REPO = Path(__file__).resolve().parents[2]


def torchrun(*args: str, ranks: int = 2) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={ranks}",
        "-m",
        "dlscale",
        *args,
    ]


@pytest.mark.slow
def test_torchrun_trains_logs_once_and_resumes_after_a_stop(tiny_era5, tmp_path):
    command = torchrun(
        "train",
        "--config",
        "tiny",
        "--set",
        f"data.root={tiny_era5}",
        "--expdir",
        str(tmp_path),
        "--progress",
        "none",
        "--num_epochs",
        "40",
        "--set",
        "parallel.stop_check_every=1",
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    latest = tmp_path / "tiny" / "00" / "checkpoints" / "ckpt_latest.pt"
    first = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 120
    while not latest.exists() and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.2)
    assert latest.exists(), "no checkpoint after the first epoch"
    first.send_signal(signal.SIGTERM)  # torchrun passes it on to both ranks, as Slurm's signal does
    output, _ = first.communicate(timeout=120)
    stopped = load_checkpoint(latest)
    assert not stopped["progress"]["completed"], output
    assert stopped["meta"]["world_size"] == 2

    # The same command, to two epochs past the stop rather than all 40 (a shorter schedule is allowed on resume).
    end = stopped["progress"]["epoch"] + 2
    again = [str(end) if word == "40" else word for word in command]
    finished = subprocess.run(again, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    log = finished.stdout + finished.stderr
    assert log.count("Starting Training Loop...") == 1  # rank 0 logs; rank 1 is quiet
    assert "Resuming from" in log
    final = load_checkpoint(latest)
    assert final["progress"]["completed"]
    epochs = [row["epoch"] for row in final["progress"]["history"]]
    assert epochs == list(range(1, end + 1))  # one continuous curve across the two launches
    # Rank 0 alone writes TensorBoard: one event file per launch.
    assert len(list((tmp_path / "tiny" / "00" / "tensorboard").glob("events.out.tfevents.*"))) == 2


@pytest.mark.slow
def test_bench_on_one_and_two_ranks_feeds_the_scaling_study(tiny_era5, tmp_path):
    from dlscale.cli import main

    bench = ["bench", "--config", "tiny", "--set", f"data.root={tiny_era5}", "--progress", "none"]
    trials = ["--nwarmup", "0", "--ntrials", "2", "--nbatches", "4", "--set", "train.local_batch_size=2"]
    results = tmp_path / "results"
    one = [*bench, *trials, "--expdir", str(tmp_path / "one"), "--output", str(results / "bench-1.json")]
    assert main(one) == 0
    two = [*bench, *trials, "--expdir", str(tmp_path / "two"), "--output", str(results / "bench-2.json")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launched = subprocess.run(torchrun(*two), cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert sorted(p.name for p in results.glob("bench-*.json")) == ["bench-1.json", "bench-2.json"]

    assert main(["scaling", str(results), "--out", str(tmp_path / "scaling")]) == 0
    table = (tmp_path / "scaling" / "scaling.md").read_text()
    assert "weak" in table.lower()
    rows = [line for line in table.splitlines() if line.startswith("| 1 ") or line.startswith("| 2 ")]
    assert len(rows) == 2
    assert (tmp_path / "scaling" / "scaling.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
def test_the_tutorials_model_parallel_flags_train_like_the_serial_run(tiny_era5, tmp_path):
    from dlscale.cli import main

    run = ["train", "--config", "tiny", "--set", f"data.root={tiny_era5}", "--progress", "none"]
    run += ["--num_epochs", "1", "--set", "log.tensorboard=false"]
    assert main([*run, "--expdir", str(tmp_path / "serial")]) == 0
    flags = ["--tensor_parallel", "2", "--context_parallel", "2", "--parallel_order", "cp-tp-dp"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launched = subprocess.run(
        torchrun(*run, *flags, "--expdir", str(tmp_path / "mp"), ranks=4),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = launched.stdout + launched.stderr
    assert launched.returncode == 0, log
    assert "Parallel layout: dp=1 x tp=2 x cp=2 (order cp-tp-dp), 4 rank(s)" in log
    assert "cp groups: {0,1} {2,3}" in log and "tp groups: {0,2} {1,3}" in log
    # the tp x cp run writes a sharded checkpoint (checkpoint.format auto), read here consolidated
    serial, parallel = (
        load_checkpoint(CheckpointDir(tmp_path / d / "tiny" / "00" / "checkpoints").latest_path)
        for d in ("serial", "mp")
    )
    assert (tmp_path / "mp" / "tiny" / "00" / "checkpoints" / "ckpt_latest").is_dir()
    for key in ("train_loss", "val_loss"):
        assert parallel["progress"]["history"][0][key] == pytest.approx(
            serial["progress"]["history"][0][key], rel=1e-5
        )
    for name, value in serial["model"].items():
        assert parallel["model"][name].shape == value.shape, name  # saved in the serial model's shapes
