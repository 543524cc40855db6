"""The `dlscale` command as users run it, in real subprocesses (each costs a torch import: keep them few)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from killed_runs import dlscale_command as dlscale
from killed_runs import kill_during_saves_then_resume

from dlscale.checkpoint.files import load_checkpoint

REPO = Path(__file__).resolve().parents[2]
CONFIG_FILE = REPO / "configs" / "vit_era5.yaml"


@pytest.mark.slow
def test_generate_data_then_train_with_tutorial_flags(tmp_path):
    data = tmp_path / "era5"
    made = dlscale("data", "synth-era5", "--out", str(data), "--preset", "tiny", "--steps-per-year", "20")
    assert made.returncode == 0, made.stderr
    assert sorted(p.name for p in (data / "train").iterdir()) == ["1979.h5", "1980.h5"]
    again = dlscale(
        "data", "synth-era5", "--out", str(data), "--preset", "tiny", "--steps-per-year", "20", "--if-missing"
    )
    assert "nothing to do" in again.stdout

    result = dlscale(
        "train", "--yaml_config", str(CONFIG_FILE), "--config=tiny", "--set", f"data.root={data}",
        "--expdir", str(tmp_path / "runs"), "--run_num", "07", "--num_epochs", "1", "--num_data_workers", "0",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    run = tmp_path / "runs" / "tiny" / "07"
    assert "Time taken for epoch 1 is" in result.stdout
    assert f"tensorboard --logdir {run / 'tensorboard'}" in result.stdout
    assert (run / "checkpoints" / "ckpt_latest.pt").is_file()


@pytest.mark.parametrize(
    ("signum", "workers", "whole_group"),
    [
        pytest.param(signal.SIGTERM, 0, False, id="SIGTERM"),
        pytest.param(signal.SIGUSR1, 0, False, id="SIGUSR1"),
        # Ctrl-C reaches the DataLoader workers too: they must keep serving while the trainer stops cleanly.
        pytest.param(signal.SIGINT, 2, True, id="Ctrl-C-to-process-group-with-workers"),
    ],
)
@pytest.mark.slow
def test_signal_saves_a_checkpoint_and_the_same_command_resumes(
    tiny_era5, tmp_path, signum, workers, whole_group
):
    command = [
        sys.executable, "-m", "dlscale", "train", "--yaml_config", str(CONFIG_FILE), "--config", "tiny",
        "--set", f"data.root={tiny_era5}", "--expdir", str(tmp_path), "--num_data_workers", str(workers),
        "--num_epochs", "400", "--progress", "lines",
    ]  # fmt: skip
    log = tmp_path / "tiny" / "00" / "out.log"
    process = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while not (log.is_file() and "Time taken for epoch 1 is" in log.read_text()):
            assert process.poll() is None, process.stdout.read()
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.05)
        if whole_group:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)
        output, _ = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 0, output
    name = signal.Signals(signum).name
    assert output.count(f"Received {name}: stopping after the current step") == 1, output
    assert f"Stopped by {name}" in output and "Run the same command again to resume." in output
    # The requeue recipe (docs/many-gpus.md, and the job templates in scripts/) greps summary.json for exactly this.
    assert '"outcome": "stopped"' in (tmp_path / "tiny" / "00" / "summary.json").read_text()
    checkpoint = load_checkpoint(tmp_path / "tiny" / "00" / "checkpoints" / "ckpt_latest.pt")
    stopped_at = checkpoint["progress"]["global_step"]
    assert 11 <= stopped_at < 400 * 11 and not checkpoint["progress"]["completed"]

    if signum != signal.SIGTERM:
        return  # the resume after a stop is the same whichever signal stopped the run: once is enough
    # Resume with the same command, but only to the end of the current epoch so that the test stays short.
    epochs = checkpoint["progress"]["epoch"] + 1
    resumed = dlscale(*command[3:-4], "--num_epochs", str(epochs), "--progress", "none")
    assert resumed.returncode == 0, resumed.stderr
    assert f"global step {stopped_at} of" in resumed.stdout
    assert "the LR schedule changed" in resumed.stdout  # num_epochs changed; the run says so
    assert load_checkpoint(tmp_path / "tiny" / "00" / "checkpoints" / "ckpt_latest.pt")["progress"][
        "completed"
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "optim.lrr=1"], "unknown key optim.lrr (did you mean 'lr'?)"),
        (["--amp_mode", "fp8"], "argument --amp_mode: invalid choice: 'fp8'"),
        pytest.param(
            ["--cuda_graphs", "--tf32", "off"],
            "train.cuda_graphs needs a CUDA GPU",
            marks=pytest.mark.skipif(
                torch.cuda.is_available(), reason="the refusal is for machines without a GPU"
            ),
        ),
        (["--cuda_graphs", "--enable_jit"], "train.cuda_graphs: cannot be combined with enable_jit"),
        (["--config", "shortt"], "no config named 'shortt' (did you mean 'short'?)"),
        (["--set", "data.root=/nonexistent/era5"], "/nonexistent/era5/train"),
    ],
)
@pytest.mark.slow
def test_bad_input_exits_2_with_one_clear_line(args, message):
    result = dlscale("train", "--config", "tiny", *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_config_info_and_version_commands():
    shown = dlscale("config", "--config", "short", "--num_data_workers", "4")
    assert shown.returncode == 0, shown.stderr
    assert "limit_nsamples: 512" in shown.stdout and "num_data_workers: 4" in shown.stdout
    keys = dlscale("config", "--keys").stdout
    assert "optim:  (OptimConfig)" in keys and "  lr: a number (default 0.0005)" in keys
    info = dlscale("info")
    assert info.returncode == 0 and "torch" in info.stdout
    assert re.search(r"^device: cpu \(\d+ threads?\)$", info.stdout, re.MULTILINE), info.stdout
    assert dlscale("--version").stdout.startswith("dlscale ")


def test_console_script_is_installed():
    from importlib import metadata

    try:
        metadata.distribution("dlscale")
    except metadata.PackageNotFoundError:
        pytest.skip(
            "dlscale is not installed here (run from a checkout with PYTHONPATH=src): no console script"
        )
    script = Path(sys.executable).parent / "dlscale"
    assert script.is_file()
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "train" in result.stdout


@pytest.mark.parametrize(
    ("setting", "key"),
    [("optim.lr=.nan", "optim.lr"), ("optim.max_grad_norm=.inf", "optim.max_grad_norm")],
    ids=["nan-lr", "inf-max_grad_norm"],
)
def test_nonfinite_optimizer_values_exit_2_with_one_line(setting, key):
    # A NaN lr used to pass validation and end in a torch traceback; an infinite one was taken as given.
    result = dlscale("train", "--config", "tiny", "--set", setting)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"{key}: must be a finite number" in lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_kill_9_during_saves_resumes_bitwise_and_leaves_no_temporary_files(tiny_era5, tmp_path):
    # A checkpoint after every step, so that the kill lands in or near a save.
    args = [
        "train", "--yaml_config", str(CONFIG_FILE), "--config", "tiny", "--set", f"data.root={tiny_era5}",
        "--set", "checkpoint.save_every_steps=1", "--progress", "none", "--set", "log.tensorboard=false",
        "--num_epochs", "4",  # 44 saves: time to be killed in the middle of them
    ]  # fmt: skip
    reference = dlscale(*args, "--expdir", str(tmp_path / "reference"))
    assert reference.returncode == 0, reference.stderr
    run = tmp_path / "killed" / "tiny" / "00"
    resumed = kill_during_saves_then_resume([*args, "--expdir", str(tmp_path / "killed")], run, saves=5)
    assert resumed.returncode == 0, resumed.stderr
    assert "no longer exists" in resumed.stdout  # the killed run's lock, taken over
    assert not [p.name for p in run.rglob("*") if ".tmp-" in p.name]
    expected = load_checkpoint(tmp_path / "reference" / "tiny" / "00" / "checkpoints" / "ckpt_latest.pt")
    actual = load_checkpoint(run / "checkpoints" / "ckpt_latest.pt")
    for key, value in expected["model"].items():
        assert torch.equal(actual["model"][key], value), key
