"""The ``Workload`` interface: what the run assembly, the trainer and the reports may ask of a workload.

A workload pairs a data set, a model, a loss and validation metrics. The required members have no default; the
optional hooks have one here, so a workload that subclasses :class:`Workload` only writes what it changes and
nothing else in dlscale needs to ask ``hasattr``:

* ``configured(model_cfg, data_cfg)``: a copy bound to a run's config (a loss or metrics with parameters); the
  default is the workload itself.
* ``parallelize(model, mesh)``: this rank's tensor/context-parallel part of the model; the default refuses a
  mesh with tp or cp > 1, so such a workload trains data-parallel only.
* ``fsdp_units(model)``: the submodules FSDP2 shards one by one (a transformer's blocks); the default is none,
  so the whole model is one unit.
* ``forward_flops_per_sample(model_cfg, data_cfg)``: analytic forward FLOPs of one sample, for TFLOP/s and MFU;
  the default (None) has them counted with ``torch.utils.flop_counter``.

This module imports no torch at run time, so reading a config (which only needs the config classes) stays fast.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from dlscale.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from torch.utils.data import Dataset

    from dlscale.parallel.mesh import ParallelMesh
    from dlscale.train.evaluate import Evaluator


@runtime_checkable
class Workload(Protocol):
    """A data set + model + loss + metrics (see the module docstring for the optional hooks' defaults)."""

    name: ClassVar[str]
    data_config: ClassVar[type]  # the dataclass of the ``data:`` config section
    model_config: ClassVar[type]  # the dataclass of the ``model:`` config section

    def build_datasets(self, data_cfg: Any) -> Mapping[str, Dataset]:
        """``{"train": ..., "valid": ...}``: map-style data sets of (input, target) pairs."""
        ...

    def build_model(self, model_cfg: Any, data_cfg: Any) -> torch.nn.Module:
        """The plain torch model (no parallelism: that is applied from outside)."""
        ...

    def loss(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The scalar training loss of a batch."""
        ...

    def evaluator(self, valid_dataset: Dataset, image_channel: str | None = None) -> Evaluator:
        """The validation metrics (``image_channel``: ``log.image_channel``, for gridded outputs)."""
        ...

    def describe_model(self, model: torch.nn.Module) -> str:
        """One line about the model for the start of the run's log."""
        ...

    # ------------------------------------------------------------------------------ optional, with defaults

    def configured(self, model_cfg: Any, data_cfg: Any) -> Workload:
        """This workload bound to a run's config sections (the default needs none)."""
        return self

    def parallelize(self, model: torch.nn.Module, mesh: ParallelMesh) -> torch.nn.Module:
        """This rank's part of ``model`` on ``mesh``; the model itself when tp = cp = 1."""
        if mesh.is_model_parallel:
            raise ConfigError(
                f"workload {self.name!r} has no tensor/context-parallel form; set parallel.tensor_parallel "
                "and parallel.context_parallel to 1"
            )
        return model

    def fsdp_units(self, model: torch.nn.Module) -> Sequence[torch.nn.Module]:
        """Submodules that FSDP2 shards as units of their own before the whole model (default: none)."""
        return ()

    def forward_flops_per_sample(self, model_cfg: Any, data_cfg: Any) -> int | None:
        """Analytic forward FLOPs of one sample, or None to count them (the default)."""
        return None
