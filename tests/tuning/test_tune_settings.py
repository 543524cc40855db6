"""The tune's settings <-> config keys: batch spelling, run length in samples, the LR rule, the tuned YAML."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dlscale.config import load_run_config
from dlscale.tuning.knobs import BATCH_KEY, SETTING_KEYS
from dlscale.tuning.report import changed_sections, extends_reference, tuned_yaml
from dlscale.tuning.settings import config_keys, lr_note, read_settings, run_length_keys

REPO = Path(__file__).resolve().parents[2]
CONFIG_FILE = REPO / "configs" / "vit_era5.yaml"


def test_settings_are_the_effective_values_of_every_tunable_key():
    cfg = load_run_config(CONFIG_FILE, "demo", ["loader.num_data_workers=2", "optim.enable_fused=true"])
    settings = read_settings(cfg, data_parallel_ranks=1)
    assert set(settings) == set(SETTING_KEYS)
    assert settings["loader.num_data_workers"] == 2 and settings["optim.enable_fused"] is True
    assert settings[BATCH_KEY] == 16  # demo sets the global batch only
    assert read_settings(cfg, data_parallel_ranks=4)[BATCH_KEY] == 4


def test_changed_batch_is_written_in_the_configs_own_spelling():
    by_global = load_run_config(CONFIG_FILE, "demo")
    settings = {**read_settings(by_global, 2), BATCH_KEY: 16, "optim.enable_fused": True}
    assert config_keys(by_global, settings, 2) == {"train.global_batch_size": 32, "optim.enable_fused": True}
    by_local = load_run_config(CONFIG_FILE, "demo", ["train.local_batch_size=8"])
    settings = {**read_settings(by_local, 2), BATCH_KEY: 16}
    assert config_keys(by_local, settings, 2) == {"train.local_batch_size": 16}
    assert config_keys(by_local, read_settings(by_local, 2), 2) == {}


def test_a_new_batch_keeps_the_run_length_and_warmup_in_samples():
    demo = load_run_config(CONFIG_FILE, "demo")  # 400 steps at 16, warm-up 20
    keys, notes = run_length_keys(demo, 64, 1)
    assert keys == {"train.num_iters": 100, "optim.warmup": 5}
    assert any("num_iters 400 -> 100" in note for note in notes)
    assert run_length_keys(demo, 16, 1) == ({}, [])
    # A config counted in epochs needs no new length.
    tiny = load_run_config(CONFIG_FILE, "tiny")
    assert run_length_keys(tiny, 8, 1)[0] == {}


def test_lr_note_applies_the_configs_rule():
    demo = load_run_config(CONFIG_FILE, "demo")  # sqrt rule, lr 2e-3 at 16
    assert "0.002 -> 0.00283 by the config's sqrt rule" in lr_note(demo, 16, 32)
    flat = load_run_config(CONFIG_FILE, "demo", ["optim.lr_scaling=none"])
    assert "stays 0.002" in lr_note(flat, 16, 32)


def test_changed_sections_keep_only_differing_keys():
    original = {"workload": "era5_vit", "train": {"a": 1, "b": 2}, "optim": {"c": 3}}
    tuned = {"workload": "era5_vit", "train": {"a": 1, "b": 5}, "optim": {"c": 3}}
    assert changed_sections(original, tuned) == {"train": {"b": 5}}


def test_extends_reference_is_relative_inside_the_project_and_absolute_outside(tmp_path, monkeypatch):
    project = tmp_path / "project"
    (project / "configs").mkdir(parents=True)
    original = project / "configs" / "model.yaml"
    original.write_text("base: {}\n")
    monkeypatch.chdir(project)
    assert extends_reference(original, "base", project / "tuned" / "t.yaml") == "../configs/model.yaml:base"
    outside = tmp_path / "elsewhere" / "t.yaml"
    assert extends_reference(original, "base", outside) == f"{original.resolve()}:base"


def test_tuned_yaml_reads_back_as_the_original_with_the_changes(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    out = tmp_path / "tuned.yaml"
    sections = {"optim": {"enable_fused": True}, "train": {"global_batch_size": 32}}
    text = tuned_yaml("demo_tuned", extends_reference(CONFIG_FILE, "demo", out), sections, ["a header", ""])
    out.write_text(text)
    assert text.startswith("# a header\n#\n")
    assert list(yaml.safe_load(text)) == ["demo_tuned"]
    tuned = load_run_config(out, "demo_tuned").to_dict()
    original = load_run_config(CONFIG_FILE, "demo").to_dict()
    assert changed_sections(original, tuned) == sections


@pytest.mark.parametrize("ranks", [1, 3])
def test_config_keys_round_trip_through_the_config(ranks):
    cfg = load_run_config(CONFIG_FILE, "demo", ["train.global_batch_size=24"])
    settings = {**read_settings(cfg, ranks), "train.amp_mode": "bf16", BATCH_KEY: 16}
    tuned = load_run_config(
        CONFIG_FILE, "demo", ["train.global_batch_size=24"], config_keys(cfg, settings, ranks)
    )
    assert read_settings(tuned, ranks) == settings
