"""The command line: the flag table, the parsers built from it, dispatch, and a parser that imports no torch."""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dlscale.cli import build_parser, main
from dlscale.commands.flags import CONFIG_FLAGS, TRAINING_FLAG_GROUPS, ConfigFlag, config_flag_values

SOURCE = Path(__file__).resolve().parents[2] / "src" / "dlscale"

# The commands whose parsers take the table's flags, and the groups of the table each one takes.
FLAG_GROUPS_OF_COMMAND = {
    "train": TRAINING_FLAG_GROUPS,
    "config": TRAINING_FLAG_GROUPS,
    "bench": tuple(dict.fromkeys(flag.group for flag in CONFIG_FLAGS)),  # every group
}


def flags_of(command: str) -> list[ConfigFlag]:
    return [flag for flag in CONFIG_FLAGS if flag.group in FLAG_GROUPS_OF_COMMAND[command]]


def sample(flag: ConfigFlag, switch_on: bool) -> tuple[list[str], object]:
    """Command-line words for ``flag`` and the value its config key should get: zeros and offs on purpose,
    since a flag that sets a key to 0 or False must not be mistaken for one left out."""
    if flag.switch:
        return ([f"--{flag.name}"] if switch_on else [f"--no-{flag.name}"]), switch_on
    if flag.choices:
        return [f"--{flag.name}", flag.choices[-1]], flag.choices[-1]
    if flag.value_type is int:
        return [f"--{flag.name}", "0"], 0
    if flag.value_type is float:
        return [f"--{flag.name}", "0.5"], 0.5
    return [f"--{flag.name}", "some-text"], "some-text"


# --------------------------------------------------------------------------------------- parser and torch


def test_building_the_parser_and_help_import_no_torch_nor_a_command_body():
    # A fresh interpreter: this one has long imported torch. PYTHONPATH and the rest are inherited.
    script = """
import contextlib, io, json, sys
from dlscale.cli import build_parser, main
build_parser()
outputs = {}
for argv in (["--help"], ["--version"], ["train", "--help"], ["bench", "--help"], ["evaluate", "--help"]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main(argv)
    outputs[" ".join(argv)] = out.getvalue()
heavy = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.") or m == "matplotlib"
               or (m.startswith("dlscale.commands.") and m not in ("dlscale.commands.flags", "dlscale.commands.options")))
print(json.dumps({"heavy": heavy, "outputs": outputs}))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["heavy"] == []
    for command in ("train", "data", "config", "bench", "scaling", "monitor", "plan", "evaluate", "info"):
        assert command in report["outputs"]["--help"]
    assert report["outputs"]["--version"].startswith("dlscale ")
    assert "--num_data_workers" in report["outputs"]["train --help"]
    assert "--nbatches" in report["outputs"]["bench --help"]
    assert "RUN_DIR|CHECKPOINT" in report["outputs"]["evaluate --help"]


def test_only_the_entry_points_import_the_cli_module():
    importers = []
    for path in SOURCE.rglob("*.py"):
        if path.name in ("cli.py", "__main__.py") and path.parent == SOURCE:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            imported_from_package = isinstance(node, ast.ImportFrom) and node.module == "dlscale"
            if any(name == "dlscale.cli" for name in names) or (
                imported_from_package and any(alias.name == "cli" for alias in node.names)
            ):
                importers.append(str(path.relative_to(SOURCE)))
    assert importers == []


# --------------------------------------------------------------------------------------------- the flags


def test_the_table_has_one_entry_per_flag_and_per_config_key():
    names = [flag.name for flag in CONFIG_FLAGS]
    keys = [flag.config_key for flag in CONFIG_FLAGS]
    assert len(set(names)) == len(names) and len(set(keys)) == len(keys)


@pytest.mark.parametrize("command", sorted(FLAG_GROUPS_OF_COMMAND))
@pytest.mark.parametrize("switch_on", [True, False], ids=["switches-on", "switches-off"])
def test_every_flag_of_a_command_sets_its_config_key(command, switch_on):
    words: list[str] = []
    expected: dict[str, object] = {}
    for flag in flags_of(command):
        flag_words, value = sample(flag, switch_on)
        words += flag_words
        expected[flag.config_key] = value
    args = build_parser().parse_args([command, *words])
    values = config_flag_values(args)
    assert values == expected
    for value, wanted in zip(values.values(), expected.values(), strict=True):
        assert type(value) is type(wanted)  # 0 stays an int, not False; 0.5 a float; off the text "off"


@pytest.mark.parametrize("command", sorted(FLAG_GROUPS_OF_COMMAND))
def test_flags_left_out_set_nothing_and_help_names_every_key(command):
    assert config_flag_values(build_parser().parse_args([command])) == {}
    subparsers = next(
        action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction)
    )
    help_text = subparsers.choices[command].format_help()
    for flag in flags_of(command):
        assert f"--{flag.name}" in help_text and f"({flag.config_key})" in help_text


def test_the_tutorial_spelling_keeps_zeros_offs_and_the_tf32_text(tiny_config):
    args = build_parser().parse_args(["train", "--num_data_workers", "0", "--no-enable_jit", "--tf32", "off"])
    values = config_flag_values(args)
    # --tf32 reaches the config as the text "off", which the config reads as a bool like a YAML value.
    assert values == {"loader.num_data_workers": 0, "train.enable_jit": False, "train.tf32": "off"}
    cfg = tiny_config("loader.num_data_workers=2", "train.enable_jit=true", "train.tf32=true", **values)
    assert cfg.loader.num_data_workers == 0 and cfg.train.enable_jit is False and cfg.train.tf32 is False
    assert cfg.overrides[-3:] == ("loader.num_data_workers=0", "train.enable_jit=False", "train.tf32=off")


@pytest.mark.parametrize("command", ["train", "config"])
def test_the_bench_trial_flags_belong_to_bench_only(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args([command, "--nbatches", "3"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments: --nbatches" in capsys.readouterr().err


def test_every_flag_sets_a_real_config_key():
    from dlscale.config.run_config import section_classes
    from dlscale.config.typed import field_types
    from dlscale.workloads import workload_names

    for workload in workload_names():
        sections = section_classes(workload)
        for flag in CONFIG_FLAGS:
            section, _, key = flag.config_key.partition(".")
            assert section in sections, (workload, flag)
            types_of_section = field_types(sections[section])
            assert key in types_of_section, (workload, flag)
            if flag.switch:  # --x / --no-x can only give a bool
                assert types_of_section[key] is bool, (workload, flag)


# -------------------------------------------------------------------------------------------- info


def test_info_names_the_cpu_once(capsys):
    import torch

    assert main(["info"]) == 0  # the suite sets DLSCALE_DEVICE=cpu
    device_lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("device:")]
    threads = torch.get_num_threads()
    assert device_lines == [f"device: cpu ({threads} thread{'s' if threads != 1 else ''})"]


def test_info_names_a_gpu_by_its_torch_device_and_model():
    from types import SimpleNamespace

    from dlscale.commands.info import device_description

    gpu = SimpleNamespace(torch="cuda:1", is_gpu=True, name="NVIDIA H100 80GB HBM3")
    assert device_description(gpu) == "cuda:1 (NVIDIA H100 80GB HBM3)"


# -------------------------------------------------------------------------------------------- dispatch


@pytest.mark.parametrize(
    ("argv", "module", "function"),
    [
        (["train"], "dlscale.commands.train", "run_train"),
        (["config"], "dlscale.commands.info", "run_config"),
        (["info"], "dlscale.commands.info", "run_info"),
        (["bench"], "dlscale.commands.bench", "run_bench_command"),
        (["scaling", "results"], "dlscale.commands.scaling", "run_scaling_command"),
        (["monitor", "--once"], "dlscale.commands.monitor", "run_monitor_command"),
        (["plan", "--gpus", "2"], "dlscale.commands.plan", "run_plan_command"),
        (["data", "synth-era5", "--out", "somewhere"], "dlscale.commands.data", "run_data"),
        (["data", "synth-mnist", "--out", "somewhere"], "dlscale.commands.data", "run_data"),
    ],
)
def test_each_command_runs_its_function(argv, module, function, monkeypatch):
    called: list[argparse.Namespace] = []

    def stand_in(args: argparse.Namespace) -> int:
        called.append(args)
        return 42

    monkeypatch.setattr(f"{module}.{function}", stand_in)
    assert main(argv) == 42
    assert len(called) == 1 and called[0].command == argv[0]
