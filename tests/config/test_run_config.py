"""RunConfig: sections, flat tutorial keys, overrides, "not available yet" keys, round trips, shipped configs."""

from __future__ import annotations

import dataclasses
import logging
import textwrap
from pathlib import Path

import pytest

from dlscale.config import config_reference, load_run_config
from dlscale.config.run_config import SECTION_ORDER, flat_key_homes, section_classes
from dlscale.config.yaml_source import read_config_file
from dlscale.errors import ConfigError
from dlscale.parallel.parallel_config import ParallelConfig
from dlscale.training.optim_config import OptimConfig
from dlscale.training.schedule import scaled_lr

SHIPPED = Path(__file__).resolve().parents[2] / "configs" / "vit_era5.yaml"
# The tutorial's optimized configs: DALI-role loader, AMP fp16, compile, fused Adam.
OPT_CONFIGS = {"short_opt", "opt", "mp", "mp_bs16", "mp_bs32", "mp_patch4"} | {
    f"bs{size}_opt" for size in (16, 32, 64, 128, 256, 512, 1024, 2048)
}


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def load(tmp_path: Path, text: str, name: str = "base", overrides=(), flags=None):
    return load_run_config(write(tmp_path, text), name, list(overrides), flags)


def load_error(tmp_path: Path, text: str, name: str = "base", overrides=(), flags=None) -> tuple[str, Path]:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_run_config(path, name, list(overrides), flags)
    return str(info.value), path


def assert_names(message: str, *fragments: str) -> None:
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from: {message}"


MINIMAL = "base:\n  workload: era5_vit\n"


# --------------------------------------------------------------------------------------------- sections


def test_an_empty_config_gives_every_section_its_defaults(tmp_path):
    cfg = load(tmp_path, MINIMAL + "  optim:\n")
    assert list(cfg.to_dict()) == ["workload", *SECTION_ORDER]
    for section, cls in section_classes("era5_vit").items():
        assert getattr(cfg, section) == cls()
    assert (cfg.name, cfg.source, cfg.overrides) == ("base", str(tmp_path / "run.yaml"), ())


def test_sections_are_typed(tmp_path):
    text = """
        base:
          data: {img_size: [32, 64], limit_nsamples: None}
          model: {embed_dim: 64, num_heads: 4, mlp_ratio: 4}
          optim: {lr: 5E-4, betas: [0.9, 0.99], lr_scaling: sqrt, base_batch_size: 16}
          train: {global_batch_size: 1e2, num_iters: 10}
    """
    cfg = load(tmp_path, text)
    assert cfg.data.img_size == (32, 64) and cfg.data.limit_nsamples is None
    assert cfg.model.embed_dim == 64 and cfg.model.mlp_ratio == 4.0
    assert cfg.optim.lr == 5e-4 and cfg.optim.betas == (0.9, 0.99)
    assert cfg.train.global_batch_size == 100 and type(cfg.train.global_batch_size) is int


def test_an_unknown_key_in_a_section_names_file_config_key_and_the_closest(tmp_path):
    message, path = load_error(tmp_path, "base:\n  optim: {lrr: 1e-3}\n")
    assert_names(message, str(path), "[config 'base']", "optim.lrr", "did you mean 'lr'?")


def test_an_unknown_top_level_key_gets_a_suggestion(tmp_path):
    message, path = load_error(tmp_path, "base:\n  embed_dimm: 64\n")
    assert_names(message, str(path), "[config 'base']", "'embed_dimm'", "did you mean 'embed_dim'?")
    message, _ = load_error(tmp_path, "base:\n  optm: {lr: 1}\n")
    assert_names(message, "'optm'", "did you mean 'optim'?")


def test_a_section_that_is_not_a_mapping_is_refused(tmp_path):
    message, path = load_error(tmp_path, "base:\n  optim: 5\n")
    assert_names(message, str(path), "[config 'base']", "section 'optim' must be a mapping")


def test_an_unknown_workload_gets_a_suggestion(tmp_path):
    message, path = load_error(tmp_path, "base:\n  workload: era5_vti\n")
    assert_names(message, str(path), "unknown workload 'era5_vti'", "did you mean 'era5_vit'?")


def test_flat_keys_land_in_their_sections(tmp_path):
    text = "base:\n  lr: 5E-4\n  embed_dim: 64\n  num_data_workers: 2\n  num_heads: 4\n  seed: 7\n"
    cfg = load(tmp_path, text)
    assert cfg.optim.lr == 5e-4
    assert cfg.model.embed_dim == 64 and cfg.model.num_heads == 4
    assert cfg.loader.num_data_workers == 2
    assert cfg.train.seed == 7


def test_a_key_given_flat_and_nested_must_agree(tmp_path):
    assert load(tmp_path, "base:\n  lr: 1e-3\n  optim: {lr: 0.001}\n").optim.lr == 1e-3
    message, path = load_error(tmp_path, "base:\n  lr: 1e-3\n  optim: {lr: 2e-3}\n")
    assert_names(message, str(path), "[config 'base']", "optim.lr", "given twice")


def test_a_childs_flat_key_overrides_its_parents_nested_key(tmp_path):
    text = "base:\n  optim: {lr: 5E-4}\nchild:\n  extends: base\n  lr: 1e-3\n"
    assert load(tmp_path, text, "child").optim.lr == 1e-3


def test_a_childs_nested_key_overrides_its_parents_flat_key(tmp_path):
    text = "base:\n  lr: 5E-4\n  embed_dim: 64\nchild:\n  extends: base\n  optim: {lr: 1e-3}\n"
    cfg = load(tmp_path, text, "child")
    assert cfg.optim.lr == 1e-3 and cfg.model.embed_dim == 64


def test_an_anchor_merge_mixing_styles_is_refused_with_the_reason(tmp_path):
    # YAML merges `<<:` before dlscale sees the keys, so it cannot tell which of the two values is the child's.
    text = "base: &base\n  lr: 5E-4\nchild:\n  <<: *base\n  optim: {lr: 1e-3}\n"
    message, path = load_error(tmp_path, text, "child")
    assert str(path) in message and "optim.lr is given twice" in message and "extends:" in message


def test_flat_keys_that_two_sections_share_have_no_flat_home():
    @dataclasses.dataclass
    class A:
        seed: int = 0
        alpha: int = 0

    @dataclasses.dataclass
    class B:
        seed: int = 0
        beta: int = 0

    assert flat_key_homes({"a": A, "b": B}) == {"alpha": "a", "beta": "b"}


@pytest.mark.parametrize("key", ["wireup_info", "wireup_store"])
def test_tutorial_wireup_keys_are_ignored_with_a_warning(tmp_path, caplog, key):
    with caplog.at_level(logging.WARNING, logger="dlscale"):
        cfg = load(tmp_path, f"base:\n  {key}: env\n  lr: 1e-3\n")
    assert cfg.optim.lr == 1e-3
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(key in w and "ignoring" in w for w in warnings), warnings
    assert key not in str(cfg.to_dict())


# --------------------------------------------------------------------------------------------- overrides


@pytest.mark.parametrize("override", ["optim.lr=1e-3", "lr=1e-3", "optim.lr = 1E-3", "lr=0.001"])
def test_set_overrides_dotted_or_flat(tmp_path, override):
    cfg = load(tmp_path, "base:\n  lr: 5E-4\n", overrides=[override])
    assert cfg.optim.lr == 1e-3 and type(cfg.optim.lr) is float
    assert cfg.overrides == (override,)


@pytest.mark.parametrize(
    ("override", "section", "key", "expected"),
    [
        ("log.run_num=00", "log", "run_num", "00"),
        ("run_num=007", "log", "run_num", "007"),
        ("data.img_size=[32,64]", "data", "img_size", (32, 64)),
        ("log.progress=none", "log", "progress", "none"),
        ("log.image_channel=null", "log", "image_channel", None),
        ("train.num_iters=1e3", "train", "num_iters", 1000),
        ("loader.pin_memory=false", "loader", "pin_memory", False),
        ("optim.betas=[0.8, 0.9]", "optim", "betas", (0.8, 0.9)),
        ("data.root=/scratch/a=b", "data", "root", "/scratch/a=b"),
    ],
)
def test_set_values_are_typed_by_their_key(tmp_path, override, section, key, expected):
    value = getattr(getattr(load(tmp_path, MINIMAL, overrides=[override]), section), key)
    assert value == expected and type(value) is type(expected)


def test_set_without_equals_is_refused(tmp_path):
    message, _ = load_error(tmp_path, MINIMAL, overrides=["optim.lr"])
    assert_names(message, "--set 'optim.lr'", "expected key=value")


@pytest.mark.parametrize(
    ("override", "fragments"),
    [
        ("optim.lrr=1", ["--set optim.lrr=1", "unknown key optim.lrr", "did you mean 'lr'?"]),
        ("lrr=1", ["--set lrr=1", "unknown key 'lrr'", "did you mean 'lr'?"]),
        ("optm.lr=1", ["--set optm.lr=1", "unknown section 'optm'", "did you mean 'optim'?"]),
        ("optim.lr=abc", ["--set optim.lr=abc", "expected a number", "'abc'"]),
        ("log.progress=bra", ["--set log.progress=bra", "did you mean 'bar'?"]),
    ],
)
def test_bad_set_overrides_are_named(tmp_path, override, fragments):
    message, _ = load_error(tmp_path, MINIMAL, overrides=[override])
    assert_names(message, *fragments)


def test_flag_values_are_applied_after_set(tmp_path):
    cfg = load(
        tmp_path, MINIMAL, overrides=["train.num_iters=10"], flags={"train.num_iters": 20, "log.run_num": "7"}
    )
    assert cfg.train.num_iters == 20 and cfg.log.run_num == "7"
    assert cfg.overrides == ("train.num_iters=10", "train.num_iters=20", "log.run_num=7")


def test_a_bad_flag_value_names_the_flag(tmp_path):
    message, _ = load_error(tmp_path, MINIMAL, flags={"train.num_iters": "many"})
    assert_names(message, "--num_iters many", "expected an integer")


def test_overrides_beat_flat_and_nested_file_values(tmp_path):
    cfg = load(tmp_path, "base:\n  lr: 5E-4\n  model: {depth: 3}\n", overrides=["lr=2e-3", "depth=5"])
    assert cfg.optim.lr == 2e-3 and cfg.model.depth == 5


# --------------------------------------------------------------------------------------------- checks


def test_model_parallel_sizes_load_and_bad_ones_name_their_key(tmp_path):
    cfg = load(tmp_path, MINIMAL, overrides=["parallel.tensor_parallel=2", "parallel.context_parallel=4"])
    assert (cfg.parallel.tensor_parallel, cfg.parallel.context_parallel) == (2, 4)
    message, path = load_error(tmp_path, MINIMAL, overrides=["parallel.context_parallel=0"])
    assert_names(message, str(path), "parallel.context_parallel", ">= 1", "got 0")
    message, path = load_error(tmp_path, MINIMAL, overrides=["parallel.parallel_order=tp-dp"])
    assert_names(message, str(path), "parallel.parallel_order", "tp, cp, dp", "'tp-dp'")
    with pytest.raises(ConfigError, match="tensor_parallel"):
        ParallelConfig(tensor_parallel=0)


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        (["optim.lr_scaling=sqrt"], ["optim.base_batch_size", "lr_scaling 'sqrt' needs"]),
        (["loader.num_data_workers=-1"], ["loader.num_data_workers", "must be >= 0"]),
        (["parallel.parallel_order=tp-dp"], ["parallel.parallel_order", "tp, cp, dp", "'tp-dp'"]),
        (["parallel.parallel_order=tp-tp-dp"], ["parallel.parallel_order"]),
        (["optim.lr=0"], ["optim.lr", "must be > 0"]),
        (["optim.end_lr=1"], ["optim.end_lr", "above the peak lr"]),
        (["model.embed_dim=100"], ["model.embed_dim", "not a multiple of num_heads=8"]),
        (["train.num_iters=null"], ["train.num_iters", "both are null"]),
        (["data.n_out_channels=21"], ["data.n_out_channels", "n_in_channels=20"]),
        (["data.img_size=[0,8]"], ["data.img_size", "positive integers"]),
        (["log.run_num=a/b"], ["log.run_num", "without '/'"]),
        (["checkpoint.save_every_epochs=0"], ["checkpoint.save_every_epochs", "must be >= 1"]),
    ],
)
def test_semantic_checks_name_file_and_key(tmp_path, overrides, fragments):
    message, path = load_error(tmp_path, MINIMAL, overrides=overrides)
    assert_names(message, str(path), "[config 'base']", *fragments)


# YAML's spellings, and text that YAML leaves a string but the float fields read as a number like "5E-4".
NON_FINITE_SPELLINGS = [".nan", ".NaN", ".inf", "-.inf", "nan", "inf", "-inf", "1e999"]


@pytest.mark.parametrize("value", NON_FINITE_SPELLINGS)
@pytest.mark.parametrize("key", ["lr", "end_lr", "eps", "weight_decay", "max_grad_norm"])
def test_non_finite_optimizer_values_are_refused(tmp_path, key, value):
    message, path = load_error(tmp_path, MINIMAL, overrides=[f"optim.{key}={value}"])
    assert_names(message, str(path), "[config 'base']", f"optim.{key}", "must be a finite number")


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_non_finite_optimizer_values_in_the_file_are_refused(tmp_path, value):
    message, path = load_error(tmp_path, MINIMAL + f"  optim: {{lr: 1e-3, max_grad_norm: {value}}}\n")
    assert_names(message, str(path), "[config 'base']", "optim.max_grad_norm", "must be a finite number")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize(
    "name", ["lr", "eps", "weight_decay", "momentum", "rho", "lr_gamma", "end_lr", "max_grad_norm", "betas"]
)
def test_every_float_of_the_optimizer_must_be_finite(name, bad):
    value = (0.9, bad) if name == "betas" else bad
    with pytest.raises(ConfigError, match=f"^{name}: .*finite number"):
        OptimConfig(**{name: value})


# --------------------------------------------------------------------------------------------- output


def round_trip(tmp_path: Path, cfg) -> dict:
    path = tmp_path / "resolved.yaml"
    path.write_text(cfg.to_yaml())
    return load_run_config(path, cfg.name).to_dict()


def test_to_yaml_reloads_to_the_same_config(tmp_path):
    text = "base:\n  lr: 5E-4\n  data: {img_size: [32, 64], limit_nsamples: 8}\n  log: {run_num: '00'}\n"
    cfg = load(tmp_path, text, overrides=["optim.eps=1e-10", "log.expdir=/tmp/x y"])
    assert cfg.to_yaml().startswith("# Resolved dlscale config 'base' from ")
    assert "optim.eps=1e-10" in cfg.to_yaml().splitlines()[1]
    assert round_trip(tmp_path, cfg) == cfg.to_dict()


@pytest.mark.parametrize("name", ["short", "demo", "tiny"])
def test_shipped_configs_round_trip_through_to_yaml(tmp_path, name):
    cfg = load_run_config(SHIPPED, name)
    assert round_trip(tmp_path, cfg) == cfg.to_dict()


def test_to_yaml_quotes_strings_that_read_back_as_numbers(tmp_path):
    cfg = load(tmp_path, MINIMAL, flags={"log.run_num": "1e-3", "log.expdir": "5E-4"})
    assert round_trip(tmp_path, cfg) == cfg.to_dict()


def test_config_reference_lists_every_key_of_every_section():
    reference = config_reference()
    lines = reference.splitlines()
    assert lines[0].startswith("workload: one of era5_vit")
    for section, cls in section_classes("era5_vit").items():
        start = lines.index(f"{section}:  ({cls.__name__})")
        block = lines[start + 1 : start + 1 + len(dataclasses.fields(cls))]
        assert [line.split(":")[0].strip() for line in block] == [f.name for f in dataclasses.fields(cls)]
    assert "  lr: a number (default 0.0005)" in lines
    assert "  img_size: a list [an integer, an integer] (default (360, 720))" in lines


# --------------------------------------------------------------------------------------------- tutorial YAML


TUTORIAL_STYLE = """
    base: &base
      embed_dim: 384
      depth: 12
      dropout: 0.0
      patch_size: 8
      num_heads: 8
      img_size: [360, 720]
      dt: 1
      global_batch_size: 16
      num_iters: 30000
      amp_mode: none
      enable_fused: false
      enable_jit: false
      expdir: '/logs'
      lr_schedule: 'cosine'
      lr: 5E-4
      warmup: 0
      optimizer: 'Adam'
      data_loader_config: 'pytorch'
      num_data_workers: 0
      n_in_channels: 20
      n_out_channels: 20
      train_data_path: '/data/train'
      valid_data_path: '/data/valid'
      inf_data_path: '/data/test'
      time_means_path: '/data/stats/time_means.npy'
      global_means_path: '/data/stats/global_means.npy'
      global_stds_path: '/data/stats/global_stds.npy'
      limit_nsamples: None
      limit_nsamples_val: None
      wireup_info: env
      wireup_store: tcp

    short: &short
      <<: *base
      limit_nsamples: 512
      limit_nsamples_val: 128
      num_iters: 128

    bs32_opt:
      <<: *base
      global_batch_size: 32
      lr: 7.07E-4
"""


def test_a_tutorial_style_flat_yaml_loads_into_sections(tmp_path):
    base = load(tmp_path, TUTORIAL_STYLE)
    assert (base.model.embed_dim, base.model.depth, base.model.patch_size) == (384, 12, 8)
    assert base.data.img_size == (360, 720) and base.data.limit_nsamples is None
    assert str(base.data.path("train_data_path")) == "/data/train"
    assert str(base.data.path("global_stds_path")) == "/data/stats/global_stds.npy"
    assert base.optim.lr == 5e-4 and base.optim.optimizer == "Adam" and base.optim.lr_scaling == "none"
    assert (base.train.global_batch_size, base.train.num_iters, base.train.amp_mode) == (16, 30000, "none")
    assert base.loader.data_loader_config == "pytorch" and base.log.expdir == "/logs"

    short = load(tmp_path, TUTORIAL_STYLE, "short")
    assert (short.data.limit_nsamples, short.data.limit_nsamples_val) == (512, 128)
    assert short.train.num_iters == 128 and short.optim.lr == 5e-4 and short.model.embed_dim == 384

    bs32 = load(tmp_path, TUTORIAL_STYLE, "bs32_opt")
    assert bs32.train.global_batch_size == 32 and bs32.optim.lr == pytest.approx(7.07e-4)


# --------------------------------------------------------------------------------------------- shipped file


SHIPPED_NAMES = list(read_config_file(SHIPPED))


def load_shipped(name: str):
    return load_run_config(SHIPPED, name)


def test_the_optimized_configs_switch_on_the_tutorials_ladder():
    for name in OPT_CONFIGS:
        cfg = load_shipped(name)
        assert cfg.loader.pipeline == "gpu" and cfg.train.amp_mode == "fp16" and cfg.optim.enable_fused


def test_the_later_configs_exist_in_the_shipped_file():
    assert set(SHIPPED_NAMES) >= OPT_CONFIGS | {"base", "short", "demo", "tiny"}


@pytest.mark.parametrize("name", SHIPPED_NAMES)
def test_every_shipped_config_loads(name):
    cfg = load_shipped(name)
    assert cfg.name == name and cfg.workload == "era5_vit"


def test_shipped_short_is_the_tutorials_profiling_config():
    short, base = load_shipped("short"), load_shipped("base")
    assert (short.data.limit_nsamples, short.data.limit_nsamples_val) == (512, 128)
    assert short.train.num_iters == 128
    assert short.model == base.model and short.optim == base.optim


@pytest.mark.parametrize(
    ("name", "reference_lr"),
    [
        ("base", 5e-4),
        ("bs16_opt", 5e-4),
        ("bs32_opt", 7.07e-4),
        ("bs64_opt", 1e-3),
        ("bs128_opt", 1.41e-3),
        ("bs256_opt", 2e-3),
        ("bs512_opt", 2.83e-3),
        ("bs1024_opt", 4e-3),
        ("bs2048_opt", 5.66e-3),
        ("mp", 1e-3),
        ("mp_bs16", 5e-4),
        ("mp_bs32", 7.07e-4),
    ],
)
def test_shipped_peak_lrs_match_the_tutorial(name, reference_lr):
    cfg = load_shipped(name)
    lr = scaled_lr(cfg.optim.lr, cfg.optim.lr_scaling, cfg.train.global_batch_size, cfg.optim.base_batch_size)
    assert lr == pytest.approx(reference_lr, rel=5e-3)


def test_shipped_model_parallel_configs():
    assert load_shipped("mp").model.embed_dim == 1024
    patch4 = load_shipped("mp_patch4")
    assert patch4.model.patch_size == 4 and patch4.model.embed_dim == 1024


@pytest.mark.parametrize(
    ("name", "parent"), [("afno_short", "short"), ("afno_demo", "demo"), ("afno_tiny", "tiny")]
)
def test_the_afno_configs_are_their_parents_with_the_afno_mixer(name, parent):
    afno, original = load_shipped(name), load_shipped(parent)
    assert afno.model.mixer == "afno" and original.model.mixer == "attention"
    assert afno.model == dataclasses.replace(original.model, mixer="afno")
    assert afno.to_dict() | {"model": None} == original.to_dict() | {"model": None}


def test_afno_full_is_fourcastnets_quarter_degree_model():
    cfg = load_shipped("afno_full")
    model = cfg.model
    assert (model.mixer, model.embed_dim, model.depth, model.patch_size, model.mlp_ratio) == (
        "afno",
        768,
        12,
        8,
        4,
    )
    assert (model.afno_num_blocks, model.afno_sparsity_threshold, model.afno_hard_thresholding_fraction) == (
        8, 0.01, 1.0,
    )  # fmt: skip
    assert cfg.data.img_size == (720, 1440) and (cfg.data.n_in_channels, cfg.data.n_out_channels) == (20, 20)


@pytest.mark.parametrize(("name", "root"), [("demo", "data/era5_demo"), ("tiny", "data/era5_tiny")])
def test_shipped_cpu_configs_use_the_synthetic_data(monkeypatch, name, root):
    monkeypatch.setenv("DLSCALE_ERA5_DATA", "/scratch/sc23_data")
    assert load_shipped(name).data.root == root


def test_shipped_data_root_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("DLSCALE_ERA5_DATA", raising=False)
    assert load_shipped("base").data.root == "/data"
    monkeypatch.setenv("DLSCALE_ERA5_DATA", "/scratch/sc23_data")
    cfg = load_shipped("short")
    assert cfg.data.root == "/scratch/sc23_data"
    assert cfg.data.path("train_data_path") == Path("/scratch/sc23_data/train")


def test_a_list_of_words_from_the_command_line_is_read_as_a_list():
    from dlscale.config.run_config import _is_text_type

    # A str field (or str | None) takes the text verbatim; a list or tuple of str is parsed as YAML.
    assert _is_text_type(str) and _is_text_type(str | None)
    assert not _is_text_type(list[str]) and not _is_text_type(tuple[str, ...])
    cfg = load_run_config(SHIPPED, "tiny", ["log.loggers=[tensorboard]", "log.run_num=007"])
    assert cfg.log.loggers == ("tensorboard",) and cfg.log.run_num == "007"


def test_the_crps_recipes_stages_keep_one_model_and_reach_the_scored_lead():
    """The CRPS recipe's stages (docs/after-training.md) start each from the one before with its weights only, so
    they share one model and its noise inputs; the last one's rollouts reach 5 days, the lead it is scored at."""
    stages = ["crps_demo", "crps_finetune_demo", "crps_rollout_demo", "crps_long_rollout_demo"]
    resolved = [load_shipped(name) for name in stages]
    models = [cfg.to_dict()["model"] for cfg in resolved]
    assert all(model == models[0] for model in models) and models[0]["noise_channels"] > 0
    assert [cfg.train.loss for cfg in resolved] == ["crps"] * 4
    reach = [cfg.train.rollout_schedule for cfg in resolved[2:]]
    assert reach[0].endswith("=8") and reach[1].endswith("=20")  # 2 days, then 5 days of 6-hour steps
