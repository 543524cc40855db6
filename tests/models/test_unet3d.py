"""The tutorial's 3D U-Net, its loss and metrics, and the shipped configs of configs/unet_cosmo.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from torch.utils.flop_counter import FlopCounterMode

from dlscale.config import load_run_config
from dlscale.data.cosmo.config import CosmoDataConfig
from dlscale.errors import ConfigError, InvalidValue
from dlscale.models.parameters import count_parameters
from dlscale.models.unet3d import UNet3D, size_problem, unet_flops_per_sample
from dlscale.models.unet3d_config import UNetConfig
from dlscale.training.schedule import scaled_lr
from dlscale.workloads.cosmo_metrics import CosmoEvaluator, cosmo_loss, per_sample_loss
from dlscale.workloads.unet_cosmo import WORKLOAD

CONFIG_FILE = Path(__file__).resolve().parents[2] / "configs" / "unet_cosmo.yaml"


def meta_unet(**changes) -> UNet3D:
    with torch.device("meta"):  # no memory, no init cost: 117 M parameters in milliseconds
        return UNet3D(UNetConfig(**changes))


def test_parameter_counts_are_the_tutorials():
    assert count_parameters(meta_unet(full_scale=True)) == 116_977_029
    assert count_parameters(meta_unet(full_scale=False)) == 66_644_357
    widths = [m.out_channels for m in meta_unet(base_channels=8).modules() if isinstance(m, torch.nn.Conv3d)]
    assert widths == [8, 16, 32, 64, 64, 64]  # scaled with base_channels


def test_shapes_range_and_initialization():
    torch.manual_seed(0)
    model = UNet3D(UNetConfig(full_scale=False, base_channels=4))
    output = model(torch.randn(2, 4, 32, 32, 32))
    assert output.shape == (2, 5, 32, 32, 32) and output.abs().max() < 1  # tanh
    weights = torch.cat([m.weight.flatten() for m in model.modules() if isinstance(m, torch.nn.Conv3d)])
    assert abs(weights.std().item() - 0.02) < 0.001 and abs(weights.mean().item()) < 0.001
    assert all(not m.bias.any() for m in model.modules() if isinstance(m, torch.nn.ConvTranspose3d))
    assert list(model.buffers()) == []  # nothing for DDP to broadcast


def test_channels_last_is_the_same_model():
    torch.manual_seed(0)
    plain = UNet3D(UNetConfig(full_scale=False, base_channels=4, channels_last=False))
    fast = UNet3D(UNetConfig(full_scale=False, base_channels=4, channels_last=True))
    fast.load_state_dict(plain.state_dict())
    inputs = torch.randn(1, 4, 32, 32, 32)
    torch.testing.assert_close(fast(inputs), plain(inputs), rtol=1e-4, atol=1e-5)


def test_analytic_flops_match_torch_counter_and_the_tutorials_27_gflop():
    cfg = UNetConfig(full_scale=False, base_channels=4)
    with FlopCounterMode(display=False) as counter:
        UNet3D(cfg)(torch.randn(1, 4, 32, 32, 32))
    assert unet_flops_per_sample(cfg, 32) == counter.get_total_flops()
    assert unet_flops_per_sample(UNetConfig(), 64) / 1e9 == pytest.approx(27.2, abs=0.05)


def test_crop_sizes_must_fit_the_levels():
    assert size_problem(UNetConfig(full_scale=True), 64) is None
    assert size_problem(UNetConfig(full_scale=False), 32) is None
    message = size_problem(UNetConfig(full_scale=True), 32)
    assert "data_size 32 is not divisible by 2^6 = 64" in message and "full_scale: false" in message
    assert "use data_size 64 or 128" in size_problem(UNetConfig(full_scale=True), 96)
    with pytest.raises(ConfigError, match="model.full_scale / data.data_size: data_size 32 is not divisible"):
        WORKLOAD.build_model(UNetConfig(full_scale=True), CosmoDataConfig(data_size=32))
    with pytest.raises(InvalidValue, match="weight_init"):
        UNetConfig(weight_init={"conv_init": "xavier", "conv_scale": 0.02, "conv_bias": 0.0})


def test_loss_is_l1_plus_the_density_term():
    torch.manual_seed(0)
    prediction, target = torch.rand(3, 5, 4, 4, 4) * 0.2, torch.rand(3, 5, 4, 4, 4) * 0.2
    l1 = (prediction - target).abs().mean()
    assert cosmo_loss(prediction, target) == pytest.approx(l1.item())
    density = (torch.exp(14 * prediction[:, 0]) - torch.exp(14 * target[:, 0])).abs().mean()
    assert cosmo_loss(prediction, target, 0.5).item() == pytest.approx((l1 + 0.5 * density).item(), rel=1e-6)
    # The per-sample losses (validation) average to the batch loss (training).
    assert per_sample_loss(prediction, target, 0.5).mean().item() == pytest.approx(
        cosmo_loss(prediction, target, 0.5).item(), rel=1e-6
    )


class _Channels:
    target_channel_names = ("gas_log_density", "temperature", "gas_vx", "gas_vy", "gas_vz")


def test_evaluator_reports_l1_per_channel_and_the_zeros_baseline():
    torch.manual_seed(0)
    evaluator = CosmoEvaluator(_Channels(), image_channel="temperature")
    targets = torch.rand(4, 5, 8, 8, 8) - 0.5
    predictions = targets + 0.01
    evaluator.update(torch.zeros(3, 4, 8, 8, 8), targets[:3], predictions[:3])  # batches of any size
    evaluator.update(torch.zeros(1, 4, 8, 8, 8), targets[3:], predictions[3:])
    summary = evaluator.summary()
    assert summary.samples == 4 and summary.headline == "L1" and summary.baseline_name == "zeros"
    assert summary.scalars["L1"] == pytest.approx(0.01, rel=1e-4)
    assert summary.loss == pytest.approx(0.01, rel=1e-4)
    assert summary.baseline_scalars["L1"] == pytest.approx(targets.abs().mean().item(), rel=1e-5)
    assert summary.baseline_scalars["L1/temperature"] == pytest.approx(
        targets[:, 1].abs().mean().item(), rel=1e-5
    )
    assert summary.example.target.shape == (8, 8) and summary.example.channel.startswith("temperature")
    assert "predicting zeros" in summary.lines[0]
    with pytest.raises(ConfigError, match="not a target channel"):
        CosmoEvaluator(_Channels(), image_channel="t2m")


def test_every_shipped_config_resolves():
    names = list(yaml.safe_load(CONFIG_FILE.read_text()))
    assert {"base", "short", "short_opt", "bs8192_opt", "base_sm", "bs9216_opt_sm", "demo", "tiny"} <= {
        *names
    }
    for name in names:
        cfg = load_run_config(CONFIG_FILE, name)
        assert cfg.workload == "unet_cosmo"
        assert size_problem(cfg.model, cfg.data.data_size) is None, name
        if cfg.train.global_batch_size > cfg.optim.base_batch_size:
            assert cfg.optim.warmup == 128, name  # the tutorial warms up only above the base batch size
    base = load_run_config(CONFIG_FILE, "base")
    assert isinstance(base.data, CosmoDataConfig) and base.data.box_size == [1024, 512]
    assert base.optim.betas == (0.9, 0.999) and base.optim.warmup == 0
    # The peak LRs the reference derives for the sqrt rule.
    for name, peak in (("bs256_opt", 4.0e-4), ("bs2048_opt", 1.131e-3)):
        cfg = load_run_config(CONFIG_FILE, name)
        lr = scaled_lr(
            cfg.optim.lr, cfg.optim.lr_scaling, cfg.train.global_batch_size, cfg.optim.base_batch_size
        )
        assert lr == pytest.approx(peak, rel=1e-3), name
    opt = load_run_config(CONFIG_FILE, "bs576_opt_sm")
    assert (opt.loader.pipeline, opt.train.amp_mode, opt.optim.enable_fused) == ("gpu", "fp16", True)
    assert opt.optim.base_batch_size == 32 and opt.train.num_epochs == 12


def test_a_run_gets_a_workload_bound_to_its_lambda_rho_and_the_registered_one_stays_plain():
    from dlscale.workloads import get_workload

    registered = get_workload("unet_cosmo")
    bound = registered.configured(UNetConfig(lambda_rho=0.5), None)
    prediction, target = torch.full((1, 5, 2, 2, 2), 0.1), torch.zeros(1, 5, 2, 2, 2)
    plain = registered.loss(prediction, target)
    assert registered.lambda_rho == 0.0 and bound.lambda_rho == 0.5
    assert float(bound.loss(prediction, target)) > float(plain) == pytest.approx(0.1)
