"""A real stop signal on ONE of 2 gloo ranks: every rank stops at the same step, rank 0 saves that step, all return
0, and the signal handler itself runs no collective and writes no log line (it only records the request)."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from functools import partial
from pathlib import Path

import pytest
import torch.distributed as dist
from forked_ranks import run_ranks
from run_configs import tiny_run_config

from dlscale.checkpoint.files import load_checkpoint
from dlscale.run.training import train
from dlscale.runtime.signals import STOP_SIGNALS_ENV, StopRequest
from dlscale.training.observer import Observer

CONFIG_FILE = Path(__file__).resolve().parents[2] / "configs" / "vit_era5.yaml"
COLLECTIVES = ("all_reduce", "broadcast", "barrier", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
               "gather", "scatter", "send", "recv", "broadcast_object_list", "all_gather_object")  # fmt: skip

tiny = partial(tiny_run_config, CONFIG_FILE)


class InsideHandler:
    """What happened while a signal handler ran: collectives called and log records made."""

    active = False
    collectives: list[str] = []
    records: list[str] = []


def watch_the_handler() -> None:
    """Wrap StopRequest's handler, torch.distributed's collectives and logging (this forked rank only)."""
    original = StopRequest._handle

    def handle(self, signum, frame):
        InsideHandler.active = True
        try:
            original(self, signum, frame)
        finally:
            InsideHandler.active = False

    StopRequest._handle = handle
    for name in COLLECTIVES:
        collective = getattr(dist, name)

        def watched(*args, _collective=collective, _name=name, **kwargs):
            if InsideHandler.active:
                InsideHandler.collectives.append(_name)
            return _collective(*args, **kwargs)

        setattr(dist, name, watched)
    handle_record = logging.Logger.handle

    def watched_handle(logger, record):
        if InsideHandler.active:
            InsideHandler.records.append(record.getMessage())
        return handle_record(logger, record)

    logging.Logger.handle = watched_handle  # every logger's every record passes here


class SignalOneRank(Observer):
    """After step 3, ``signum`` reaches rank ``target`` only: sent at once, or ``delay_s`` later from another thread
    while the other rank sleeps (so the signal lands while the target waits inside a collective)."""

    def __init__(self, target: int, signum: int, delay_s: float):
        self.target, self.signum, self.delay_s = target, signum, delay_s
        self.final_step: int | None = None
        self.reason: str | None = None

    def on_step_end(self, trainer, loss) -> None:
        if trainer.progress.global_step != 3:
            return
        if trainer.setup.process.rank != self.target:
            time.sleep(2 * self.delay_s)  # the target reaches the next collective and waits there
        elif self.delay_s:
            threading.Timer(self.delay_s, os.kill, (os.getpid(), self.signum)).start()
        else:
            os.kill(os.getpid(), self.signum)

    def on_train_end(self, trainer, outcome: str) -> None:
        self.final_step, self.reason = trainer.progress.global_step, trainer.stop.reason


def train_rank(rank: int, data: Path, expdir: Path, target: int, signum: int, delay_s: float):
    os.environ[STOP_SIGNALS_ENV] = "usr2"  # in this forked rank only: SIGUSR2 is a stop signal too
    watch_the_handler()
    observer = SignalOneRank(target, signum, delay_s)
    status = train(tiny(data, expdir, "parallel.stop_check_every=2"), extra_observers=[observer])
    return status, observer.final_step, observer.reason, InsideHandler.collectives, InsideHandler.records


@pytest.mark.parametrize(
    ("target", "signum", "delay_s"),
    [
        pytest.param(1, signal.SIGUSR1, 0.0, id="SIGUSR1-on-rank-1-between-steps"),
        pytest.param(0, signal.SIGUSR2, 0.3, id="configured-SIGUSR2-on-rank-0-inside-a-collective"),
    ],
)
def test_a_signal_on_one_rank_stops_every_rank_at_the_same_saved_step(
    tiny_era5, tmp_path, target, signum, delay_s
):
    results = run_ranks(2, train_rank, tiny_era5, tmp_path, target, signum, delay_s, timeout_s=120)
    statuses = [status for status, *_ in results]
    steps = [step for _, step, *_ in results]
    assert statuses == [0, 0]
    assert steps[0] == steps[1]
    saved = load_checkpoint(tmp_path / "tiny" / "00" / "checkpoints" / "ckpt_latest.pt")["progress"]
    assert saved["global_step"] == steps[0] and not saved["completed"]
    # The next agreement point after the signal (every 2 steps): step 4 when it arrived after step 3.
    assert steps[0] % 2 == 0 and (steps[0] == 4 if not delay_s else 4 <= steps[0] <= 8)
    reasons = [reason for _, _, reason, *_ in results]
    name = signal.Signals(signum).name
    assert reasons[target] == name and reasons[1 - target] == "a stop signal on another rank"
    for _, _, _, collectives, records in results:
        assert collectives == [] and records == []  # the handler recorded the request, nothing else
