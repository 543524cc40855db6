"""The documentation site's build code (docs/hooks/), loaded as mkdocstrings loads it: by file path, since docs/ is
not a package."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
HOOKS = REPO / "docs" / "hooks"


def load_hook(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"docs_hooks_{name}", HOOKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def rest_roles() -> ModuleType:
    """docs/hooks/rest_roles.py: the role rewriting itself (needs nothing beyond the standard library)."""
    return load_hook("rest_roles")


@pytest.fixture(scope="session")
def roles_extension() -> ModuleType:
    """docs/hooks/rest_roles_extension.py: the griffe extension (needs the docs extra: `make docs` installs it)."""
    pytest.importorskip("griffe", reason="the docs extra is not installed (make docs installs it)")
    return load_hook("rest_roles_extension")
