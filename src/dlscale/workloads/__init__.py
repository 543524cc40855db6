"""Workloads: the one place where a data set, a model, a loss and metrics are paired.

A workload is an object satisfying the public :class:`~dlscale.workloads.protocol.Workload` Protocol (its
docstring lists every member, what is optional and the defaults). The trainer, checkpoints and reports only
talk to that interface, so adding a workload adds no branch to them.

The four built-in workloads are found exactly as a user's are (:mod:`dlscale.workloads.references`): a name
stands for an import path ``module:OBJECT``, and the object there is imported and checked. Only their names
are listed here, rather than in dlscale's package metadata as installed workloads are, so that a checkout run
with ``PYTHONPATH=src`` (no install) knows them too. Their modules import torch inside their methods, so
reading a config (which needs only the workload's two config classes) stays instant.
"""

from __future__ import annotations

from typing import Any

from dlscale.errors import ConfigError
from dlscale.workloads.protocol import Workload
from dlscale.workloads.references import as_workload, import_path_of, installed_workloads, load_workload

DEFAULT_WORKLOAD = "era5_vit"

BUILT_IN: dict[str, str] = {
    "era5_vit": "dlscale.workloads.era5_vit:WORKLOAD",
    "unet_cosmo": "dlscale.workloads.unet_cosmo:WORKLOAD",
    "cnn_mnist": "dlscale.workloads.cnn_mnist:WORKLOAD",
    "resnet_cifar": "dlscale.workloads.resnet_cifar:WORKLOAD",
}


def workload_names() -> list[str]:
    """The names a config's ``workload:`` key accepts: the built-in ones, then those installed packages
    register (an import path ``package.module:OBJECT`` is accepted too)."""
    return [*BUILT_IN, *sorted(set(installed_workloads()) - set(BUILT_IN))]


# Workload objects handed to the Python API (dlscale.train(..., workload=my_workload)): known by name in this
# process.
_GIVEN: dict[str, Workload] = {}


def get_workload(reference: str) -> Workload:
    """The workload a config's ``workload:`` value names (imported once; ConfigError if it names none)."""
    if reference in _GIVEN:
        return _GIVEN[reference]
    return load_workload(reference, import_path_of(reference, BUILT_IN))


def use_workload(candidate: Any) -> str:
    """Make a workload object known by its name in this process (one defined in a notebook or a script, which
    no import path reaches); the name, for a config's ``workload:`` key. Checked like any other workload."""
    name = getattr(candidate, "name", None)
    if not isinstance(name, str):
        name = getattr(candidate, "__qualname__", type(candidate).__qualname__)
    if name in BUILT_IN and candidate is not get_workload(name):
        raise ConfigError(f"workload {name!r}: a built-in workload has this name; give yours another name")
    _GIVEN[name] = as_workload(candidate, name)
    return name


__all__ = ["BUILT_IN", "DEFAULT_WORKLOAD", "Workload", "get_workload", "use_workload", "workload_names"]
