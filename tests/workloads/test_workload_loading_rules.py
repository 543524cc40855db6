"""How a user's workload is found and checked where the simple cases do not reach: a ``Workload`` subclass that
leaves a required member to the Protocol's empty stub is refused like any object without it, and an installed
entry point cannot take over a built-in workload's name."""

from __future__ import annotations

import logging
import sys
import textwrap
from pathlib import Path

import pytest

import dlscale.workloads
from dlscale.config import load_run_config
from dlscale.errors import ConfigError
from dlscale.models.vit_config import ViTConfig
from dlscale.workloads import BUILT_IN, get_workload, workload_names
from dlscale.workloads.references import REQUIRED_MEMBERS, import_path_of

CONFIG_FILE = Path(__file__).resolve().parents[2] / "configs" / "vit_era5.yaml"

# Each required member as a Workload subclass defines it; a class leaves out one of them.
MEMBER_DEFINITIONS = {
    "data_config": "data_config = SubData",
    "model_config": "model_config = SubModel",
    "build_datasets": "def build_datasets(self, data_cfg):\n    return {}",
    "build_model": "def build_model(self, model_cfg, data_cfg):\n    return torch.nn.Linear(1, 1)",
    "loss": "def loss(self, prediction, target):\n    return ((prediction - target) ** 2).mean()",
}


def subclass_module() -> str:
    """Source of a module with a complete ``Workload`` subclass ``Complete`` and, for each required member
    ``m``, a subclass ``Without_m`` that inherits the Protocol's stub of ``m`` instead of defining it."""
    header = """
        from dataclasses import dataclass

        import torch

        from dlscale.workloads.protocol import Workload


        @dataclass
        class SubData:
            sub_samples: int = 4


        @dataclass
        class SubModel:
            sub_width: int = 1
    """
    classes = []
    for class_name, left_out in [("Complete", None), *((f"Without_{m}", m) for m in MEMBER_DEFINITIONS)]:
        body = [code for member, code in MEMBER_DEFINITIONS.items() if member != left_out]
        classes.append(f"class {class_name}(Workload):\n" + textwrap.indent("\n\n".join(body), "    "))
    return textwrap.dedent(header) + "\n\n" + "\n\n\n".join(classes) + "\n"


# A config of the subclasses' own sections: a wrongly accepted workload would load without any error.
SUBCLASS_CONFIG = """
base:
  data: {sub_samples: 8}
  model: {sub_width: 2}
"""


@pytest.fixture
def subclasses(tmp_path, monkeypatch, request) -> tuple[str, Path]:
    """The name of an importable module of Workload subclasses (a fresh name per test: workloads are imported
    once per process) and a config file for them."""
    module = f"workload_subclasses_{request.node.name.replace('[', '_').replace(']', '').replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(subclass_module())
    (tmp_path / "subclass.yaml").write_text(SUBCLASS_CONFIG)
    monkeypatch.syspath_prepend(str(tmp_path))
    return module, tmp_path / "subclass.yaml"


def test_a_complete_workload_subclass_is_taken_as_it_is(subclasses):
    module, config_file = subclasses
    cfg = load_run_config(config_file, "base", workload=f"{module}:Complete")
    assert (cfg.data.sub_samples, cfg.model.sub_width) == (8, 2)
    workload = get_workload(f"{module}:Complete")
    assert type(workload).__module__ == module and type(workload).__name__ == "Complete"


@pytest.mark.parametrize("member", list(REQUIRED_MEMBERS))
def test_a_workload_subclass_without_a_required_member_is_refused_naming_both(subclasses, member):
    module, config_file = subclasses
    with pytest.raises(ConfigError) as error:  # as a config's `workload:` key names it
        load_run_config(config_file, "base", workload=f"{module}:Without_{member}")
    message = str(error.value)
    assert f"{module}.Without_{member}" in message  # the class at fault
    assert f"has no {member}:" in message and REQUIRED_MEMBERS[member] in message


# ---------------------------------------------------------------------- an entry point with a built-in's name


class WarningRecords(logging.Handler):
    """The warnings of dlscale's workload lookup, whatever the ``dlscale`` logger's propagation (a run's
    logging set-up turns it off)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def workload_warnings():
    handler, logger = WarningRecords(), logging.getLogger("dlscale.workloads")
    logger.addHandler(handler)
    yield handler.messages
    logger.removeHandler(handler)


@pytest.fixture
def impostor(tmp_path, monkeypatch, request) -> tuple[str, str]:
    """An installed package (a dist-info directory on sys.path, as pip writes it) whose entry point is named
    ``era5_vit``; its (distribution, module) names, fresh per test."""
    module = f"impostor_{request.node.name}"
    distribution = module.replace("_", "-")
    (tmp_path / f"{module}.py").write_text(
        "raise ImportError('the impostor workload must not be imported')\n"
    )
    dist_info = tmp_path / f"{module}-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text(f"[dlscale.workloads]\nera5_vit = {module}:WORKLOAD\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    # Forget workload objects an earlier test handed to the Python API by name (era5_vit among them): they are
    # found before any lookup, and this test is about the lookup.
    monkeypatch.setattr(dlscale.workloads, "_GIVEN", {})
    return distribution, module


def test_a_built_in_workload_wins_over_an_installed_entry_point_of_its_name(impostor):
    _, module = impostor
    assert import_path_of("era5_vit", BUILT_IN) == BUILT_IN["era5_vit"]
    workload = get_workload("era5_vit")
    assert type(workload).__module__ == "dlscale.workloads.era5_vit"
    cfg = load_run_config(CONFIG_FILE, "tiny")  # the built-in's own sections, not the impostor's
    assert cfg.workload == "era5_vit" and isinstance(cfg.model, ViTConfig)
    assert module not in sys.modules
    assert workload_names().count("era5_vit") == 1


def test_the_ignored_entry_point_is_named_in_one_warning(impostor, workload_warnings):
    distribution, module = impostor
    get_workload("era5_vit")
    load_run_config(CONFIG_FILE, "tiny")  # the name is looked up again: still one warning
    assert len(workload_warnings) == 1
    (message,) = workload_warnings
    assert "'era5_vit'" in message and "built-in" in message and "ignored" in message
    assert f"era5_vit = {module}:WORKLOAD" in message and repr(distribution) in message
