"""``dlscale.parallel.compare_with_serial``: the check a user's test calls on a workload's parallel form.

The ViT's real tensor- and context-parallel forms pass it; parallel forms broken on purpose (a wrong gradient on
one rank, a row-parallel linear that skips its all-reduce, a parameter dropped or left undeclared as a shard)
fail it with a message naming what is wrong; a ``parallelize`` that raises on one rank, or a workload without
one, fails with that rank's exception instead of hanging. Each check forks 2 gloo ranks (about 2 s).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dlscale.data.era5.config import ERA5DataConfig
from dlscale.models.vit_config import ViTConfig
from dlscale.parallel import (
    Difference,
    EquivalenceReport,
    RankFailed,
    assert_matches_serial,
    compare_with_serial,
)
from dlscale.workloads.era5_vit import WORKLOAD as VIT

MODEL = ViTConfig(embed_dim=32, depth=2, num_heads=4, patch_size=4, mlp_ratio=2.0)
DATA = ERA5DataConfig(img_size=(16, 32), n_in_channels=3, n_out_channels=3)  # 4 x 8 = 32 tokens


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    shape = (2, 3, *DATA.img_size)
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


class BrokenViT:
    """The ERA5 ViT workload whose ``parallelize`` runs the real one, then ``damage(model, mesh)``."""

    def __init__(self, damage):
        self.damage = damage

    def build_model(self, model_cfg, data_cfg):
        return VIT.build_model(model_cfg, data_cfg)

    def loss(self, prediction, target):
        return VIT.loss(prediction, target)

    def parallelize(self, model, mesh):
        model = VIT.parallelize(model, mesh)
        self.damage(model, mesh)
        return model


@pytest.mark.parametrize(("tp", "cp"), [(2, 1), (1, 2)], ids=["tp2", "cp2"])
def test_the_parallel_vit_matches_serial(tp, cp):
    report = assert_matches_serial(VIT, MODEL, DATA, *batch(), tensor_parallel=tp, context_parallel=cp)
    assert report.ok and not report.problems and not report.failures()
    serial_names = {name for name, _ in VIT.build_model(MODEL, DATA).named_parameters()}
    assert set(report.gradients) == set(report.weights) == serial_names  # every parameter was compared
    assert report.output.rel < 1e-5 and report.loss.rel < 1e-5
    assert max(d.rel for d in report.gradients.values()) < 1e-5


def scale_one_shard_gradient_on_rank_1(model, mesh):
    if mesh.index("tp") == 1:
        model.blocks[1].mlp.fc1.weight.register_hook(lambda grad: grad * 1.01)


def test_a_wrong_gradient_on_one_rank_is_named():
    report = compare_with_serial(BrokenViT(scale_one_shard_gradient_on_rank_1), MODEL, DATA, *batch())
    assert not report.ok
    name, kind, worst = report.worst_parameter()
    assert (name, kind) == ("blocks.1.mlp.fc1.weight", "gradient")
    # Rank 1's half of the gathered gradient is 1% off: the error relative to the largest value of the whole
    # gradient is 1% where that value lies in rank 1's half, less where it lies in rank 0's (0.0085 with torch
    # 2.11's initial weights), and always far above the comparison's tolerance.
    assert 10 * report.rtol < worst.rel <= 0.01 * 1.001
    # The forward is right: only the gradients show it (the 1% error in an update is too small to see).
    assert report.output.within(report.rtol, report.atol) and report.loss.within(report.rtol, report.atol)
    message = report.describe()  # what assert_matches_serial raises
    assert "differs from serial" in message
    assert "worst parameter: blocks.1.mlp.fc1.weight (gradient: max abs diff" in message


def skip_the_all_reduce_of_a_row_parallel_linear(model, mesh):
    proj = model.blocks[0].attn.proj
    proj.forward = lambda x: F.linear(x, proj.weight, proj.bias)  # each rank's partial sum, never summed


def test_a_row_parallel_linear_without_its_all_reduce_is_caught():
    with pytest.raises(AssertionError) as raised:
        assert_matches_serial(BrokenViT(skip_the_all_reduce_of_a_row_parallel_linear), MODEL, DATA, *batch())
    message = str(raised.value)
    output_line = next(line for line in message.splitlines() if line.startswith("  output: "))
    assert output_line.endswith(", outside the tolerance")
    assert "worst parameter: blocks." in message


def drop_a_bias(model, mesh):
    model.blocks[0].attn.proj.bias = None


def forget_to_declare_a_shard(model, mesh):
    del model.blocks[0].mlp.fc1.shard_specs["weight"]


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (drop_a_bias, "the parallel model lacks the serial parameter blocks.0.attn.proj.bias"),
        (
            forget_to_declare_a_shard,
            "parameter blocks.0.mlp.fc1.weight has shape (32, 32) after unsharding, serial (64, 32)",
        ),
    ],
    ids=["dropped-bias", "undeclared-shard"],
)
def test_a_missing_or_misshapen_parameter_is_a_problem(damage, problem):
    report = compare_with_serial(BrokenViT(damage), MODEL, DATA, *batch(), steps=1)
    assert not report.ok and problem in report.problems
    assert f"  problem: {problem}" in report.describe()


def refuse_on_rank_1(model, mesh):
    if mesh.rank == 1:
        raise ValueError("no shards for rank 1")


class RaisesOnRank1(BrokenViT):
    def parallelize(self, model, mesh):
        refuse_on_rank_1(model, mesh)  # rank 0 meanwhile waits in the real parallelize's broadcast
        return VIT.parallelize(model, mesh)


def test_parallelize_raising_on_one_rank_names_the_rank_and_does_not_hang():
    with pytest.raises(RankFailed) as raised:
        compare_with_serial(RaisesOnRank1(None), MODEL, DATA, *batch(), timeout_s=60)
    message = str(raised.value)
    assert message.startswith(
        "workload.parallelize raised on rank 1 of 2 (tp=2 x cp=1 on 2 rank(s)): ValueError: no shards for rank 1"
    )
    assert "(rank 0 then failed in workload.parallelize" in message  # its broadcast ended when rank 1 left


def test_a_workload_without_parallelize_gives_its_config_error():
    from dlscale.data.mnist.config import MNISTDataConfig
    from dlscale.models.cnn_config import CNNConfig
    from dlscale.workloads.cnn_mnist import WORKLOAD as CNN

    images, labels = torch.randn(2, 1, 28, 28), torch.tensor([3, 7])
    with pytest.raises(RankFailed) as raised:
        compare_with_serial(CNN, CNNConfig(), MNISTDataConfig(), images, labels, tensor_parallel=2)
    message = str(raised.value)
    assert "workload.parallelize raised on rank" in message and "ConfigError: workload 'cnn_mnist'" in message
    assert "set parallel.tensor_parallel and parallel.context_parallel to 1" in message


def test_nan_never_matches_and_a_negligible_difference_does():
    nan, tiny = Difference(float("nan"), 1.0, 0, 0), Difference(1e-9, 1.0, 0, 1)
    assert not nan.within(1e-5, 0.0) and tiny.within(1e-5, 0.0)
    report = EquivalenceReport("tp=2", 1e-5, 0.0, output=tiny, loss=tiny, gradients={"w": nan, "b": tiny})
    assert not report.ok and report.failures() == [("gradient of w", nan)]
    assert report.worst_parameter() == ("w", "gradient", nan)
