"""Old module paths of the re-layering still import (src/dlscale/moved_modules.py), warn with the new path, and
give the very module at the new path; the map stays in step with the source tree."""

from __future__ import annotations

import ast
import importlib
import sys
import warnings
from pathlib import Path

import pytest

from dlscale.moved_modules import MOVED

SOURCE = Path(__file__).resolve().parents[2] / "src"


def file_of(module: str) -> Path:
    return SOURCE / (module.replace(".", "/") + ".py")


@pytest.mark.parametrize("old_name", sorted(MOVED))
def test_an_old_path_imports_the_new_module_with_a_warning_naming_it(old_name):
    sys.modules.pop(old_name, None)  # an earlier test may have imported the alias already
    with pytest.warns(DeprecationWarning, match=rf"{old_name} moved to {MOVED[old_name]}") as caught:
        old = importlib.import_module(old_name)
    assert old is importlib.import_module(MOVED[old_name])
    # the warning points at the line that imported the old name (here: importlib's caller, this test)
    assert {Path(w.filename).name for w in caught} <= {Path(__file__).name, "__init__.py"}


def test_a_from_import_of_an_old_path_gives_the_same_class():
    sys.modules.pop("dlscale.training.metric_evaluator", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from dlscale.training.metric_evaluator import MetricEvaluator as old
    from dlscale.scoring.metric_evaluator import MetricEvaluator

    assert old is MetricEvaluator


def test_the_map_matches_the_tree_and_nothing_in_dlscale_imports_an_old_path():
    for old_name, new_name in MOVED.items():
        assert file_of(new_name).is_file(), f"{new_name} is no module"
        assert not file_of(old_name).exists(), f"{old_name} exists again: drop it from MOVED"
    importers = []
    for path in (SOURCE / "dlscale").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            importers += [f"{path.name}: {name}" for name in names if name in MOVED]
    assert not importers, importers


def test_an_unknown_module_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("dlscale.training.no_such_module")
