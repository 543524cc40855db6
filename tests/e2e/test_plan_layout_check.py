"""`dlscale plan --check_layout`: one rank of an N-GPU layout built in this process on a fake process group."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from dlscale.cli import main
from dlscale.config import load_run_config
from dlscale.errors import ConfigError
from dlscale.perf.plan.layout_cost import Layout, TrainingSettings, count_parameters_per_gpu
from dlscale.perf.plan.layouts import model_shape_of
from dlscale.run.config_plan import layout_check_of

REPO = Path(__file__).resolve().parents[2]
CONFIG_FILE = REPO / "configs" / "vit_era5.yaml"

# (config, GPUs, tp, cp, order): the layouts README.md and docs/model-parallel.md run or tabulate, and the
# issue's 64-GPU example.
DOCUMENTED_LAYOUTS = [
    ("mp", 4, 4, 1, "tp-cp-dp"),  # torchrun --nproc_per_node=4 ... --tensor_parallel 4
    ("mp", 4, 1, 1, "tp-cp-dp"),
    ("mp", 16, 4, 1, "tp-cp-dp"),
    ("mp", 16, 1, 4, "cp-tp-dp"),  # the tutorial's cp run
    ("mp", 16, 2, 2, "tp-cp-dp"),
    ("mp_patch4", 16, 1, 1, "tp-cp-dp"),
    ("mp_patch4", 16, 4, 4, "tp-cp-dp"),
    ("mp", 64, 4, 2, "tp-cp-dp"),
]


def check(config: str, gpus: int, *overrides: str, rank: int = 0):
    cfg = load_run_config(CONFIG_FILE, config, list(overrides), {})
    return cfg, layout_check_of(cfg, gpus, rank)


def layout_overrides(tp: int, cp: int, order: str = "tp-cp-dp", data_parallel: str = "ddp") -> list[str]:
    return [
        f"parallel.tensor_parallel={tp}",
        f"parallel.context_parallel={cp}",
        f"parallel.parallel_order={order}",
        f"parallel.data_parallel={data_parallel}",
    ]


def run_check(capsys, config: str, *args: str) -> tuple[int, str, str]:
    status = main(["plan", "--yaml_config", str(CONFIG_FILE), "--config", config, "--check_layout", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.parametrize(("config", "gpus", "tp", "cp", "order"), DOCUMENTED_LAYOUTS)
def test_documented_layouts_build_with_the_analytic_parameter_count(config, gpus, tp, cp, order):
    cfg, result = check(config, gpus, *layout_overrides(tp, cp, order))
    assert (result.mesh.tp, result.mesh.cp, result.mesh.dp) == (tp, cp, gpus // (tp * cp))
    assert result.wrapper == ("DDP" if gpus > tp else "none")
    assert result.without_gradient == []
    # The output is the whole image on every rank (cp gathers the head's tokens back).
    local_batch = cfg.train.global_batch_size // result.mesh.dp
    assert result.pass_output == (local_batch, cfg.data.n_out_channels, *cfg.data.img_size)
    # Each parameter is whole or split exactly over tp, so tp ranks together hold the serial model.
    for parameter in result.parameters:
        assert parameter.local_numel in (parameter.serial_numel, parameter.serial_numel // tp), parameter
    # The built rank holds what the analytic model (docs/model-parallel.md's table) says it holds.
    shape, settings = model_shape_of(cfg), TrainingSettings.from_run_config(cfg)
    assert (
        result.local_count
        == count_parameters_per_gpu(shape, settings, Layout(gpus // (tp * cp), tp, cp)).local
    )
    sharded = sum(p.serial_numel for p in result.parameters if p.local_numel != p.serial_numel)
    assert result.serial_count == sharded + (result.local_count - sharded // tp)
    # Memory: fp32 parameters and their gradients, Adam's two moments plus a step count per tensor.
    assert result.parameter_bytes == 4 * result.local_count == result.gradient_bytes
    assert result.optimizer_state_bytes == 2 * result.parameter_bytes + 4 * len(result.parameters)


@pytest.mark.slow
def test_fsdp2_shards_dim_0_of_each_tp_shard_over_the_dp_x_cp_ranks():
    _, ddp = check("mp", 8, *layout_overrides(2, 1))
    _, fsdp = check("mp", 8, *layout_overrides(2, 1, data_parallel="fsdp"))
    assert fsdp.wrapper == "FSDP2" and fsdp.without_gradient == []
    shards = 4
    for whole, sharded in zip(ddp.parameters, fsdp.parameters, strict=True):
        assert whole.name == sharded.name
        # rank 0 holds the first ceil(rows / shards) rows of its tp shard
        assert sharded.local_shape == (math.ceil(whole.local_shape[0] / shards), *whole.local_shape[1:])
    assert fsdp.gradient_bytes == fsdp.parameter_bytes < ddp.parameter_bytes / 3


def test_another_rank_holds_another_tp_shard_of_the_same_shapes():
    _, first = check("mp", 16, *layout_overrides(4, 1))
    _, other = check("mp", 16, *layout_overrides(4, 1), rank=7)
    assert (other.rank, other.mesh.coordinates(7)) == (7, {"tp": 3, "cp": 0, "dp": 1})
    assert [p.local_shape for p in other.parameters] == [p.local_shape for p in first.parameters]


def test_the_cli_prints_shards_counts_and_memory_and_writes_json(capsys, tmp_path):
    out_file = tmp_path / "check.json"
    layout = ("--set", "parallel.tensor_parallel=4", "--set", "parallel.context_parallel=2")
    status, out, err = run_check(
        capsys, "mp", "--gpus", "64", *layout, "--rank", "5", "--json", str(out_file)
    )
    assert status == 0, err
    assert "layout dp=8 x tp=4 x cp=2 (order tp-cp-dp) on 64 GPUs, DDP: builds (checked rank 5" in out
    assert "blocks.0.attn.q.weight" in out and "(1024, 1024)" in out and "(256, 1024)" in out
    document = json.loads(out_file.read_text())
    assert (document["rank"], document["gpus"], document["layout"]["dp"]) == (5, 64, 8)
    assert f"parameters on rank 5: {document['parameter_count']['rank']:,} of 157,926,400" in out


@pytest.mark.parametrize(
    ("gpus", "overrides", "layout", "reason"),
    [
        (
            3,
            ("parallel.tensor_parallel=3",),
            "3 GPUs as dp=1 x tp=3 x cp=1",
            "4 attention heads do not split",
        ),
        (64, ("parallel.context_parallel=64",), "dp=1 x tp=1 x cp=64", "only 32 tokens to split"),
        (
            6,
            ("parallel.tensor_parallel=4",),
            "6 GPUs as dp=? x tp=4 x cp=1",
            "cannot be split into model replicas",
        ),
        (3, (), "3 GPUs as dp=3 x tp=1 x cp=1", "global_batch_size 4 is not divisible by the 3"),
    ],
)
def test_a_layout_that_cannot_build_is_one_error_line(capsys, gpus, overrides, layout, reason):
    sets = [arg for override in overrides for arg in ("--set", override)]
    status, out, err = run_check(capsys, "tiny", "--gpus", str(gpus), *sets)
    assert status == 2
    assert err.startswith("dlscale: error: ") and err.count("\n") == 1, err
    assert layout in err and reason in err
    assert "Traceback" not in err and out == ""
    assert not dist.is_initialized()


def test_the_fake_process_group_is_gone_and_a_real_one_works_after(tmp_path):
    check("tiny", 8, *layout_overrides(2, 2, data_parallel="fsdp"))
    assert not dist.is_initialized()
    with pytest.raises(ConfigError):
        check("tiny", 3, "parallel.tensor_parallel=3")  # fails inside the fake group's lifetime
    assert not dist.is_initialized()
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        assert dist.get_backend() == "gloo" and dist.get_world_size() == 1
        total = torch.ones(3)
        dist.all_reduce(total)
        assert total.tolist() == [1.0, 1.0, 1.0]
        # and a check refuses to replace a running group instead of breaking it
        with pytest.raises(ConfigError, match="a process group is already running"):
            check("tiny", 2)
        assert dist.get_backend() == "gloo"
    finally:
        dist.destroy_process_group()


def test_a_torch_error_in_the_shape_pass_is_one_line_naming_the_stage():
    from torch import nn

    from dlscale.parallel.parallel_config import ParallelConfig
    from dlscale.perf.plan.layout_check import LayoutRequest, check_layout
    from dlscale.perf.plan.traced_layouts import OptimizerMemory
    from dlscale.perf.plan.traced_memory import TensorSpec

    request = LayoutRequest(
        world_size=4,
        rank=1,
        parallel=ParallelConfig(),
        build_model=lambda: nn.Linear(4, 2),
        parallelize=lambda model, mesh: model,
        fsdp_units=lambda model: (),
        loss=nn.functional.mse_loss,
        sample=(
            TensorSpec((3,), torch.float32),
            TensorSpec((2,), torch.float32),
        ),  # 3 inputs, the model takes 4
        local_batch=2,
        amp_mode="none",
        optimizer=OptimizerMemory("Adam"),
    )
    with pytest.raises(ConfigError) as raised:
        check_layout(request)
    message = str(raised.value)
    assert message.startswith(
        "4 GPUs as dp=4 x tp=1 x cp=1 (ddp), rank 1: the forward/backward shape pass failed: "
    )
    assert "\n" not in message
    assert not dist.is_initialized()


def test_a_user_workload_builds_with_fsdp2_and_its_missing_tp_form_is_named(capsys):
    heat2d = REPO / "examples" / "heat2d" / "heat2d.yaml"
    cfg = load_run_config(heat2d, "demo", ["parallel.data_parallel=fsdp"], {})
    result = layout_check_of(cfg, 4, 3)
    assert result.wrapper == "FSDP2" and result.without_gradient == []
    assert result.local_count < result.serial_count
    status = main(
        ["plan", "--yaml_config", str(heat2d), "--config", "demo", "--gpus", "4", "--check_layout"]
        + ["--set", "parallel.tensor_parallel=2"]
    )
    err = capsys.readouterr().err
    assert status == 2 and "4 GPUs as dp=2 x tp=2 x cp=1 (ddp), rank 0: workload 'heat2d' has no" in err
