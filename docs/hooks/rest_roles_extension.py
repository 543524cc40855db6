"""A griffe extension (mkdocs.yml, mkdocstrings' `extensions:` option) that rewrites the reST cross-reference
roles of every docstring of a package as the package is loaded, before mkdocstrings renders any of them.

A role's name is resolved as Sphinx would, to the full dotted path that identifies the object's heading on the
site: in the scope of the object whose docstring holds it (`Trainer` in a docstring of its module, a name the
module imports), then as an absolute path; a leading dot (`.final_weights`) searches the package for the one
object whose path ends so; a re-export is followed to the object it names. `lazy_exports` maps a package whose
`__getattr__` hands out the names of another module (invisible to griffe: `dlscale.train` is
`dlscale.api.train`) to that module. What the roles become is rest_roles.py's business.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from griffe import (
    AliasResolutionError,
    CyclicAliasError,
    Extension,
    GriffeLoader,
    Module,
    ModulesCollection,
    NameResolutionError,
    Object,
)


def _load_sibling(name: str) -> Any:
    # griffe loads this file by its path, outside any package, so the module beside it is loaded the same way.
    spec = importlib.util.spec_from_file_location(
        f"dlscale_docs_{name}", Path(__file__).with_name(f"{name}.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rest_roles = _load_sibling("rest_roles")

# More alias hops than any real chain of re-exports; a longer one is a cycle griffe did not catch.
MAX_ALIAS_HOPS = 20


def package_objects(obj: Object) -> Iterator[Object]:
    """`obj` and every object defined in it, recursively (re-exports, which griffe holds as aliases, are
    skipped: their docstrings are those of the objects they name)."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from package_objects(member)


def is_known(path: str, collection: ModulesCollection) -> bool:
    """Whether griffe holds an object (or a re-export) at `path`."""
    try:
        collection.get_member(path)
    except (KeyError, AliasResolutionError, CyclicAliasError):
        return False
    return True


def canonical_path(path: str, collection: ModulesCollection) -> str:
    """The path of the object that `path` names once re-exports are followed; `path` itself if griffe does not
    know it."""
    for _ in range(MAX_ALIAS_HOPS):
        try:
            obj = collection.get_member(path)
        except (KeyError, AliasResolutionError, CyclicAliasError):
            return path
        if not obj.is_alias:
            return obj.path
        path = obj.target_path
    return path


class RestRolesAsCrossReferences(Extension):
    """Rewrites `:class:`, `:func:`, `:meth:`, `:mod:`, `:attr:`, ... roles into optional cross-references."""

    def __init__(self, lazy_exports: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.lazy_exports = dict(lazy_exports or {})

    def on_package(self, *, pkg: Module, loader: GriffeLoader, **kwargs: Any) -> None:
        objects = list(package_objects(pkg))
        paths = [obj.path for obj in objects]
        for obj in objects:
            if obj.docstring is not None:
                obj.docstring.value = rest_roles.rewrite_roles(
                    obj.docstring.value, self.resolver(obj, loader.modules_collection, paths)
                )

    def resolver(
        self, owner: Object, collection: ModulesCollection, paths: list[str]
    ) -> Callable[[str], str]:
        """The function that turns a role's name in `owner`'s docstring into an object's full path."""

        def resolve(name: str) -> str:
            dotted = name.lstrip(".")
            first, _, rest = dotted.partition(".")
            try:
                scoped = owner.resolve(first)
                path = f"{scoped}.{rest}" if rest else scoped
            except NameResolutionError:
                path = self.unique_suffix_match(dotted, paths) if name.startswith(".") else dotted
            return canonical_path(self.through_lazy_export(path, collection), collection)

        return resolve

    @staticmethod
    def unique_suffix_match(dotted: str, paths: list[str]) -> str:
        """The one path that is `dotted` or ends with `.dotted`; `dotted` itself when none or several do."""
        matches = [path for path in paths if path == dotted or path.endswith(f".{dotted}")]
        return matches[0] if len(matches) == 1 else dotted

    def through_lazy_export(self, path: str, collection: ModulesCollection) -> str:
        """`path`, or, when griffe knows no such object but a lazily exporting package hands its name out, the
        path of the object handed out."""
        package, _, name = path.rpartition(".")
        if package in self.lazy_exports and not is_known(path, collection):
            exported = f"{self.lazy_exports[package]}.{name}"
            if is_known(exported, collection):
                return exported
        return path
