"""The analytic plan (``dlscale plan``) counts DDP's all-reduce buckets as a second copy of the gradients exactly
when DDP keeps one: several replicas, gradient synchronization on, and ``parallel.gradient_as_bucket_view: false``
(with bucket views the gradients live in the buckets)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_memory_plan import sliced_parameter_count

from dlscale.config import load_run_config
from dlscale.models.vit import VisionTransformer
from dlscale.perf.plan.layout_cost import FP32_BYTES, GIB, Layout, TrainingSettings
from dlscale.perf.plan.layouts import estimate_layout, model_shape_of

CONFIG_FILE = Path(__file__).resolve().parents[3] / "configs" / "vit_era5.yaml"
CAPACITY = 80 * GIB


def parameters_per_rank(cfg, tp: int) -> int:
    """Parameters one tp rank of the config's ViT holds, counted on the model itself."""
    torch.manual_seed(0)
    model = VisionTransformer(cfg.model, cfg.data.img_size, cfg.data.n_in_channels, cfg.data.n_out_channels)
    return sliced_parameter_count(model, tp, rank=0)


def plan_row(layout: Layout, bucket_view: bool, *overrides: str):
    cfg = load_run_config(
        CONFIG_FILE, "tiny", [*overrides, f"parallel.gradient_as_bucket_view={str(bucket_view).lower()}"]
    )
    row = estimate_layout(model_shape_of(cfg), TrainingSettings.from_run_config(cfg), layout, CAPACITY)
    assert row.valid, row.reason
    return cfg, row


@pytest.mark.parametrize(
    ("layout", "overrides", "ddp_keeps_buckets"),
    [
        pytest.param(Layout(2, 1, 1), (), True, id="ddp-over-dp"),
        pytest.param(Layout(1, 1, 2), (), True, id="ddp-over-cp"),  # cp ranks all-reduce their gradients too
        pytest.param(Layout(2, 2, 1), (), True, id="ddp-of-a-tp-shard"),
        pytest.param(Layout(1, 1, 1), (), False, id="one-replica-no-ddp"),
        pytest.param(Layout(1, 2, 1), (), False, id="tp-only-no-ddp"),
        pytest.param(Layout(2, 1, 1), ("parallel.noddp=true",), False, id="noddp"),
        pytest.param(Layout(2, 1, 1), ("parallel.data_parallel=dataparallel",), False, id="dataparallel"),
    ],
)
def test_ddp_buckets_are_a_second_gradient_copy_only_without_bucket_views(
    layout, overrides, ddp_keeps_buckets
):
    cfg, with_views = plan_row(layout, True, *overrides)
    _, without_views = plan_row(layout, False, *overrides)
    bucket_bytes = parameters_per_rank(cfg, layout.tp) * FP32_BYTES if ddp_keeps_buckets else 0
    assert with_views.memory.sharding_overhead == 0
    assert without_views.memory.sharding_overhead == bucket_bytes
    # The copy is in the total the plan ranks by, and nothing else changes.
    assert without_views.memory.total - with_views.memory.total == bucket_bytes
    assert without_views.to_dict()["memory_bytes"]["sharding_overhead"] == bucket_bytes


def test_fsdp_has_no_ddp_buckets_whatever_the_bucket_view_setting():
    _, with_views = plan_row(Layout(2, 1, 1), True, "parallel.data_parallel=fsdp")
    _, without_views = plan_row(Layout(2, 1, 1), False, "parallel.data_parallel=fsdp")
    assert without_views.memory == with_views.memory
