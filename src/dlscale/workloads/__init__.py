"""Workloads: the one place where a data set, a model, a loss and metrics are paired.

Each workload is a module in this package exposing ``WORKLOAD``, an instance of a
:class:`~dlscale.workloads.protocol.Workload` subclass (the interface and its optional hooks are described
there). The trainer, checkpoints and reporting only talk to that interface, so adding a workload adds no branch
to them.

The registry below names each workload's module and its two config sections. Reading a config needs only the
sections (torch-free leaf modules), so ``dlscale config`` never imports a model or torch; the module is imported
when a run is built.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dlscale.data.cifar_config import CIFARDataConfig
from dlscale.data.cosmo_config import CosmoDataConfig
from dlscale.data.era5_config import ERA5DataConfig
from dlscale.data.mnist_config import MNISTDataConfig
from dlscale.models.cnn_config import CNNConfig
from dlscale.models.resnet_config import ResNetConfig
from dlscale.models.unet3d_config import UNetConfig
from dlscale.models.vit_config import ViTConfig

if TYPE_CHECKING:
    from dlscale.workloads.protocol import Workload

DEFAULT_WORKLOAD = "era5_vit"


@dataclass(frozen=True)
class RegisteredWorkload:
    """Where a workload lives and its config sections (a test checks they are the workload's own)."""

    module: str  # holds WORKLOAD
    data_config: type
    model_config: type


_REGISTRY = {
    "era5_vit": RegisteredWorkload("dlscale.workloads.era5_vit", ERA5DataConfig, ViTConfig),
    "unet_cosmo": RegisteredWorkload("dlscale.workloads.unet_cosmo", CosmoDataConfig, UNetConfig),
    "cnn_mnist": RegisteredWorkload("dlscale.workloads.cnn_mnist", MNISTDataConfig, CNNConfig),
    "resnet_cifar": RegisteredWorkload("dlscale.workloads.resnet_cifar", CIFARDataConfig, ResNetConfig),
}


def workload_names() -> list[str]:
    """The names a config's ``workload:`` key accepts."""
    return list(_REGISTRY)


def registered_workload(name: str) -> RegisteredWorkload:
    """The registry entry of workload ``name`` (no import of its module)."""
    if name not in _REGISTRY:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def get_workload(name: str) -> Workload:
    """The ``WORKLOAD`` object of workload ``name`` (imports its module, and with it torch)."""
    return importlib.import_module(registered_workload(name).module).WORKLOAD
