"""The Python API takes the YAML file and the config first and the workload by keyword, in every function that
reads a config; the old order of train, bench and load_config (workload first) still works, with a
DeprecationWarning that shows the new one."""

from __future__ import annotations

import inspect
import warnings
from pathlib import Path

import pytest

import dlscale
from dlscale import api

REPO = Path(__file__).resolve().parents[2]
YAML = REPO / "configs" / "vit_era5.yaml"


def test_every_function_that_reads_a_config_takes_the_same_first_arguments_and_workload_by_keyword():
    for function in (dlscale.train, dlscale.bench, dlscale.tune, dlscale.load_config):
        parameters = inspect.signature(function).parameters
        assert list(parameters)[:3] == ["yaml_config", "config", "overrides"], function.__name__
        assert parameters["workload"].kind in (
            parameters["workload"].KEYWORD_ONLY,
            parameters["workload"].POSITIONAL_OR_KEYWORD,
        )
        assert list(parameters).index("workload") > 2, function.__name__


def loaded(*args, **kwargs):
    """The config, and the DeprecationWarnings the call gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = dlscale.load_config(*args, **kwargs)
    return cfg, [w for w in caught if issubclass(w.category, DeprecationWarning)]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ((None, str(YAML), "tiny", ["optim.lr=1e-3"]), ((str(YAML), "tiny", ["optim.lr=1e-3"]), {})),
        (("era5_vit", YAML, "tiny"), ((YAML, "tiny"), {"workload": "era5_vit"})),
        (
            ("era5_vit", "configs/vit_era5.yaml", "tiny"),
            (("configs/vit_era5.yaml", "tiny"), {"workload": "era5_vit"}),
        ),
    ],
)
def test_the_old_order_gives_the_same_config_with_a_deprecation_warning(old, new):
    old_cfg, old_warnings = loaded(*old)
    new_args, new_kwargs = new
    new_cfg, new_warnings = loaded(*new_args, **new_kwargs)
    assert old_cfg.to_dict() == new_cfg.to_dict()
    assert new_warnings == []
    assert len(old_warnings) == 1
    message = str(old_warnings[0].message)
    assert "dlscale.load_config(yaml_config, config, ..., workload=...)" in message
    assert old_warnings[0].filename == __file__  # it points at the caller's line


def test_the_old_order_with_the_yaml_file_by_keyword_or_the_workload_alone():
    by_keyword, warned = loaded("era5_vit", yaml_config=YAML, config="tiny")
    assert warned and by_keyword.to_dict() == loaded(YAML, "tiny", workload="era5_vit")[0].to_dict()
    alone, warned = loaded("era5_vit")  # the workload alone: the default YAML's base config
    assert warned and alone.to_dict() == loaded()[0].to_dict()


def test_the_new_order_names_a_shipped_file_by_its_name_without_a_warning():
    cfg, warned = loaded("vit_era5.yaml", "tiny")
    assert warned == [] and cfg.name == "tiny"


def test_a_workload_given_twice_is_refused():
    with pytest.raises(TypeError, match="got the workload twice"):
        dlscale.load_config("era5_vit", YAML, "tiny", workload="era5_vit")


@pytest.mark.parametrize(
    ("name", "stand_in", "old", "new"),
    [
        (
            "train",
            "train_and_summarize",
            ("era5_vit", YAML, "tiny", ["optim.lr=1e-3"]),
            ((YAML, "tiny", ["optim.lr=1e-3"]), {"workload": "era5_vit"}),
        ),
        ("bench", "bench_config", (None, YAML, "tiny", [], None), ((YAML, "tiny", [], None), {})),
    ],
)
def test_train_and_bench_take_both_orders(name, stand_in, old, new, monkeypatch):
    configs = []

    class Done:
        summary = {"done": True}

    def record(cfg, *rest):
        configs.append(cfg.to_dict())
        return Done()

    monkeypatch.setattr(api, stand_in, record)
    function = getattr(dlscale, name)
    with pytest.warns(
        DeprecationWarning, match=f"dlscale.{name}\\(yaml_config, config, ..., workload=...\\)"
    ):
        function(*old, num_iters=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new order warns of nothing
        function(*new[0], num_iters=3, **new[1])
    assert len(configs) == 2 and configs[0] == configs[1]
    assert configs[0]["train"]["num_iters"] == 3
