"""Hang triage on 2 gloo ranks: a rank that sleeps before a collective makes the other one end, within the
training loop's collective timeout, with one line naming the collective it waited in and the rank that had not
arrived, and a non-zero status; the sleeper ends too (no hang). The flight recorder is on, the start-up keeps its
long timeout, and a value the user set is kept."""

from __future__ import annotations

import os
import time
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from forked_ranks import run_ranks
from run_configs import tiny_run_config

from dlscale.errors import DlscaleError
from dlscale.run.training import train
from dlscale.runtime.distributed import (
    collective_failure_line,
    dump_flight_recorder_into,
    enable_flight_recorder,
)
from dlscale.training.observer import Observer

CONFIG_FILE = Path(__file__).resolve().parents[2] / "configs" / "vit_era5.yaml"
TRAIN_TIMEOUT_S = 1.0
SLEEP_S = 2.5

tiny = partial(tiny_run_config, CONFIG_FILE)


def gloo_timeout() -> float:
    """The timeout the default process group's gloo backend applies now, in seconds."""
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    return backend.options._timeout.total_seconds()


class SleepBeforeStep(Observer):
    """Rank ``sleeper`` sleeps after step 3, before step 4's collectives; every rank notes when step 3 ended and
    the timeout its process group has meanwhile."""

    def __init__(self, sleeper: int, sleep_s: float):
        self.sleeper, self.sleep_s = sleeper, sleep_s
        self.step3_ended: float | None = None
        self.timeouts: list[float] = []

    def on_train_start(self, trainer) -> None:
        self.timeouts.append(gloo_timeout())

    def on_step_end(self, trainer, loss) -> None:
        self.timeouts.append(gloo_timeout())
        if trainer.progress.global_step == 3:
            self.step3_ended = time.monotonic()
            if trainer.setup.process.rank == self.sleeper:
                time.sleep(self.sleep_s)


def train_rank(rank: int, data: Path, expdir: Path, sleeper: int):
    observer = SleepBeforeStep(sleeper, SLEEP_S)
    cfg = tiny(data, expdir, f"parallel.train_timeout_s={TRAIN_TIMEOUT_S}", "parallel.timeout_s=60")
    try:
        train(cfg, extra_observers=[observer])
        status, line = 0, ""
    except DlscaleError as exc:
        status, line = exc.exit_code, str(exc)
    return status, line, time.monotonic() - (observer.step3_ended or 0), observer.timeouts, os.environ.copy()


@pytest.mark.parametrize("sleeper", [1, 0], ids=["rank-1-sleeps", "rank-0-the-store-host-sleeps"])
def test_a_rank_that_sleeps_before_a_collective_ends_the_others_with_one_line(tiny_era5, tmp_path, sleeper):
    results = run_ranks(2, train_rank, tiny_era5, tmp_path, sleeper, timeout_s=60)
    waiter = 1 - sleeper
    status, line, after_step3, timeouts, environ = results[waiter]
    assert status == 1, line
    assert line.startswith(f"rank {waiter}: timed out after {TRAIN_TIMEOUT_S:g} s waiting in all_reduce #")
    assert f"at step 4; not arrived: rank {sleeper} (at step 3)" in line
    assert "\n" not in line
    assert after_step3 < TRAIN_TIMEOUT_S + 1.5  # the loop's timeout, not the start-up's 60 s
    assert timeouts[:2] == [60, TRAIN_TIMEOUT_S]  # start-up under parallel.timeout_s, the loop's from step 1
    # The sleeper wakes into a collective whose partner is gone: it ends at once, with a line of its own.
    sleeper_status, sleeper_line, sleeper_after, *_ = results[sleeper]
    assert sleeper_status == 1 and sleeper_line.startswith(f"rank {sleeper}: ")
    assert "failed: a rank it was exchanging with left" in sleeper_line or "timed out" in sleeper_line
    assert sleeper_after < SLEEP_S + TRAIN_TIMEOUT_S + 1.5
    assert environ["TORCH_FR_BUFFER_SIZE"] == "2000" and environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert environ["TORCH_FR_DUMP_TEMP_FILE"] == str(
        tmp_path / "tiny" / "00" / "hang" / "flight_recorder_rank_"
    )
    assert not (tmp_path / "tiny" / "00" / "hang").exists()  # gloo never dumps: no empty directory on CPU


def test_the_flight_recorder_keeps_what_the_user_set(tmp_path):
    environ = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/scratch/fr_"}
    enable_flight_recorder(environ)
    assert dump_flight_recorder_into(tmp_path / "hang", gpu=True, environ=environ) is None
    assert environ == {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "50",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/scratch/fr_",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    }
    assert not (tmp_path / "hang").exists()
    environ = {"TORCH_FR_BUFFER_SIZE": "0", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}  # switched off on purpose
    enable_flight_recorder(environ)
    assert environ == {"TORCH_FR_BUFFER_SIZE": "0", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}
    prefix = dump_flight_recorder_into(tmp_path / "hang", gpu=True, environ=environ)
    assert prefix == str(tmp_path / "hang" / "flight_recorder_rank_") and (tmp_path / "hang").is_dir()
    # A later run in the same process moves dlscale's own setting into its run directory.
    later = dump_flight_recorder_into(tmp_path / "later", gpu=False, environ=environ)
    assert environ["TORCH_FR_DUMP_TEMP_FILE"] == later == str(tmp_path / "later" / "flight_recorder_rank_")
    assert not (tmp_path / "later").exists()  # made on GPUs only


def test_other_timeouts_are_no_collective_failure():
    assert collective_failure_line(RuntimeError("DataLoader timed out after 60 seconds")) is None
    assert collective_failure_line(TimeoutError("the lock was not released in time")) is None
