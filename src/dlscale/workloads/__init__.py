"""Workloads: the one place where a data set, a model, a loss and metrics are paired.

Each workload is a module in this package exposing ``WORKLOAD``, an object with:

* ``data_config`` / ``model_config``: the dataclasses of its ``data:`` and ``model:`` config sections;
* ``build_datasets(data_cfg)`` -> ``{"train": Dataset, "valid": Dataset}``;
* ``build_model(model_cfg, data_cfg)`` -> ``torch.nn.Module`` (plain torch, no parallelism);
* ``loss(prediction, target)`` -> scalar tensor;
* optionally ``forward_flops_per_sample(model_cfg, data_cfg)`` -> analytic forward FLOPs of one sample (without
  it, TFLOP/s and MFU come from counting one forward + backward with ``torch.utils.flop_counter``);
* optionally ``configured(model_cfg, data_cfg)`` -> a copy bound to a run's config, for a loss or metrics with
  parameters (the run then uses that copy; ``loss`` and ``evaluator`` themselves only receive tensors and data);
* optionally ``parallelize(model, mesh)`` -> this rank's tensor/context-parallel part of the model (see
  :mod:`dlscale.parallel`); without it the workload trains data-parallel only;
* ``evaluator(valid_dataset)`` -> an object with ``reset()``, ``update(inputs, targets, predictions)``,
  ``summary()`` (see :mod:`dlscale.train.evaluate`).

The trainer, checkpoints and reporting only talk to that interface, so adding a workload adds no branch to them.
"""

from __future__ import annotations

import importlib
from typing import Any

DEFAULT_WORKLOAD = "era5_vit"

# name -> module holding its WORKLOAD (imported on first use, so reading a config stays cheap)
_REGISTRY = {
    "era5_vit": "dlscale.workloads.era5_vit",
    "unet_cosmo": "dlscale.workloads.unet_cosmo",
    "cnn_mnist": "dlscale.workloads.cnn_mnist",
    "resnet_cifar": "dlscale.workloads.resnet_cifar",
}


def workload_names() -> list[str]:
    """The names a config's ``workload:`` key accepts."""
    return list(_REGISTRY)


def get_workload(name: str) -> Any:
    """The ``WORKLOAD`` object of workload ``name``."""
    if name not in _REGISTRY:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(_REGISTRY)}")
    return importlib.import_module(_REGISTRY[name]).WORKLOAD
