"""Continuing a run: which checkpoint it continues from, whether its config may change, and what to do when a
checkpoint does not load."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dlscale.checkpoint.checkpoint_config import CheckpointConfig
from dlscale.checkpoint.directory import CheckpointDir
from dlscale.checkpoint.files import NotADlscaleCheckpoint, foreign_file_kind, load_checkpoint
from dlscale.checkpoint.sharded_files import is_sharded_checkpoint, read_header
from dlscale.checkpoint.weights_start import RECORD_KEY, compare_with_record, describe_record
from dlscale.errors import CheckpointError
from dlscale.training.training_setup import RunRecord

log = logging.getLogger(__name__)


# Keys whose change between a checkpoint and the resumed run is expected and harmless.
_EXPECTED_CHANGES = {
    "checkpoint.resume",
    "checkpoint.resume_weights_only",
    # The run's length: raising it continues a finished run (the new plan is reported when the run starts).
    "train.num_epochs",
    "train.num_iters",
    # How a divergence is handled (changing it after one is the point) and the optional data check.
    "train.on_nonfinite",
    "train.nonfinite_check_every",
    "train.max_skipped_steps",
    "train.max_rollbacks",
    "train.rollback_lr_factor",
    "data.check_finite",
    "log.progress",
    "log.progress_interval_s",
    "loader.num_data_workers",
    "loader.data_loader_config",
    "loader.prefetch_depth",
    "loader.prefetch_factor",
    "loader.device_prefetch",
    "loader.pin_memory",
    "loader.persistent_workers",
    # The layout: a checkpoint holds the serial model's state, so any layout continues it.
    "parallel.tensor_parallel",
    "parallel.context_parallel",
    "parallel.parallel_order",
    "parallel.data_parallel",
}
# Whole sections that only observe a run: changing them between attempts is normal.
_EXPECTED_CHANGED_SECTIONS = ("profile.", "bench.")


@dataclass(frozen=True)
class ResumeSource:
    """The checkpoint a run continues from, and what it takes of it."""

    path: Path
    weights_only: bool = False  # only the model weights: a new run from step 0 (--resume_weights_only)
    argument: str | None = None  # --resume as given (what a weights-only start's checkpoints record)


def resume_source(cfg: CheckpointConfig, checkpoints: CheckpointDir) -> ResumeSource | None:
    """The checkpoint a run continues from, or None for a fresh start (see ``CheckpointConfig.resume``).

    A weights-only start launched again (the same command after a stop, a kill or a requeue) continues from the
    run's own checkpoint when that checkpoint records a start from the same weights
    (:mod:`dlscale.checkpoint.weights_start`).
    """
    if cfg.resume == "never":
        if checkpoints.has_checkpoint():
            raise CheckpointError(
                f"{checkpoints.directory} already holds a checkpoint and checkpoint.resume is 'never': "
                "continue it with --resume auto, or start a separate run with another --run_num"
            )
        return None
    if cfg.resume == "auto":
        if checkpoints.latest_path.exists():
            return ResumeSource(checkpoints.latest_path)
        others = checkpoints.other_checkpoints()
        if others:
            # Starting afresh here would replace these with a new run's checkpoints at its first save.
            raise CheckpointError(
                f"{checkpoints.directory}: has no {checkpoints.LATEST_NAME} but holds "
                f"{', '.join(p.name for p in others)}: continue from one with --resume {others[0]}, or start "
                "a new run with another --run_num"
            )
        return None
    if cfg.resume_weights_only and checkpoints.has_checkpoint():
        continued = continued_weights_only_run(cfg.resume, checkpoints)
        if continued is not None:
            return continued
    path = checkpoint_file(Path(cfg.resume).expanduser())
    if cfg.resume_weights_only and checkpoints.has_checkpoint() and path != checkpoints.latest_path:
        raise CheckpointError(
            f"{checkpoints.directory} already holds this run's own checkpoint; a weights-only start from {path} "
            "would train from step 0 and replace it. Continue this run with --resume auto, or start the "
            "weights-only run in another --run_num"
        )
    return ResumeSource(path, cfg.resume_weights_only, cfg.resume)


def continued_weights_only_run(argument: str, checkpoints: CheckpointDir) -> ResumeSource | None:
    """The run's own latest checkpoint, to continue whole, when it is a weights-only start's from the weights
    ``argument`` names; None when it records no such start (a run that is no fine-tune, or one written before
    dlscale kept the record), or when ``argument`` names that checkpoint itself (a weights-only start from it,
    as asked); CheckpointError when it records a start from other weights."""
    latest = checkpoints.latest_path
    header = _own_header(latest, checkpoints)
    meta = header.get("meta") if isinstance(header.get("meta"), dict) else {}
    record = meta.get(RECORD_KEY)
    if not isinstance(record, dict):
        return None
    try:
        source, problem = checkpoint_file(Path(argument).expanduser()), ""
    except CheckpointError as exc:
        source, problem = None, str(exc)
    check = compare_with_record(argument, source, problem, record, latest)
    if not check.same:
        if source is None:
            raise CheckpointError(problem)
        if source.resolve() == latest.resolve():
            return None
        raise CheckpointError(
            f"{checkpoints.directory} holds a run that took its weights from {describe_record(record)}, not from "
            f"{source}; a weights-only start from {source} would train from step 0 and replace it. Continue that "
            f"run with --resume {record.get('argument')} --resume_weights_only (the command that began it), or "
            f"start the weights-only run from {source} in another --run_num"
        )
    progress = header.get("progress") if isinstance(header.get("progress"), dict) else {}
    log.info(
        "%s: this run began as a weights-only start from %s and continues from its own checkpoint %s (global "
        "step %s); the weights-only source %s was not reloaded",
        checkpoints.directory,
        describe_record(record),
        latest,
        progress.get("global_step", "?"),
        argument,
    )
    if check.note:
        log.warning("%s", check.note)
    return ResumeSource(latest, weights_only=False, argument=argument)


def _own_header(latest: Path, checkpoints: CheckpointDir) -> dict[str, Any]:
    """The entries of the run's latest checkpoint, its tensors left on disk (a sharded checkpoint's header; a
    file's tensors memory-mapped, not read); a checkpoint that does not load is refused as a resume refuses it,
    naming the ones that do."""
    if not is_sharded_checkpoint(latest):
        try:
            document = torch.load(latest, map_location="cpu", weights_only=True, mmap=True)
        except Exception:  # damaged, or no checkpoint: the loader below says which, and what loads instead
            document = None
        if isinstance(document, dict):
            return document
    return load_for_resume(latest, checkpoints)


# What --resume takes, for the messages that refuse what it was given.
RESUME_EXPECTS = (
    "--resume expects a checkpoint file that dlscale wrote (ckpt_latest.pt, ckpt_best.pt, ckpt_step*.pt), a "
    "run directory or its checkpoints directory, 'auto' or 'never'"
)


def checkpoint_file(path: Path) -> Path:
    """``path`` itself when it is a file, else the latest checkpoint of the run or checkpoints directory it names.

    A file that is plainly no checkpoint (an HDF5 data file, a text file...) is refused here, before anything is
    built, with what it looks like; a damaged checkpoint is left to :func:`load_for_resume`.
    """
    if is_sharded_checkpoint(path):
        return path
    if path.is_file():
        kind = foreign_file_kind(path)
        if kind is not None:
            raise CheckpointError(
                f"checkpoint.resume: {path} is not a dlscale checkpoint ({kind}); {RESUME_EXPECTS}"
            )
        return path
    if path.is_dir():
        for directory in (path, path / "checkpoints"):
            candidate = CheckpointDir(directory).latest_path
            if candidate.exists():
                return candidate
        raise CheckpointError(
            f"checkpoint.resume: {path} is a directory without {CheckpointDir.LATEST_NAME} (nor "
            f"checkpoints/{CheckpointDir.LATEST_NAME}){what_directory_holds(path)}; {RESUME_EXPECTS}"
        )
    raise CheckpointError(f"checkpoint.resume: {path} does not exist; {RESUME_EXPECTS}")


def what_directory_holds(path: Path) -> str:
    """', but holds ckpt_best.pt: ...' for a directory of checkpoints without a latest one, else what the
    directory looks like ('it is empty', 'it holds HDF5 files (a data directory?)')."""
    others = (
        CheckpointDir(path).other_checkpoints() or CheckpointDir(path / "checkpoints").other_checkpoints()
    )
    if others:
        return f", but holds {', '.join(p.name for p in others)}: continue from one with --resume {others[0]}"
    return directory_contents(path)


def directory_contents(path: Path) -> str:
    """What a directory without checkpoints holds, for the messages that refuse it: ': it is empty', ': it holds
    HDF5 files (a data directory?), no checkpoint', ': it holds a, b/, c, ... and no checkpoint'."""
    try:
        entries = list(path.iterdir())
        nested = [f for d in entries if d.is_dir() for f in d.iterdir()]  # e.g. a data set's train/, valid/
    except OSError:
        return ""
    if not entries:
        return ": it is empty"
    if any(f.suffix.lower() in _HDF5_SUFFIXES for f in entries + nested):
        return ": it holds HDF5 files (a data directory?), no checkpoint"
    names = sorted(e.name + ("/" if e.is_dir() else "") for e in entries)
    return f": it holds {', '.join(names[:3])}{', ...' if len(names) > 3 else ''} and no checkpoint"


_HDF5_SUFFIXES = (".h5", ".hdf5")


def load_for_resume(path: Path, checkpoints: CheckpointDir) -> dict[str, Any]:
    """Load ``path``; when it cannot be loaded, the error names the checkpoints beside it that do load (this
    run's, or those of the other run's directory that ``path`` is in)."""
    try:
        if is_sharded_checkpoint(path):
            return read_header(path)  # each rank reads its own tensors later
        return load_checkpoint(path, map_location="cpu")  # load_state_dict moves tensors to the device
    except NotADlscaleCheckpoint as exc:
        raise CheckpointError(f"{exc}; {RESUME_EXPECTS}") from None  # intact, so nothing to move aside
    except CheckpointError as exc:
        raise CheckpointError(f"{exc}. {recovery_hint(checkpoints, path)}") from None


def checkpoint_header(path: Path) -> dict[str, Any]:
    """A checkpoint's entries without reading a sharded one's tensors (its position, config, meta)."""
    return read_header(path) if is_sharded_checkpoint(path) else load_checkpoint(path, map_location="cpu")


def is_own_checkpoint(path: Path, checkpoints: CheckpointDir) -> bool:
    """Whether ``path`` is in this run's checkpoint directory (not another run's, given to --resume)."""
    return path.parent.resolve() == checkpoints.directory.resolve()


def recovery_hint(checkpoints: CheckpointDir, broken: Path) -> str:
    """Which other checkpoints beside ``broken`` load (this run's, or the other run's directory it is in), and
    how to continue from one (or what to do if none does)."""
    own = is_own_checkpoint(broken, checkpoints)
    directory = checkpoints if own else CheckpointDir(broken.parent)
    loadable: list[tuple[Path, str]] = []
    for candidate in directory.other_checkpoints(include_latest=True):
        if candidate.resolve() == broken.resolve():
            continue
        try:
            progress = checkpoint_header(candidate).get("progress", {})
        except CheckpointError:
            continue
        position = f"epoch {progress.get('epoch', '?')}, global step {progress.get('global_step', '?')}"
        loadable.append((candidate, position))
    if loadable:
        listed = "; ".join(f"{path} ({position})" for path, position in loadable)
        whose = "of this run" if own else f"in {directory.directory}"
        return (
            f"Checkpoints {whose} that load: {listed}. Continue from one with --resume {loadable[0][0]} "
            f"(move the damaged file aside to keep it)"
        )
    if own:
        return (
            f"No other checkpoint in {checkpoints.directory} loads: move the damaged file aside and train again, "
            "or start a new run with another --run_num"
        )
    return f"No other checkpoint in {directory.directory} loads: give --resume another checkpoint"


def check_workload(meta: dict[str, Any], record: RunRecord, path: Path, checkpoints: CheckpointDir) -> None:
    """Refuse a checkpoint of another workload: the one given to --resume, or (in this run's own directory) one
    that a config of the same name but another workload left there."""
    saved = meta.get("workload")
    if saved is None or saved == record.workload:
        return
    saved_config = meta.get("config_name", "?")
    if is_own_checkpoint(path, checkpoints):
        raise CheckpointError(
            f"{path}: was written by a {saved!r} run (config {saved_config!r}), and this run trains "
            f"{record.workload!r} (config {record.name!r}): two configs of the same name share the run "
            f"directory {checkpoints.directory.parent}; use another --run_num or --expdir"
        )
    theirs = f"workload {saved!r} (config {saved_config!r})"
    ours = f"workload {record.workload!r} (config {record.name!r})"
    raise CheckpointError(
        f"checkpoint.resume: {path} is a checkpoint of {theirs}, and this run trains {ours}, so it cannot be "
        f"resumed here; resume it with a config of workload {saved!r}, or give --resume a checkpoint of a "
        f"{record.workload!r} run"
    )


# How the optimizer runs, not what it computes: these follow this run's config, not the checkpoint's.
_EXECUTION_FLAGS = ("fused", "foreach", "capturable")


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any], source: str) -> None:
    """Load moments and step counts, but keep this run's execution flags.

    ``Optimizer.load_state_dict`` takes every hyper-parameter of the saved param groups, including ``fused``
    and ``capturable``: without this, a run resumed with ``--enable_fused`` or CUDA graphs would silently run
    the way the checkpoint's run did.
    """
    flags = [{k: group[k] for k in _EXECUTION_FLAGS if k in group} for group in optimizer.param_groups]
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError) as exc:
        raise CheckpointError(
            f"{source}: its optimizer state does not fit this run's optimizer: {exc}"
        ) from None
    for group, own_flags in zip(optimizer.param_groups, flags, strict=True):
        group.update(own_flags)
        on_device = bool(group.get("fused") or group.get("capturable"))
        for param in group["params"]:
            step = optimizer.state.get(param, {}).get("step")
            if torch.is_tensor(step):
                # Fused and capturable steps keep the count on the parameter's device; the others on the host.
                device = param.device if on_device else torch.device("cpu")
                optimizer.state[param]["step"] = step.to(device=device, dtype=torch.float32)


def check_config_changes(saved: dict[str, Any], record: RunRecord, source: str, weights_only: bool) -> None:
    """Refuse changed keys that reinterpret the saved weights (unless only the weights are taken); warn about
    the other changes."""
    weight_keys = record.weight_defining_keys
    changes, refused = [], []
    for key, old, new in _flat_differences(saved, record.resolved):
        if key in _EXPECTED_CHANGES or key.startswith(_EXPECTED_CHANGED_SECTIONS):
            continue
        if old is _ABSENT or new is _ABSENT:  # a key one dlscale version has and the other has not
            continue
        (refused if key in weight_keys else changes).append(f"{key}: {old!r} -> {new!r}")
    if refused and not weights_only:
        raise CheckpointError(
            f"{source}: this run changes keys that give the saved weights another meaning ({'; '.join(refused)}): "
            "the weights would load, but into a different model. Undo the change to continue the run, or start "
            "a new run from these weights with --resume PATH --resume_weights_only (and another --run_num)"
        )
    changes += refused
    if changes:
        log.warning("%s: resuming with a changed config (%s)", source, "; ".join(changes))


def weight_key_changes(
    saved: dict[str, Any], current: dict[str, Any], weight_keys: frozenset[str]
) -> list[str]:
    """``key: saved -> current`` for each of ``weight_keys`` whose value differs between two resolved configs
    (a key that one of them lacks, written by another dlscale version, is left out)."""
    return [
        f"{key}: {old!r} -> {new!r}"
        for key, old, new in _flat_differences(saved, current)
        if key in weight_keys and old is not _ABSENT and new is not _ABSENT
    ]


def weight_defining_keys(model_cfg: Any, data_cfg: Any) -> frozenset[str]:
    """Dotted keys whose change reinterprets saved weights: every ``model.*`` key but the ones the model's config
    declares safe (``RESUME_SAFE_KEYS``, e.g. dropout), and the data keys its config declares
    (``WEIGHT_DEFINING_KEYS``, e.g. which channels feed the model)."""
    safe = set(getattr(model_cfg, "RESUME_SAFE_KEYS", ()))
    keys = {f"model.{f.name}" for f in dataclasses.fields(model_cfg) if f.name not in safe}
    keys |= {f"data.{name}" for name in getattr(data_cfg, "WEIGHT_DEFINING_KEYS", ())}
    return frozenset(keys)


_ABSENT = object()  # a key the other config does not have (written by another dlscale version)


def _flat_differences(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[tuple]:
    differences = []
    for key in sorted(set(saved) | set(current)):
        old, new = saved.get(key, _ABSENT), current.get(key, _ABSENT)
        if isinstance(old, dict) and isinstance(new, dict):
            differences.extend(_flat_differences(old, new, f"{prefix}{key}."))
        elif old != new:
            differences.append((f"{prefix}{key}", old, new))
    return differences
