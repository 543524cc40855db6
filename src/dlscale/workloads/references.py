"""Find the workload a config's ``workload:`` key names, and check that it is one.

A reference is one of

* a built-in name (``era5_vit``): :data:`dlscale.workloads.BUILT_IN` maps it to an import path; an entry point
  of an installed package with the same name is ignored, with a warning, so that no package can silently
  replace one of dlscale's own workloads;
* a name an installed package registers in its ``pyproject.toml``::

      [project.entry-points."dlscale.workloads"]
      heat2d = "heat2d.workload:WORKLOAD"

* an import path ``package.module:OBJECT`` (``OBJECT`` may be dotted: ``module:Class.ATTRIBUTE``), for a
  workload that is importable but not installed as a package (``PYTHONPATH``, a notebook's directory).

All three end in the same import path, and the object found there goes through the same check (the built-in
workloads have no shortcut): it must have the required members of :class:`~dlscale.workloads.protocol.Workload`
with the right kinds, and an object that does not subclass ``Workload`` gets the optional members' defaults
(:func:`as_workload`).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import logging
import re
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

from dlscale.errors import ConfigError, DlscaleError, did_you_mean
from dlscale.workloads.protocol import Workload
from dlscale.workloads.user_code import error_from_user_code, files_of_module

ENTRY_POINT_GROUP = "dlscale.workloads"

log = logging.getLogger("dlscale.workloads")

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")

# The members every workload must have, and what each should be (for the error that names a missing one).
REQUIRED_MEMBERS: dict[str, str] = {
    "data_config": "a dataclass (the class) whose fields are the keys of the config's data: section",
    "model_config": "a dataclass (the class) whose fields are the keys of the config's model: section",
    "build_datasets": "a method build_datasets(data_cfg) returning {'train': Dataset, 'valid': Dataset}",
    "build_model": "a method build_model(model_cfg, data_cfg) returning a torch.nn.Module",
    "loss": "a method loss(prediction, target) returning the batch's scalar loss tensor",
}
OPTIONAL_MEMBERS = (
    "name",
    "evaluator",
    "build_split",
    "describe_model",
    "configured",
    "parallelize",
    "fsdp_units",
    "forward_flops_per_sample",
    "normalization_stats",
    "training_loss",
    "forecast_data",
)


def installed_workloads() -> dict[str, str]:
    """Name -> import path of the workloads installed packages register under the ``dlscale.workloads`` group."""
    return {entry.name: entry.value for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def import_path_of(reference: str, built_in: Mapping[str, str]) -> str:
    """The ``module:OBJECT`` path that ``reference`` stands for; ConfigError when it stands for none."""
    if reference in built_in:
        _warn_of_ignored_entry_points(reference)
        return built_in[reference]
    if ":" in reference:
        if not _IMPORT_PATH.match(reference):
            raise ConfigError(
                f"workload {reference!r} is not an import path of the form package.module:OBJECT"
            )
        return reference
    installed = installed_workloads()
    if reference in installed:
        return installed[reference]
    known = [*built_in, *sorted(installed)]
    raise ConfigError(
        f"unknown workload {reference!r}{did_you_mean(reference, known)}; known: {', '.join(known)}; or an "
        "import path package.module:OBJECT, or a name an installed package registers under the entry-point "
        f"group {ENTRY_POINT_GROUP!r}"
    )


# Entry points already warned about (name, value, package): a config is read several times in one run.
_IGNORED_ENTRY_POINTS: set[tuple[str, str, str]] = set()


def _package_of(entry: importlib.metadata.EntryPoint) -> str:
    """The name of the installed distribution that declares ``entry`` ("unknown" where metadata lacks it)."""
    dist = getattr(entry, "dist", None)
    return dist.name if dist is not None else "unknown"


def _entry_point_behind(reference: str, import_path: str) -> importlib.metadata.EntryPoint | None:
    """The installed entry point through which ``reference`` was found to be ``import_path``; None for an
    import path written in the config, or a built-in name."""
    if reference == import_path:
        return None
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=reference):
        if entry.value == import_path:
            return entry
    return None


def _declared_by(entry: importlib.metadata.EntryPoint) -> str:
    """How an error names the entry point a workload came from, and who declared it."""
    return (
        f"the entry point '{entry.name} = {entry.value}' (group {ENTRY_POINT_GROUP!r}) of the installed "
        f"package {_package_of(entry)!r}"
    )


def _warn_of_ignored_entry_points(built_in_name: str) -> None:
    """Warn (once per process) of each installed entry point named like a built-in workload: the built-in wins."""
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=built_in_name):
        package = _package_of(entry)
        if (entry.name, entry.value, package) in _IGNORED_ENTRY_POINTS:
            continue
        _IGNORED_ENTRY_POINTS.add((entry.name, entry.value, package))
        log.warning(
            "workload %r is dlscale's built-in one: the entry point '%s = %s' (group %r) of the installed "
            "package %r is ignored; rename it in that package's entry points to use it",
            built_in_name,
            entry.name,
            entry.value,
            ENTRY_POINT_GROUP,
            package,
        )


@cache
def load_workload(reference: str, import_path: str) -> Workload:
    """The checked workload at ``import_path`` (found by ``reference``); imported once per process."""
    module_name, _, attribute = import_path.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            missing = (
                f"workload {reference!r}: cannot import module {module_name!r} (no module named {exc.name!r})"
            )
            entry = _entry_point_behind(reference, import_path)
            if entry is not None:  # installed, yet without the module its metadata names: a stale install
                raise ConfigError(
                    f"{missing}; {_declared_by(entry)} names it: reinstall that package, or fix the entry "
                    "point in its pyproject.toml"
                ) from None
            raise ConfigError(
                f"{missing}; install the package that holds it, or put its directory on PYTHONPATH"
            ) from None
        raise ConfigError(
            f"workload {reference!r}: module {module_name!r} imports {exc.name!r}, which is not installed; "
            "install it where dlscale runs"
        ) from None
    except DlscaleError:
        raise
    except Exception as exc:
        # The module's own code failed: one line naming its file:line, when the rule says it is the user's.
        importing = f"importing module {module_name!r}"
        error = error_from_user_code(exc, reference, importing, files_of_module(module_name))
        if error is None:
            raise
        raise error from exc
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise _missing_attribute(reference, import_path, target, part)
        target = getattr(target, part)
    return as_workload(target, reference)


def _missing_attribute(reference: str, import_path: str, holder: Any, part: str) -> ConfigError:
    """The error for an import path whose ``part`` is not an attribute of ``holder`` (the module, or the
    object before it), with the closest of ``holder``'s public names and, for an entry point, the package to
    fix."""
    public = [name for name in dir(holder) if not name.startswith("_")]
    message = f"workload {reference!r}: {import_path} has no attribute {part!r}{did_you_mean(part, public)}"
    entry = _entry_point_behind(reference, import_path)
    if entry is not None:
        message += (
            f"; {_declared_by(entry)} names it: fix the entry point in that package's pyproject.toml and "
            "reinstall it"
        )
    return ConfigError(message)


def as_workload(candidate: Any, reference: str) -> Workload:
    """``candidate`` checked as a workload: an instance, or a class instantiated without arguments.

    ConfigError names the first missing or wrong member, the object and what the member should be. An object
    that does not subclass :class:`Workload` is wrapped, so that its optional members have their defaults.
    """
    if isinstance(candidate, type):
        try:
            candidate = candidate()
        except TypeError as exc:
            raise ConfigError(
                f"workload {reference!r}: the class {candidate.__qualname__} cannot be instantiated without "
                f"arguments ({exc}); point the reference at an instance instead"
            ) from None
    for member, expected in REQUIRED_MEMBERS.items():
        problem = _member_problem(candidate, member)
        if problem:
            raise ConfigError(
                f"workload {reference!r} ({_describe(candidate)}) {problem} {member}: it should be {expected} "
                "(see dlscale.workloads.protocol.Workload)"
            )
    if isinstance(candidate, Workload) and type(candidate) is not _WithDefaults:
        workload = candidate
    else:
        workload = _WithDefaults(candidate)
    if not isinstance(getattr(workload, "name", None), str):
        workload.name = reference
    return workload


def _member_problem(candidate: Any, member: str) -> str:
    """Why ``candidate.member`` is not what a workload needs ("" when it is)."""
    value = getattr(candidate, member, None)
    inherited = isinstance(candidate, Workload) and getattr(type(candidate), member, None) is getattr(
        Workload, member, None
    )
    if value is None or inherited:
        return "has no"
    if member.endswith("_config"):
        if not (isinstance(value, type) and dataclasses.is_dataclass(value)):
            return f"has {value!r} (not a dataclass) as"
        return ""
    if not callable(value):
        return f"has {value!r} (not callable) as"
    return ""


def _describe(candidate: Any) -> str:
    kind = type(candidate)
    return f"a {kind.__module__}.{kind.__qualname__}"


class _WithDefaults(Workload):
    """A workload object that does not subclass :class:`Workload`: its own members, the defaults for the rest."""

    def __init__(self, inner: Any):
        self.inner = inner
        for member in (*REQUIRED_MEMBERS, *OPTIONAL_MEMBERS):
            value: Callable[..., Any] | Any = getattr(inner, member, None)
            if value is not None and member != "configured":
                setattr(self, member, value)  # an instance attribute hides the class's default

    def configured(self, model_cfg: Any, data_cfg: Any) -> Workload:
        """The inner object's bound copy, wrapped in turn (it need not subclass Workload either)."""
        bind = getattr(self.inner, "configured", None)
        return self if bind is None else as_workload(bind(model_cfg, data_cfg), self.name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"
