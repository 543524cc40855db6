"""dlscale: train scientific deep-learning models at scale, from one CPU to many GPU nodes, and make them fast.

The Python API (:mod:`dlscale.api`): ``dlscale.train(...)``, ``dlscale.bench(...)``, ``dlscale.tune(...)``, ``dlscale.evaluate(...)``, ``dlscale.forecast(...)``, ``dlscale.score(...)``, ``dlscale.load_config(...)``,
``dlscale.export(...)``, ``dlscale.load_model(...)``.
They are imported on first use, so ``import dlscale`` (and ``dlscale --version``) stays instant.
"""

from typing import Any

from dlscale.version import __version__

__all__ = [
    "__version__",
    "bench",
    "evaluate",
    "export",
    "forecast",
    "load_config",
    "load_model",
    "score",
    "train",
    "tune",
]
_API = ("bench", "evaluate", "export", "forecast", "load_config", "load_model", "score", "train", "tune")


def __getattr__(name: str) -> Any:
    if name in _API:
        from dlscale import api  # the whole run machinery and torch: only when a script asks for it

        return getattr(api, name)
    raise AttributeError(f"module 'dlscale' has no attribute {name!r}")
