"""The griffe extension of the docs site (docs/hooks/rest_roles_extension.py) points each role of a docstring at
the object it names, resolved as Sphinx would; and mkdocs.yml applies it to every docstring of dlscale."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]

# A small package with each way a docstring names an object.
PACKAGE = {
    "__init__.py": '''"""A package that hands out :func:`pkg.train` lazily."""


def __getattr__(name):
    from pkg import api

    return getattr(api, name)
''',
    "api.py": '''"""The entry points."""

from pkg.protocol import Workload


def train():
    """Trains a :class:`Workload`, scores it with :func:`evaluate` (:func:`pkg.api.evaluate`)."""


def evaluate():
    """Uses :mod:`.helpers`, :func:`.helpers.run`, :func:`.run` and :class:`~pkg.nowhere.Thing`."""
''',
    "protocol.py": '''"""What a workload provides."""


class Workload:
    """Call :meth:`fit` (:meth:`Workload.fit`) with :class:`pkg.data.Trajectories`."""

    def fit(self):
        """Fits."""
''',
    "data/__init__.py": '''"""Data."""

from pkg.data.trajectories import Trajectories
''',
    "data/trajectories.py": '''"""Trajectories."""


class Trajectories:
    """Samples in order."""
''',
    "sub/helpers.py": '''"""Helpers."""


def run():
    """Runs."""
''',
    "other.py": '''"""Another `run`, so that `.run` names two objects."""


def run():
    """Runs too."""
''',
}


def references(docstring: str) -> list[tuple[str, str]]:
    """The cross-references in a rewritten docstring, in order, as mkdocs-autorefs reads them: (identifier, the
    Markdown shown)."""
    from mkdocs_autorefs import AUTOREF_RE

    return [
        (re.search(r'identifier="([^"]*)"', tag["attrs"])[1], tag["title"])
        for tag in AUTOREF_RE.finditer(docstring)
    ]


def referenced(docstring: str) -> list[str]:
    """The identifiers of the cross-references in a rewritten docstring, in order."""
    return [identifier for identifier, _ in references(docstring)]


@pytest.fixture
def load_package(roles_extension):
    pytest.importorskip("mkdocs_autorefs", reason="the docs extra is not installed (make docs)")
    import griffe

    def loaded(**options):
        extension = roles_extension.RestRolesAsCrossReferences(**options)
        with griffe.temporary_visited_package(
            "pkg", PACKAGE, extensions=griffe.load_extensions(extension)
        ) as package:
            return {
                obj.path: obj.docstring.value
                for obj in roles_extension.package_objects(package)
                if obj.docstring
            }

    return loaded


def test_names_resolve_in_the_docstrings_scope_then_as_absolute_paths(load_package):
    docstrings = load_package()
    # imported into the module / defined beside it / written out in full
    assert referenced(docstrings["pkg.api.train"]) == [
        "pkg.protocol.Workload",
        "pkg.api.evaluate",
        "pkg.api.evaluate",
    ]
    # a method named from its class's docstring, bare and with its class
    assert referenced(docstrings["pkg.protocol.Workload"])[:2] == ["pkg.protocol.Workload.fit"] * 2


def test_a_reexport_is_followed_to_the_object_it_names(load_package):
    assert referenced(load_package()["pkg.protocol.Workload"])[2] == "pkg.data.trajectories.Trajectories"


def test_a_leading_dot_searches_the_package_by_suffix(load_package):
    # `.helpers` and `.helpers.run` name one object each; `.run` names two (pkg.sub.helpers.run and
    # pkg.other.run), so it stays as written and renders as code, as does a name the package does not hold.
    assert referenced(load_package()["pkg.api.evaluate"]) == [
        "pkg.sub.helpers",
        "pkg.sub.helpers.run",
        "run",
        "pkg.nowhere.Thing",
    ]


def test_a_lazily_exported_name_points_at_the_module_that_hands_it_out(load_package):
    assert referenced(load_package(lazy_exports={"pkg": "pkg.api"})["pkg"]) == ["pkg.api.train"]
    assert referenced(load_package()["pkg"]) == ["pkg.train"]  # without the option griffe cannot know


def test_the_site_rewrites_every_role_of_dlscale(roles_extension):
    """mkdocs.yml's extensions, loaded as mkdocstrings loads them (paths relative to mkdocs.yml), leave no reST
    role in any docstring of dlscale: a role of a kind the rewriting does not know would show on the page."""
    import griffe

    import dlscale

    site = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    (mkdocstrings,) = [plugin["mkdocstrings"] for plugin in site["plugins"] if isinstance(plugin, dict)]
    configured = mkdocstrings["handlers"]["python"]["options"]["extensions"]
    extensions = [
        {os.path.abspath(REPO / path): options for path, options in entry.items()}
        if isinstance(entry, dict)
        else os.path.abspath(REPO / entry)
        for entry in configured
    ]
    package = griffe.load(
        "dlscale", search_paths=[REPO / "src"], extensions=griffe.load_extensions(*extensions)
    )
    docstrings = {
        obj.path: obj.docstring.value for obj in roles_extension.package_objects(package) if obj.docstring
    }
    left = {
        path: re.findall(r"(?<![\w:]):[a-z]+(?::[a-z]+)?:`[^`]+`", text) for path, text in docstrings.items()
    }
    assert {path: roles for path, roles in left.items() if roles} == {}
    shown = [reference for text in docstrings.values() for reference in references(text)]
    assert len(shown) > 100  # dlscale's docstrings cross-reference a lot: the rewriting ran
    # `dlscale.load_model` and its siblings, which dlscale/__init__.py hands out from dlscale.api
    handed_out = {
        f"`dlscale.{name}`": f"dlscale.api.{name}" for name in dlscale.__all__ if name != "__version__"
    }
    lazily = [(title, identifier) for identifier, title in shown if title in handed_out]
    assert lazily, "no docstring names dlscale.load_model & co. any more: the check below checks nothing"
    assert {title: identifier for title, identifier in lazily} == {
        title: handed_out[title] for title, _ in lazily
    }
