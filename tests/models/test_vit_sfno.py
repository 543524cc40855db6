"""The ViT with ``model.mixer: sfno``: its transform sits on the latitudes of the patch rows of the data it reads,
and a checkpoint carries the transform's tables, so a model rebuilt on other latitudes (no data at hand) computes
what the trained one did."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dlscale.config import load_run_config
from dlscale.data.era5.coordinates import formula_latitudes
from dlscale.errors import InvalidValue
from dlscale.models.vit import VisionTransformer, patch_row_latitudes
from dlscale.models.vit_config import ViTConfig
from dlscale.workloads.era5_vit import WORKLOAD

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "vit_era5.yaml"
SFNO = ViTConfig(embed_dim=16, depth=2, num_heads=4, patch_size=4, mixer="sfno", sfno_num_blocks=2)


def test_the_patch_rows_lie_at_the_mean_latitude_of_their_image_rows():
    np.testing.assert_allclose(patch_row_latitudes([90, 80, 70, 60, 50, 40], 2), [85, 65, 45])
    with pytest.raises(InvalidValue, match="4 does not divide the 6 image rows"):
        patch_row_latitudes(np.arange(6.0), 4)


def test_the_workload_builds_the_transform_on_the_patch_rows_of_its_data(tiny_era5: Path, tmp_path: Path):
    cfg = load_run_config(CONFIG, "sfno_tiny", [f"data.root={tiny_era5}", f"log.expdir={tmp_path}"])
    model = WORKLOAD.build_model(cfg.model, cfg.data)
    rows = model.blocks[0].filter.filter.sht.rows  # SFNOMixer -> SpectralConvS2 -> its transform
    # the tiny files hold no coordinates: the tutorial's pole-to-pole rows of their height (16), by 4-row patches
    expected = patch_row_latitudes(formula_latitudes(16), cfg.model.patch_size)
    np.testing.assert_allclose(90.0 - np.degrees(rows.theta), expected, atol=1e-9)


def test_a_checkpoint_carries_the_tables_of_the_grid_it_was_trained_on():
    torch.manual_seed(0)
    trained = VisionTransformer(SFNO, (16, 32), 3, 3, formula_latitudes(16))
    elsewhere = VisionTransformer(SFNO, (16, 32), 3, 3, formula_latitudes(17)[:16])  # the 17-row guess
    inputs = torch.randn(2, 3, 16, 32)
    with torch.no_grad():
        assert not torch.allclose(trained(inputs), elsewhere(inputs))
        elsewhere.load_state_dict(trained.state_dict())
        torch.testing.assert_close(elsewhere(inputs), trained(inputs))


def test_an_sfno_model_without_latitudes_is_refused():
    with pytest.raises(InvalidValue, match="sfno needs the latitudes of the image's 16 rows, got none"):
        VisionTransformer(SFNO, (16, 32), 3, 3)
