"""Finding config files: a path that exists, else the config file of that name that ships with dlscale."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlscale.config import load_run_config
from dlscale.config.yaml_source import SHIPPED_CONFIGS, locate_config_file
from dlscale.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_the_shipped_configs_are_the_repositorys_configs():
    assert (SHIPPED_CONFIGS / "vit_era5.yaml").read_bytes() == (
        REPO / "configs" / "vit_era5.yaml"
    ).read_bytes()


@pytest.mark.parametrize("name", ["configs/vit_era5.yaml", "vit_era5.yaml"])
def test_the_shipped_configs_work_from_any_directory(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    cfg = load_run_config(name, "short", ["log.expdir=runs"])
    assert Path(cfg.source) == SHIPPED_CONFIGS / "vit_era5.yaml"
    assert cfg.data.limit_nsamples == 512


def test_a_local_file_wins_over_the_shipped_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "vit_era5.yaml").write_text("short:\n  lr: 1e-3\n")
    cfg = load_run_config("configs/vit_era5.yaml", "short")
    assert cfg.source == "configs/vit_era5.yaml" and cfg.optim.lr == 1e-3


@pytest.mark.parametrize("name", ["/nowhere/vit_era5.yaml", "elsewhere/vit_era5.yaml", "nope.yaml"])
def test_other_missing_paths_are_errors_that_list_the_shipped_files(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"does not exist .* dlscale ships .*vit_era5\.yaml"):
        locate_config_file(name)
