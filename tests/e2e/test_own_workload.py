"""A workload from a separate installed package (``examples/heat2d``, installed by ``make test``) gets all of
dlscale with no code in ``src/dlscale``: found through its entry point and its import path, trained, benched,
profiled, resumed bitwise after kill -9, and trained on 2 forked data-parallel ranks exactly like on 1."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from follows_eager import BF16_EPOCH_REL, assert_close, train_and_keep_losses
from killed_runs import dlscale_command, kill_during_saves_then_resume

import dlscale
from dlscale.checkpoint.files import load_checkpoint
from dlscale.checkpoint.sharded_state import full_model_state
from dlscale.errors import ConfigError
from dlscale.runtime.local_ranks import run_ranks
from dlscale.training.observer import Observer
from dlscale.workloads import get_workload

REPO = Path(__file__).resolve().parents[2]
CONFIG_FILE = REPO / "examples" / "heat2d" / "heat2d.yaml"

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("heat2d") is None,
    reason="the example package is not installed: pip install -e examples/heat2d (make test installs it)",
)


@pytest.fixture(scope="module")
def heat_data(tmp_path_factory) -> Path:
    """The tiny preset's files, generated once for the module by the example's own data set."""
    root = tmp_path_factory.mktemp("heat2d") / "data"
    cfg = dlscale.load_config(None, CONFIG_FILE, "tiny", [f"data.root={root}"])
    get_workload(cfg.workload).build_datasets(cfg.data)  # generates the files when missing
    return root


# The example's 2-step rollout loss (heat2d.workload.Heat2DRollout): its training_loss hook.
ROLLOUT = ("data.rollout_frames=2",)


def quiet(data: Path, expdir: Path, *more: str) -> list[str]:
    return [f"data.root={data}", f"log.expdir={expdir}", "log.progress=none", "log.tensorboard=false", *more]


@pytest.mark.slow
def test_the_example_trains_through_its_entry_point_and_through_its_import_path(heat_data, tmp_path):
    """The config says ``workload: heat2d`` (the installed entry point); the API names the import path. Both
    are the same workload: the same seed gives the same losses."""
    by_name = dlscale_command(
        "train", "--yaml_config", str(CONFIG_FILE), "--config", "tiny",
        *[word for text in quiet(heat_data, tmp_path / "by_name") for word in ("--set", text)],
    )  # fmt: skip
    assert by_name.returncode == 0, by_name.stderr
    assert "workload heat2d" in by_name.stdout
    named = json.loads((tmp_path / "by_name" / "tiny" / "00" / "summary.json").read_text())

    by_path = dlscale.train(
        "heat2d.workload:WORKLOAD", CONFIG_FILE, "tiny", quiet(heat_data, tmp_path / "by_path")
    )
    assert by_path["workload"] == "heat2d"
    assert by_path["final"]["val_loss"] == named["final"]["val_loss"]
    assert [e["train_loss"] for e in by_path["history"]] == [e["train_loss"] for e in named["history"]]
    # the default evaluator's loss, the default describe_model, FLOPs counted for a model with no formula
    log = (tmp_path / "by_path" / "tiny" / "00" / "out.log").read_text()
    cfg = dlscale.load_config("heat2d", CONFIG_FILE, "tiny")
    model = get_workload("heat2d").build_model(cfg.model, cfg.data)
    assert f"Model: HeatSurrogate with {sum(p.numel() for p in model.parameters()):,} parameters" in log
    flops = re.search(r"FLOPs: ([0-9.]+) GFLOP per training sample", log)
    assert flops and float(flops.group(1)) > 0
    assert by_path["final"]["val_loss"] < by_path["history"][0]["val_loss"]


@pytest.mark.slow
def test_the_example_benches_and_profiles_with_no_code_of_its_own(heat_data, tmp_path):
    results = dlscale.bench(
        "heat2d", CONFIG_FILE, "tiny", quiet(heat_data, tmp_path), output=tmp_path / "bench.json",
        nbatches=4, ntrials=2, nwarmup=1,
    )  # fmt: skip
    assert set(results.tests) == {"IO", "SYNTHETIC", "FULL"}
    assert all(series.mean > 0 for series in results.tests.values())
    assert json.loads((tmp_path / "bench.json").read_text())["verdict"]["kind"] == results.verdict.kind

    summary = dlscale.train(
        "heat2d", CONFIG_FILE, "tiny", quiet(heat_data, tmp_path / "profiled", "profile.torch_profiler=true"),
    )  # fmt: skip
    assert summary is not None
    traces = list((tmp_path / "profiled").rglob("*.pt.trace.json"))
    assert traces and traces[0].stat().st_size > 0


class KeepWeights(Observer):
    """This rank's final weights (only rank 0 writes checkpoints)."""

    weights: dict[str, np.ndarray] = {}

    def on_train_end(self, trainer, outcome: str) -> None:
        full = full_model_state(trainer.setup.model)  # FSDP2's shards gathered (every rank takes part)
        KeepWeights.weights = {k: v.detach().cpu().numpy() for k, v in full.items()}


def train_heat_rank(rank: int, data: Path, expdir: Path, *more: str) -> dict[str, np.ndarray]:
    from dlscale.run.training import train

    cfg = dlscale.load_config("heat2d", CONFIG_FILE, "tiny", quiet(data, expdir, *more))
    assert train(cfg, extra_observers=[KeepWeights()]) == 0
    return KeepWeights.weights


@pytest.mark.parametrize(
    ("data_parallel", "loss"),
    [("ddp", ()), ("fsdp", ()), ("ddp", ROLLOUT), ("fsdp", ROLLOUT)],
    ids=["ddp", "fsdp", "ddp-rollout-loss", "fsdp-rollout-loss"],
)
@pytest.mark.slow
def test_two_data_parallel_ranks_train_the_example_like_one(heat_data, tmp_path, data_parallel, loss):
    """Also FSDP2, whose in-place sharding once broke the FLOP count of a model with no formula of its own, and
    the rollout loss (the workload's training_loss), which calls the DDP model twice before one backward."""
    # SGD moves each weight by lr x its gradient, so the weights show how well the gradients agree. (The config's
    # AdamW divides by the root of the squared gradients' average: where a gradient is near 0, the rounding of
    # the ranks' sum can flip its sign and move the weight by up to 2 lr, which would hide nothing but noise.)
    optimizer = ("optim.optimizer=SGD", "optim.lr=0.05", *loss)
    serial = train_heat_rank(0, heat_data, tmp_path / "one", *optimizer)
    layout = f"parallel.data_parallel={data_parallel}"
    parallel = run_ranks(2, train_heat_rank, heat_data, tmp_path / "two", *optimizer, layout)
    assert serial.keys() == parallel[0].keys() and serial
    for key in serial:
        np.testing.assert_array_equal(parallel[0][key], parallel[1][key], err_msg=f"ranks differ: {key}")
        np.testing.assert_allclose(parallel[0][key], serial[key], rtol=1e-4, atol=2e-6, err_msg=key)


def train_through_the_api(rank: int, data: Path, expdir: Path) -> dict:
    return dlscale.train("heat2d", CONFIG_FILE, "tiny", quiet(data, expdir))


def test_the_python_api_runs_on_every_rank_and_each_gets_the_summary(heat_data, tmp_path):
    """A script calling dlscale.train under torchrun: every rank trains, and every rank reads rank 0's summary."""
    summaries = run_ranks(2, train_through_the_api, heat_data, tmp_path)
    assert summaries[0] is not None and summaries[0] == summaries[1]
    assert (
        summaries[0]["final"] == json.loads((tmp_path / "tiny" / "00" / "summary.json").read_text())["final"]
    )


@pytest.mark.parametrize(
    "knob",
    [
        pytest.param("train.amp_mode=bf16", id="bf16"),
        pytest.param("loader.data_loader_config=gpu", id="gpu-pipeline"),
        pytest.param("parallel.data_parallel=fsdp", id="fsdp"),
    ],
)
def test_the_examples_knobs_need_no_code_in_the_workload(heat_data, tmp_path, knob):
    summary = dlscale.train("heat2d", CONFIG_FILE, "tiny", quiet(heat_data, tmp_path, knob))
    assert np.isfinite(summary["final"]["val_loss"])


# With the training-loss hook only: the plain loss's kill -9 resume is the built-in workloads' path, which
# tests/e2e/test_cli.py kills during saves; the hook's own state (its global step) is what only this one holds.
@pytest.mark.slow
@pytest.mark.parametrize("loss", [ROLLOUT], ids=["rollout-loss"])
def test_a_kill_9_of_the_example_resumes_bitwise(heat_data, tmp_path, loss):
    args = [
        "train", "--yaml_config", str(CONFIG_FILE), "--config", "tiny", "--num_epochs", "6",
        *[word for text in quiet(heat_data, tmp_path / "x", "checkpoint.save_every_steps=1", *loss)
          for word in ("--set", text)],
    ]  # fmt: skip
    reference = dlscale_command(*args, "--expdir", str(tmp_path / "reference"))
    assert reference.returncode == 0, reference.stderr
    run = tmp_path / "killed" / "tiny" / "00"
    resumed = kill_during_saves_then_resume([*args, "--expdir", str(tmp_path / "killed")], run, saves=4)
    assert resumed.returncode == 0, resumed.stderr
    assert "Resum" in resumed.stdout
    expected = load_checkpoint(tmp_path / "reference" / "tiny" / "00" / "checkpoints" / "ckpt_latest.pt")
    actual = load_checkpoint(run / "checkpoints" / "ckpt_latest.pt")
    for key, value in expected["model"].items():
        assert torch.equal(actual["model"][key], value), key


@pytest.mark.slow
def test_the_rollout_loss_trains_under_bf16_like_eager(heat_data, tmp_path):
    """The training_loss hook's model runs under the run's autocast: the losses follow the eager fp32 run's
    (tolerances: tests/e2e/follows_eager.py). That the hook gets the compiled forward is
    tests/training/test_step.py's check: a compiled e2e run here would add a cold compile (about 40 s on CI's
    fresh machine) for what the unit test already shows."""
    one_epoch = ["train.num_epochs=1", *ROLLOUT]
    losses = {}
    for name, more in (("eager", []), ("bf16", ["train.amp_mode=bf16"])):
        cfg = dlscale.load_config(
            "heat2d", CONFIG_FILE, "tiny", quiet(heat_data, tmp_path / name, *one_epoch, *more)
        )
        losses[name] = train_and_keep_losses(cfg, tmp_path / name / "tiny" / "00")
    # Not assert_follows_eager's first-step check: the untrained model's last convolution is zero, so its
    # first predictions are its input, in bf16 as in fp32; the steps after the first differ.
    run, eager = losses["bf16"], losses["eager"]
    assert run.steps[0] == eager.steps[0] and run.steps != eager.steps
    assert_close("bf16 train losses", run.train, eager.train, BF16_EPOCH_REL)
    assert_close("bf16 val losses", run.val, eager.val, BF16_EPOCH_REL)
    log = (tmp_path / "bf16" / "tiny" / "00" / "out.log").read_text()
    assert "target (B, 2, 16, 16); training_loss" in log  # the pre-flight check ran the hook on two frames


def test_cuda_graphs_refuse_a_workload_with_a_training_loss_in_one_line(heat_data, tmp_path):
    with pytest.raises(
        ConfigError, match="train.cuda_graphs cannot capture the training_loss of workload 'heat2d'"
    ):
        dlscale.train(
            "heat2d", CONFIG_FILE, "tiny", quiet(heat_data, tmp_path, *ROLLOUT, "train.cuda_graphs=true")
        )


def test_every_training_step_goes_through_the_training_loss_with_its_global_step(heat_data, tmp_path):
    from heat2d.workload import Heat2DRollout

    class RecordingRollout(Heat2DRollout):
        steps: list[int] = []

        def configured(self, model_cfg, data_cfg):
            return self

        def training_loss(self, model, batch, step):
            RecordingRollout.steps.append(step)
            return super().training_loss(model, batch, step)

    summary = dlscale.train(RecordingRollout(), CONFIG_FILE, "tiny", quiet(heat_data, tmp_path, *ROLLOUT))
    # the pre-flight check's call (step 0), then every optimizer step of the run
    assert RecordingRollout.steps == [0, *range(summary["global_step"])] and summary["global_step"] == 8
