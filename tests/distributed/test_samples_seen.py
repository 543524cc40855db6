"""On 2 data-parallel ranks a run counts the samples of the global batch, all ranks' together: its position
(``samples_seen``, saved in checkpoints) and the efficiency report's energy per sample both divide by those."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

from forked_ranks import run_ranks
from run_configs import tiny_run_config

from dlscale.checkpoint.files import load_checkpoint
from dlscale.run.training import train
from dlscale.training.observer import Observer

CONFIG_FILE = Path(__file__).resolve().parents[2] / "configs" / "vit_era5.yaml"

tiny = partial(tiny_run_config, CONFIG_FILE)  # tiny(data, expdir, *overrides, name="tiny", **flags)


class BatchesAtEnd(Observer):
    """Keeps this rank's count of samples, its steps and its batch sizes when the run ends."""

    def on_train_end(self, trainer, outcome: str) -> None:
        s, p = trainer.setup, trainer.progress
        self.result = {
            "samples_seen": p.samples_seen,
            "global_step": p.global_step,
            "global_batch": s.global_batch_size,
            "local_batch": s.local_batch_size,
            "world_size": s.process.world_size,
        }


def train_and_count(rank: int, data: Path, expdir: Path) -> tuple[int, dict]:
    observer = BatchesAtEnd()
    status = train(
        tiny(data, expdir, "train.num_epochs=1", "monitor.enable_monitor=true"), extra_observers=[observer]
    )
    return status, observer.result


def test_two_ranks_count_the_global_batch_as_samples_seen(tiny_era5, tmp_path):
    results = run_ranks(2, train_and_count, tiny_era5, tmp_path)
    assert [status for status, _ in results] == [0, 0]
    for _, counts in results:
        assert counts["world_size"] == 2 and counts["global_step"] > 0
        assert counts["global_batch"] == 2 * counts["local_batch"]  # the two counts tell apart
        assert counts["samples_seen"] == counts["global_step"] * counts["global_batch"]
    _, rank0 = results[0]
    run = tmp_path / "tiny" / "00"
    saved = load_checkpoint(run / "checkpoints" / "ckpt_latest.pt")["progress"]
    assert saved["samples_seen"] == rank0["samples_seen"]
    # Energy per sample: the whole job's energy over the whole job's samples.
    report = json.loads((run / "monitor" / "efficiency.json").read_text())
    assert report["samples_trained"] == rank0["global_step"] * rank0["global_batch"]
