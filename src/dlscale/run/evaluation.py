"""``dlscale evaluate``: a checkpoint's metrics on a held-out split, through the workload's own evaluator.

The checkpoint holds the serial model's state whatever layout wrote it (DDP, FSDP2, tp x cp), so it loads into
this launch's layout: one process, or N ranks under torchrun that share the split's samples (and, with
``--set parallel.tensor_parallel=N``, the model). The config is the run directory's ``config.yaml``, else the
one the checkpoint recorded; ``--set`` may change any key but those that define the weights (the data's root,
say, or the batch size). Everything is checked before the first batch; rank 0 writes
``eval/<split>-<checkpoint>/``, or ``eval/<split>-<checkpoint>-set-<hash>/`` after ``--set`` changes that can
change the results (see :mod:`dlscale.run.results_directory` and :mod:`dlscale.report.evaluation_report`), and
every rank returns the same document.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dlscale.checkpoint.files import load_checkpoint, load_model_state
from dlscale.checkpoint.resume import weight_defining_keys
from dlscale.checkpoint.selection import ChosenCheckpoint, check_fits, choose_checkpoint
from dlscale.checkpoint.sharded_state import local_model_state
from dlscale.config import RunConfig, load_run_config
from dlscale.config.run_config import flat_key_homes, recorded_run_config, section_classes
from dlscale.config.yaml_source import read_config_file
from dlscale.data.dataset_description import describe_dataset
from dlscale.data.loading.pipeline import build_batch_source
from dlscale.data.loading.sampler import EvaluationSampler
from dlscale.data.values.finite_check import FiniteCheckedBatches
from dlscale.errors import CheckpointError
from dlscale.parallel.model_parallel import create_mesh, data_parallel_sum
from dlscale.report.evaluation_report import (
    METRICS_JSON,
    evaluation_document,
    log_evaluation,
    write_evaluation,
)
from dlscale.report.progress_display import PassProgress
from dlscale.report.run_dir import early_logging
from dlscale.run.assembly import batch_sizes, errors_naming_the_config
from dlscale.run.process_group import distributed_run, written_on_rank_0
from dlscale.run.results_directory import override_name_part, replacement_notice, results_directory_name
from dlscale.runtime.device import Device
from dlscale.runtime.launch import ProcessInfo, detect_process
from dlscale.runtime.rng import seed_everything
from dlscale.scoring.evaluator import evaluate
from dlscale.training.precision import Precision
from dlscale.version import __version__
from dlscale.workloads import get_workload
from dlscale.workloads.protocol import Workload

log = logging.getLogger("dlscale.train")

EVAL_DIR = "eval"
# The run's tp x cp need not fit this launch: evaluation is data parallel over its ranks unless --set says
# otherwise (these come before the user's settings, which win).
LAYOUT_DEFAULTS = ("parallel.tensor_parallel=1", "parallel.context_parallel=1")


@dataclass
class Evaluation:
    """An evaluation with everything checked that can be checked before the model is built."""

    source: ChosenCheckpoint
    payload: dict[str, Any]  # the checkpoint
    config: RunConfig
    workload: Workload
    split: str
    overrides: tuple[str, ...]

    @property
    def override_part(self) -> str | None:
        """``set-<hash>`` for the ``--set`` changes that can change the results; None without any."""
        return override_name_part(self.overrides, flat_key_homes(section_classes(self.config.workload)))

    @property
    def output_dir(self) -> Path:
        """``<run dir>/eval/<split>-<checkpoint>``, with ``-set-<hash>`` after ``--set`` changes."""
        parts = [self.override_part] if self.override_part is not None else []
        return self.source.output_dir / EVAL_DIR / results_directory_name(self.split, self.source.name, parts)


def evaluate_checkpoint(
    target: str | Path, split: str = "valid", checkpoint: str | None = None, overrides: Sequence[str] = ()
) -> dict[str, Any]:
    """Evaluate the checkpoint ``target`` and ``checkpoint`` name (see
    :func:`dlscale.checkpoint.selection.choose_checkpoint`) on ``split``, on every rank of the launch;
    the ``metrics.json`` document. Bad input raises a DlscaleError before anything is written."""
    process = detect_process()
    with early_logging(process.is_main):
        evaluation = prepare(Path(target).expanduser(), split, checkpoint, tuple(overrides))
        device = Device.select(process.local_rank)
        with distributed_run(process, device, evaluation.config.parallel.timeout_s) as ending:
            document = _evaluate_on_this_rank(evaluation, process, device)
            ending.alike = True
            return document


def prepare(
    target: Path, split: str, checkpoint: str | None, overrides: tuple[str, ...], command: str = "evaluate"
) -> Evaluation:
    """Find the checkpoint and its config, and refuse one that does not fit the config (another workload, or
    keys that define the weights changed by ``--set`` or by another run's config); ``command`` names the
    command in the messages (``dlscale forecast`` reads checkpoints the same way)."""
    source = choose_checkpoint(target, checkpoint, command)
    payload = load_checkpoint(source.checkpoint, optimizer=False)
    if "model" not in payload:
        raise CheckpointError(f"{source.checkpoint}: has no 'model' entry; there are no weights to evaluate")
    cfg = evaluation_config(source, payload, overrides)
    workload = get_workload(cfg.workload).configured(cfg.model, cfg.data)
    origin = f"the config {cfg.where}"
    keys = weight_defining_keys(cfg.model, cfg.data)
    check_fits(payload, source.checkpoint, workload.name, cfg.to_dict(), origin, keys)
    return Evaluation(source, payload, cfg, workload, split, overrides)


def evaluation_config(
    source: ChosenCheckpoint, payload: dict[str, Any], overrides: tuple[str, ...]
) -> RunConfig:
    """The run directory's ``config.yaml`` or, without one, the config the checkpoint recorded; with
    ``overrides`` after the evaluation's layout defaults."""
    settings = [*LAYOUT_DEFAULTS, *overrides]
    meta = payload.get("meta") if isinstance(payload.get("meta"), dict) else {}
    saved_name = meta.get("config_name")
    config_file = source.config_file
    if config_file is not None:
        names = list(read_config_file(config_file))
        name = saved_name if saved_name in names else names[0]
        return load_run_config(config_file, name, settings)
    recorded = payload.get("config")
    if not isinstance(recorded, dict) or not recorded:
        raise CheckpointError(
            f"{source.checkpoint}: records no config, and no run directory with a config.yaml holds it; "
            "evaluate the run directory the checkpoint belongs to"
        )
    where = f"{source.checkpoint} (its recorded config)"
    return recorded_run_config(recorded, saved_name or "recorded", where, settings)


def _evaluate_on_this_rank(evaluation: Evaluation, process: ProcessInfo, device: Device) -> dict[str, Any]:
    """Build this rank's part of the model, load the weights, run the split through the workload's evaluator;
    rank 0 writes the results. The document, on every rank."""
    cfg, workload, split = evaluation.config, evaluation.workload, evaluation.split
    device.configure(cfg.train.deterministic, tf32=cfg.train.tf32)
    with errors_naming_the_config(cfg):
        mesh = create_mesh(cfg.parallel, process)
    seed_everything(cfg.train.seed)
    dataset = workload.build_split(cfg.data, split)
    model = workload.build_model(cfg.model, cfg.data).to(device.torch)
    with errors_naming_the_config(cfg):
        model = workload.parallelize(model, mesh)
    checkpoint = evaluation.source.checkpoint
    load_model_state(model, local_model_state(model, evaluation.payload["model"]), str(checkpoint))

    _, local_batch = batch_sizes(cfg, mesh.dp_size)
    sampler = EvaluationSampler(len(dataset), mesh.dp_size, mesh.dp_rank)
    loader: Any = build_batch_source(
        dataset, cfg.loader, local_batch, sampler, device, seed=cfg.train.seed + 1
    )
    if getattr(cfg.data, "check_finite", False):  # a workload's data section may not offer the check
        loader = FiniteCheckedBatches(loader, sampler, dataset, split, local_batch)
    if process.is_main:
        loader = PassProgress(loader, f"{split} split", cfg.log.progress, cfg.log.progress_interval_s)
    evaluator = workload.evaluator(dataset, cfg.log.image_channel)
    progress = evaluation.payload.get("progress") or {}
    log.info(
        "Evaluating %s (%s) on the %s split: %s; %d process(es), layout %s",
        checkpoint,
        _position(progress),
        split,
        describe_dataset(dataset),
        process.world_size,
        mesh.shape.describe(),
    )
    if process.is_main:
        notice = replacement_notice(evaluation.output_dir, METRICS_JSON, "evaluation")
        if notice is not None:
            log.info("%s", notice)
    predict = Precision(cfg.train.amp_mode, device).wrap_inference(model)
    validation = evaluate(model, loader, evaluator, device, predict, data_parallel_sum(mesh, default=None))

    identity = {
        "split": split,
        "checkpoint": str(checkpoint),
        "checkpoint_name": evaluation.source.name,
        "run_dir": str(evaluation.source.run_dir) if evaluation.source.run_dir is not None else None,
        "config": cfg.name,
        "config_file": cfg.source,
        "workload": workload.name,
        "overrides": list(evaluation.overrides),
        "epochs_completed": progress.get("epoch"),
        "global_step": progress.get("global_step"),
        "dataset": describe_dataset(dataset),
        "world_size": process.world_size,
        "layout": mesh.shape.describe(),
        "device": device.name,
        "dlscale_version": __version__,
        "torch_version": str(torch.__version__),
        # What was asked for (the directory's name says which of it changes the results), and where it went.
        "options": {"split": split, "overrides": list(evaluation.overrides)},
        "output_dir": str(evaluation.output_dir),
    }
    document = evaluation_document(validation, identity)

    def write() -> None:
        title = f"{split} split, {evaluation.source.name}"
        written = write_evaluation(evaluation.output_dir, document, validation, title)
        log_evaluation(document, validation, written)

    # Rank 0's document (with the files it wrote) on every rank.
    return written_on_rank_0(process, device, document, write, "evaluation")


def _position(progress: dict[str, Any]) -> str:
    """'after epoch 2, global step 22' or 'epoch 3, step 5 of the epoch, global step 27'."""
    epoch, step = progress.get("epoch"), progress.get("step_in_epoch")
    if epoch is None:
        return "position unknown"
    if step:
        return f"epoch {epoch + 1}, step {step} of the epoch, global step {progress.get('global_step')}"
    return f"after epoch {epoch}, global step {progress.get('global_step')}"
