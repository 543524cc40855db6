"""The ``Workload`` interface: everything dlscale asks of a workload, whether built in or a user's own.

A workload pairs a data set, a model, a loss and (optionally) validation metrics. dlscale finds one by the
config's ``workload:`` key (see :mod:`dlscale.workloads.references`): a built-in name, a name an installed
package registers under the entry-point group ``dlscale.workloads``, or an import path
``package.module:OBJECT``. The object is an instance (or a class, instantiated without arguments).

Required members (no default; a missing one is an error that names it):

* ``data_config``, ``model_config``: dataclasses (classes, not instances) whose fields are the keys of the YAML
  ``data:`` and ``model:`` sections, each with a default. Field types: bool, int, float, str, ``X | None``,
  ``tuple[...]``, ``list[...]``, ``Literal[...]``; ``__post_init__`` may raise
  :class:`~dlscale.errors.InvalidValue` for a wrong value. A key name should not repeat one of another
  section, so it can also be written flat (``lr: 1e-3`` for ``optim.lr``).
* ``build_datasets(data_cfg) -> {"train": Dataset, "valid": Dataset}``: map-style torch data sets of
  ``(input, target)`` pairs of tensors with the same shapes in every sample (the loader stacks them into
  ``(batch, ...)`` tensors). Generating missing data here is fine (every rank calls it: write atomically).
* ``build_model(model_cfg, data_cfg) -> torch.nn.Module``: the plain model, no parallelism (dlscale applies
  DDP/FSDP2 from outside); ``model(inputs)`` maps a ``(batch, ...)`` input batch to predictions. No
  BatchNorm where data-parallel runs must equal serial ones: per-rank batch statistics differ by design.
* ``loss(prediction, target) -> scalar tensor``: the training loss of a batch, a mean over its samples.

Optional members, and what dlscale does without them:

* ``name: str``: the workload's name in logs and checkpoints (default: the reference it was found by).
* ``evaluator(valid_dataset, image_channel) -> Evaluator``: validation metrics (the contract and every field
  of its ``EvalSummary``: :mod:`dlscale.scoring.evaluator`). Your metrics against a baseline in a few lines:
  ``MetricEvaluator(valid_dataset, self.loss, metrics, baseline)``
  (:class:`~dlscale.scoring.metric_evaluator.MetricEvaluator`: ``metrics(prediction, target)`` returns
  named errors, per sample or the batch's mean; ``baseline(inputs, targets)`` predicts as persistence,
  climatology or zeros would; means over all samples and ranks, and the skill ``1 - model / baseline``).
  Default: :class:`~dlscale.scoring.loss_evaluator.LossEvaluator`, the mean validation loss per sample and,
  for ``(batch, channels, H, W)`` outputs, the prediction-vs-target image of one channel.
* ``training_loss(model, batch, step) -> scalar tensor``: the training loss of a batch when it needs more
  than ``loss(model(inputs), targets)``: a multi-step rollout (the model applied to its own output), a
  physics penalty, several inputs packed in one tensor. ``model`` is the run's model as a function (under the
  run's autocast, data-parallel and compiled as configured; float32 predictions; call it as often as needed),
  ``batch`` the ``(inputs, targets)`` tensors on the device, ``step`` the 0-based global step (for schedules
  of the loss; a resumed run continues it). Validation, ``loss`` and the evaluator still see
  ``model(inputs)`` against the ``valid`` targets. Not with ``train.cuda_graphs``. Default: None, the
  training loss is ``loss(model(inputs), targets)`` (:mod:`dlscale.training.training_loss`).
* ``build_split(data_cfg, split) -> Dataset``: the data set of one held-out split for ``dlscale evaluate``
  (``valid``, ``test``, or any other name the workload knows). Default: that entry of ``build_datasets``, so a
  workload whose ``build_datasets`` also returns ``"test"`` offers it; a split it has not is one line naming
  what it offers (:func:`split_not_offered`).
* ``describe_model(model) -> str``: one line for the run's log (default: the class and parameter count).
* ``configured(model_cfg, data_cfg) -> Workload``: a copy bound to a run's config (a loss or metrics with
  parameters). Default: the workload itself.
* ``normalization_stats(data_cfg) -> {name: numpy array}``: what ``dlscale export`` saves beside the weights so
  that an exported model normalizes raw inputs and denormalizes its outputs without the data set
  (:func:`dlscale.load_model`): ``input_mean``, ``input_std`` (the model reads ``(x - input_mean) / input_std``)
  and ``output_mean``, ``output_std`` (its outputs in the data's units are ``y * output_std + output_mean``),
  each broadcasting against one sample, e.g. ``(channels, 1, 1)``; a missing pair is no such step. Default:
  none (the model reads the data as it is and its outputs need no conversion).
* ``forecast_data(data_cfg, split) -> Trajectories``: the held-out ``split`` as trajectories of states along
  time (:class:`dlscale.data.trajectories.Trajectories`), for ``dlscale forecast``'s autoregressive rollouts,
  where the model's output is fed back as its next input (same shape in as out). Default: the workload cannot
  roll out, and ``dlscale forecast`` says so in one line.
* ``forward_flops_per_sample(model_cfg, data_cfg) -> int | None``: analytic forward FLOPs of one sample, for
  TFLOP/s and MFU. Default None: counted once with ``torch.utils.flop_counter`` on one batch.
* ``fsdp_units(model) -> Sequence[nn.Module]``: submodules FSDP2 shards one by one (a transformer's blocks),
  so only one unit's parameters are gathered at a time. Default: none (the whole model is one unit).
* ``parallelize(model, mesh) -> nn.Module``: this rank's tensor/context-parallel part of the model, for
  ``parallel.tensor_parallel``/``context_parallel`` > 1. Default: refuses such a mesh (data parallelism
  needs no hook). A workload that adds it swaps its layers for those of :mod:`dlscale.parallel` (column- and
  row-parallel linears, sequence-sharded attention) from outside the model, as
  :mod:`dlscale.parallel.vit_parallel` does for the ViT, and checks itself against the serial model with
  :mod:`dlscale.parallel`'s comparison on forked CPU ranks.

Everything else (AMP, compile, CUDA graphs, both data pipelines, bench, profiling, monitoring, checkpoints,
exact resume, DDP/FSDP2) needs no code in the workload.

Subclassing :class:`Workload` gives the defaults by inheritance; an object that does not subclass it is
wrapped with them (:func:`dlscale.workloads.references.as_workload`). This module imports no torch at run
time, and the built-in workloads import theirs inside their methods, so reading a config stays instant.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from dlscale.errors import ConfigError, DataError

if TYPE_CHECKING:
    import torch
    from torch.utils.data import Dataset

    from dlscale.data.trajectories import Trajectories
    from dlscale.parallel.mesh import ParallelMesh
    from dlscale.scoring.evaluator import Evaluator


@runtime_checkable
class Workload(Protocol):
    """A data set + model + loss (+ metrics): see the module docstring for every member and its default."""

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

    # ------------------------------------------------------------------------------ optional, with defaults

    # training_loss(model, batch, step) -> the batch's scalar loss; None: loss(model(inputs), targets)
    training_loss: ClassVar[Callable[..., torch.Tensor] | None] = None

    def evaluator(self, valid_dataset: Dataset, image_channel: str | None = None) -> Evaluator:
        """The validation metrics (``image_channel``: ``log.image_channel``); default: the mean loss."""
        from dlscale.scoring.loss_evaluator import LossEvaluator

        return LossEvaluator(self.loss, image_channel)

    def build_split(self, data_cfg: Any, split: str) -> Dataset:
        """The data set of ``split`` for ``dlscale evaluate``; default: that entry of ``build_datasets``."""
        datasets = self.build_datasets(data_cfg)
        if split == "train" or split not in datasets:
            raise split_not_offered(self.name, split, [name for name in datasets if name != "train"])
        return datasets[split]

    def describe_model(self, model: torch.nn.Module) -> str:
        """One line about the model for the start of the run's log."""
        from dlscale.models.parameters import count_parameters  # imports torch: once there is a model

        return f"{type(model).__name__} with {count_parameters(model):,} parameters"

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

    def normalization_stats(self, data_cfg: Any) -> Mapping[str, Any]:
        """Named numpy arrays that normalize inputs and denormalize outputs of an exported model (default: none)."""
        return {}

    def forward_flops_per_sample(self, model_cfg: Any, data_cfg: Any) -> int | None:
        """Analytic forward FLOPs of one sample, or None to count them (the default)."""
        return None

    def forecast_data(self, data_cfg: Any, split: str) -> Trajectories:
        """``split`` as trajectories along time for ``dlscale forecast`` (default: the workload cannot roll out)."""
        raise DataError(
            f"workload {self.name!r} cannot roll out: it has no forecast_data member, which gives a held-out split "
            "as states along time (see dlscale.workloads.protocol; the ERA5 workload has one)"
        )


def split_not_offered(workload: str, split: str, offered: Sequence[str], why: str = "") -> DataError:
    """The one line for a split that ``dlscale evaluate`` cannot read: ``why`` (e.g. the directory that is
    missing), and the held-out splits the workload offers."""
    if split == "train" and not why:
        why = "evaluation reads held-out data, never the training samples"
    reason = f": {why}" if why else ""
    return DataError(
        f"no {split!r} split to evaluate{reason}; workload {workload!r} offers {', '.join(offered) or 'none'}"
    )
