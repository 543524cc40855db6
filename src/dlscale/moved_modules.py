"""Modules that moved in the re-layering of release 0.1 (issue "The house, round 2"), still importable by their
old names: ``from dlscale.training.metric_evaluator import MetricEvaluator`` in a user's workload keeps working,
with a DeprecationWarning that names the new path.

An import of an old name gets the new module itself (not a copy), so classes are the same objects and
``isinstance`` checks hold. ``dlscale/__init__.py`` installs the finder, so any ``import dlscale.<old name>``
finds it (Python imports the ``dlscale`` package first). Nothing inside dlscale imports an old name
(``tests/top_level/test_moved_modules.py`` checks that the map stays in step with the tree). The old
``dlscale.training.divergence`` module is now the package of the divergence guard: its names moved to
``dlscale.training.divergence.policy``, which cannot be aliased without shadowing the package.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

MOVED: dict[str, str] = {
    "dlscale.training.metrics": "dlscale.scoring.metrics",
    "dlscale.training.evaluate": "dlscale.scoring.evaluator",
    "dlscale.training.loss_evaluator": "dlscale.scoring.loss_evaluator",
    "dlscale.training.metric_evaluator": "dlscale.scoring.metric_evaluator",
    "dlscale.training.forecast_scores": "dlscale.scoring.forecast_scores",
    "dlscale.training.rollout": "dlscale.scoring.rollout",
    "dlscale.training.nonfinite": "dlscale.training.divergence.nonfinite",
    "dlscale.training.loss_spike": "dlscale.training.divergence.loss_spike",
    "dlscale.training.final_weights": "dlscale.training.divergence.final_weights",
    "dlscale.workloads.classification": "dlscale.scoring.classification",
    **{
        f"dlscale.data.{name}": f"dlscale.data.loading.{name}"
        for name in (
            "sampler",
            "loader",
            "loader_config",
            "pipeline",
            "gpu_pipeline",
            "prefetch",
            "batch_reads",
        )
    },
    **{
        f"dlscale.data.{name}": f"dlscale.data.values.{name}"
        for name in ("normalization", "finite_check", "npy_files")
    },
}


class _MovedModuleLoader(importlib.abc.Loader):
    def __init__(self, new_name: str):
        self.new_name = new_name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None  # a placeholder module; exec_module puts the moved module in its place

    def exec_module(self, module: ModuleType) -> None:
        old_name = module.__name__
        warnings.warn(
            f"{old_name} moved to {self.new_name}: import it from there (the old name will be removed)",
            DeprecationWarning,
            stacklevel=2,  # the import line: warnings skips the import machinery's frames when counting
        )
        # The import system takes whatever sys.modules holds under the name once exec_module returns.
        sys.modules[old_name] = importlib.import_module(self.new_name)


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object = None, target: object = None):
        new_name = MOVED.get(fullname)
        if new_name is None:
            return None
        return importlib.util.spec_from_loader(fullname, _MovedModuleLoader(new_name))


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (importing ``dlscale`` calls this)."""
    if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())
