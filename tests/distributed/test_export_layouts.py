"""``dlscale export`` of a run trained with tensor parallelism on 2 forked gloo ranks gives the same files as the
export of a one-process run with the same weights: checkpoints hold the serial model whatever the layout, and the
export runs in one process without a mesh."""

from __future__ import annotations

from pathlib import Path

import torch
from forked_ranks import run_ranks
from safetensors.torch import load_file
from test_data_parallel import tiny

from dlscale.exported.loader import load_model
from dlscale.exported.writer import export_run
from dlscale.run.training import train
from dlscale.training.observer import Observer

# Both runs stop before their first step, so each checkpoint holds the initial weights that seed 0 gives: the
# same tensors whether the model was then split over 2 tensor-parallel ranks or not.
SHORT = ("log.tensorboard=false", "data.limit_nsamples=8", "data.limit_nsamples_val=4")


class StopBeforeTheFirstStep(Observer):
    """A stop request before any step: the run saves its position (step 0) and ends."""

    def on_train_start(self, trainer) -> None:
        trainer.stop.request("SIGTERM")


def train_stopped(rank: int, data: Path, expdir: Path, overrides: tuple[str, ...]) -> int:
    return train(tiny(data, expdir, *overrides), extra_observers=[StopBeforeTheFirstStep()])


def test_a_tensor_parallel_run_exports_the_model_a_single_process_exports(tiny_era5, tmp_path):
    parallel, serial = tmp_path / "tp2", tmp_path / "serial"
    assert run_ranks(2, train_stopped, tiny_era5, parallel, (*SHORT, "parallel.tensor_parallel=2")) == [0, 0]
    assert train_stopped(0, tiny_era5, serial, SHORT) == 0

    exported = {
        name: export_run(expdir / "tiny" / "00", tmp_path / f"export-{name}", program=False)
        for name, expdir in (("tp2", parallel), ("serial", serial))
    }
    source = exported["tp2"].manifest["source"]
    assert source["world_size"] == 2 and source["layout"].startswith("dp=1 x tp=2 x cp=1")
    assert source["global_step"] == 0
    # The same weights file, byte for byte: whole tensors of the serial shapes under the serial names.
    files = {name: summary.manifest["files"] for name, summary in exported.items()}
    assert files["tp2"]["model.safetensors"] == files["serial"]["model.safetensors"]
    weights = load_file(str(exported["tp2"].directory / "model.safetensors"))
    serial_model = load_model(exported["serial"].directory).model
    assert weights.keys() == serial_model.state_dict().keys()
    assert all(torch.equal(weights[k], v) for k, v in serial_model.state_dict().items())
    # ...and the same model: the tp2 export loads into one process and computes what the serial one computes.
    inputs = torch.randn(2, 20, 16, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(load_model(exported["tp2"].directory).model(inputs), serial_model(inputs))
