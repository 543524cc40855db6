"""``dlscale export``: a checkpoint's model as a directory that works without the run (see
:mod:`dlscale.exported.layout` for what it holds).

Everything is written into a temporary directory beside ``--out`` and renamed onto it at the end: an error, a
full disk or a kill at any moment leaves no half export behind (the temporary directory is removed, and any
directory replaced with ``--force`` is kept until the new one is in place).

The checkpoint holds the serial model's whole state whatever layout trained it (tp x cp, FSDP2: see
:mod:`dlscale.checkpoint.sharded_state`), so the export runs in one process on the CPU and gives the same files
for every layout. It reads the run's data once: one validation sample is the example input (its shape goes into
the manifest, and torch.export traces the model on it), and the workload's ``normalization_stats`` may read
files there (ERA5's means and standard deviations).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dlscale.checkpoint.files import load_model_state
from dlscale.config import RunConfig, load_run_config
from dlscale.config.yaml_source import dump_yaml, parse_yaml_value, read_config_file
from dlscale.errors import CheckpointError, ConfigError, DataError, DlscaleError, ExportError
from dlscale.exported.layout import (
    CONFIG_FILE,
    EXPORT_FORMAT,
    EXPORT_VERSION,
    MANIFEST_FILE,
    PROGRAM_FILE,
    STAT_NAME,
    STATS_DIR,
    WEIGHTS_FILE,
    sha256_of,
)
from dlscale.exported.program import export_program
from dlscale.exported.source import checkpoint_to_export, load_export_source
from dlscale.models.parameters import count_parameters
from dlscale.runtime.atomic_files import fsync_directory, fsync_file
from dlscale.runtime.storage import as_storage_error
from dlscale.runtime.strict_json import to_json
from dlscale.version import __version__
from dlscale.workloads import get_workload

# How many validation samples make the example batch (two: a batch dimension torch.export does not fix to 1).
_EXAMPLE_SAMPLES = 2


@dataclass(frozen=True)
class ExportSummary:
    """What an export wrote: the directory (as given), the checkpoint it came from, and its manifest."""

    directory: Path
    checkpoint: Path
    manifest: dict[str, Any]

    def lines(self) -> list[str]:
        """The command's report: the source, each file, and how to load the export."""
        m = self.manifest
        source = m["source"]
        several = (source.get("world_size") or 1) > 1
        layout = f", trained on {source['world_size']} ranks as {source['layout']}" if several else ""
        lines = [
            f"Exported {self.checkpoint} ({m['workload']}, config {m['config_name']!r}, global step "
            f"{source['global_step']}{layout}) to {self.directory}"
        ]
        shapes = f"input {tuple(m['input']['shape'])} -> output {tuple(m['output']['shape'])} per sample"
        described = {
            WEIGHTS_FILE: f"{m['parameters']:,} parameters in {m['tensors']} tensors (safetensors)",
            CONFIG_FILE: f"the resolved config {m['config_name']!r}",
        }
        for name, path in m["normalization"].items():
            stat = np.load(self.directory / path, allow_pickle=False)
            described[path] = f"{name}, {stat.dtype} {tuple(stat.shape)}"
        program = m["program"]
        if program["file"]:
            batch = "any batch size" if program["batch"] == "any" else f"batch size {program['batch']}"
            same = "bit for bit" if program["matches_model"] else "NOT bit for bit"
            described[PROGRAM_FILE] = (
                f"torch.export program ({batch}), equal to the model {same} on the example"
            )
        width = max(len(name) for name in [*described, MANIFEST_FILE])
        lines += [f"  {name:<{width}}  {what}" for name, what in described.items()]
        lines.append(f"  {MANIFEST_FILE:<{width}}  versions, source, sha256 of each file; {shapes}")
        if not program["file"]:
            lines.append(f"  no {PROGRAM_FILE}: {program['skipped']}")
        lines.append(f"Load it with dlscale.load_model({str(self.directory)!r})")
        if program["file"]:
            lines.append(
                f"or, without dlscale: torch.export.load({str(self.directory / PROGRAM_FILE)!r}).module()"
            )
        return lines


def export_run(
    source: str | Path,
    out: str | Path,
    checkpoint: str | None = None,
    force: bool = False,
    program: bool = True,
) -> ExportSummary:
    """Export the model of ``source`` (a run directory, its ``checkpoints/`` or a checkpoint file) to ``out``.

    ``checkpoint``: ``"latest"`` (default), ``"best"`` or a checkpoint file (a path, or a name in the run's
    ``checkpoints/``). An existing ``out`` is refused unless ``force``, and even then only an earlier export (or
    an empty directory) is replaced. ``program=False`` skips the torch.export program (seconds for a large
    model). Raises a DlscaleError (one line) for what the user can fix.
    """
    shown = Path(out).expanduser()  # as the user wrote it, for the messages
    out = shown.absolute()
    _check_target(shown, force)
    path = checkpoint_to_export(Path(source).expanduser(), checkpoint)
    payload = load_export_source(path)
    name = payload["meta"].get("config_name")
    if not isinstance(name, str) or not name:
        raise CheckpointError(f"{path}: its 'meta' entry names no config (config_name)")

    created = _missing_parents(out)
    tmp = out.parent / f".{out.name}.export-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        manifest = _write_export(tmp, path, payload, name, program)
        (tmp / MANIFEST_FILE).write_text(to_json(manifest), encoding="utf-8")
        _sync_files(tmp)
        _check_target(shown, force)  # again: another process may have made it meanwhile
        _publish(tmp, out)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        for directory in created:  # the parents made for this export, innermost first
            with contextlib.suppress(OSError):
                directory.rmdir()
        if isinstance(exc, DlscaleError):
            raise
        storage = as_storage_error(exc, shown, "cannot write the export (nothing was written)", "--out")
        if storage is not None:
            raise storage from exc
        raise
    return ExportSummary(shown, path, manifest)


def _write_export(
    tmp: Path, path: Path, payload: dict[str, Any], name: str, with_program: bool
) -> dict[str, Any]:
    """Write every file but the manifest into ``tmp``; return the manifest."""
    from safetensors import __version__ as safetensors_version
    from safetensors.torch import save_file

    (tmp / CONFIG_FILE).write_text(_config_text(path, payload["config"], name), encoding="utf-8")
    cfg = _read_config(tmp / CONFIG_FILE, name, path)
    workload = get_workload(cfg.workload).configured(cfg.model, cfg.data)
    model = workload.build_model(cfg.model, cfg.data)
    load_model_state(model, payload["model"], str(path))
    model.eval()

    example = _example_batch(workload, cfg)
    with torch.no_grad():
        outputs = model(example)
    if not isinstance(outputs, torch.Tensor):
        raise ExportError(
            f"{path}: the model of workload {cfg.workload!r} returns a {type(outputs).__name__}; dlscale export "
            "writes models whose output is one tensor"
        )

    normalization = {}
    stats = _normalization_stats(workload, cfg)
    if stats:
        (tmp / STATS_DIR).mkdir()
    for stat_name, array in stats.items():
        relative = f"{STATS_DIR}/{stat_name}.npy"
        np.save(tmp / relative, array, allow_pickle=False)
        normalization[stat_name] = relative

    state = _plain_state(model)
    # One metadata key: safetensors writes a map of several in an order that changes from process to process,
    # and the same weights must give the same file (and sha256).
    save_file(state, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
    _readable_like_the_others(tmp / WEIGHTS_FILE, tmp / CONFIG_FILE)
    if with_program:
        program = export_program(model, example, tmp / PROGRAM_FILE)
    else:
        program = {"file": None, "skipped": "not asked for (program=False)"}

    meta, progress = payload["meta"], payload.get("progress") or {}
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    return {
        "format": EXPORT_FORMAT,
        "format_version": EXPORT_VERSION,
        "dlscale_version": __version__,
        "torch_version": str(torch.__version__),
        "safetensors_version": safetensors_version,
        "workload": cfg.workload,
        "config_name": name,
        "source": {
            "checkpoint": str(path.resolve()),
            "global_step": progress.get("global_step"),
            "epoch": progress.get("epoch"),
            "layout": meta.get("layout"),
            "world_size": meta.get("world_size"),
            "dlscale_version": meta.get("dlscale_version"),
            "torch_version": meta.get("torch_version"),
        },
        "input": {"shape": list(example.shape[1:]), "dtype": _dtype_name(example.dtype)},
        "output": {"shape": list(outputs.shape[1:]), "dtype": _dtype_name(outputs.dtype)},
        "parameters": count_parameters(model),
        "tensors": len(state),
        "normalization": normalization,
        "program": program,
        "files": {
            p.relative_to(tmp).as_posix(): {"sha256": sha256_of(p), "bytes": p.stat().st_size} for p in files
        },
    }


def _config_text(checkpoint: Path, resolved: dict[str, Any], name: str) -> str:
    """The run's ``config.yaml`` as it wrote it, when it holds the checkpoint's config; else the checkpoint's
    config written the same way (a run directory's file is rewritten at each start, and may be newer)."""
    text = dump_yaml({name: resolved})
    run_file = checkpoint.parent.parent / CONFIG_FILE
    if checkpoint.parent.name == "checkpoints" and run_file.is_file():
        with contextlib.suppress(DlscaleError, OSError):
            if read_config_file(run_file).get(name) == parse_yaml_value(text)[name]:
                return run_file.read_text(encoding="utf-8")
    return f"# Resolved dlscale config {name!r}, as recorded in {checkpoint}\n{text}"


def _read_config(path: Path, name: str, checkpoint: Path) -> RunConfig:
    try:
        return load_run_config(path, name)
    except ConfigError as exc:
        raise ConfigError(f"{checkpoint}: its config does not load with this dlscale: {exc}") from None


def _example_batch(workload: Any, cfg: RunConfig) -> torch.Tensor:
    """The first validation samples' inputs, stacked: the example torch.export traces the model with."""
    try:
        dataset = workload.build_datasets(cfg.data)["valid"]
    except DataError as exc:
        raise DataError(
            f"{exc} (dlscale export reads one validation sample for the model's input shape: run it where the "
            "run's data is, from the directory the run was started in)"
        ) from None
    if len(dataset) == 0:
        raise DataError(f"workload {cfg.workload!r}: the validation data set is empty; no example input")
    inputs = [dataset[index][0] for index in range(min(_EXAMPLE_SAMPLES, len(dataset)))]
    if not all(isinstance(x, torch.Tensor) for x in inputs):
        raise ExportError(
            f"workload {cfg.workload!r}: a sample's input is a {type(inputs[0]).__name__}; dlscale export "
            "writes models whose input is one tensor"
        )
    while len(inputs) < _EXAMPLE_SAMPLES:
        inputs.append(inputs[0])
    return torch.stack(inputs)


def _normalization_stats(workload: Any, cfg: RunConfig) -> dict[str, np.ndarray]:
    """The workload's ``normalization_stats``, checked: names that make file names, arrays of real numbers."""
    stats = workload.normalization_stats(cfg.data)
    if not isinstance(stats, Mapping):
        raise ExportError(
            f"workload {cfg.workload!r}: normalization_stats returned a {type(stats).__name__}, expected a "
            "mapping of names to numpy arrays"
        )
    checked = {}
    for name, value in stats.items():
        array = np.asarray(value)
        if not isinstance(name, str) or not STAT_NAME.match(name):
            raise ExportError(
                f"workload {cfg.workload!r}: normalization_stats name {name!r} is not [A-Za-z0-9_]+"
            )
        if not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
            raise ExportError(
                f"workload {cfg.workload!r}: normalization_stats[{name!r}] has dtype {array.dtype}, expected numbers"
            )
        checked[name] = array
    return checked


def _plain_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict as safetensors writes it: contiguous CPU tensors, none sharing memory (tied weights
    are stored once per name and tied again when loaded into the model)."""
    state, seen = {}, set()
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().cpu().contiguous()
        pointer = tensor.untyped_storage().data_ptr()
        if pointer in seen:
            tensor = tensor.clone()
        seen.add(pointer)
        state[name] = tensor
    return state


def _readable_like_the_others(path: Path, reference: Path) -> None:
    """Give ``path`` the permissions of ``reference`` (a file written through the umask): safetensors writes
    its file readable by the owner alone, which would hide the weights of an export shared with a group."""
    os.chmod(path, reference.stat().st_mode & 0o777)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_target(out: Path, force: bool) -> None:
    """Refuse an existing ``out`` unless ``force``; with it, replace only an earlier export or an empty directory."""
    if not out.exists() and not out.is_symlink():
        return
    if not force:
        raise ExportError(f"{out}: already exists; give another --out, or --force to replace it")
    replaceable = out.is_dir() and not out.is_symlink()
    if replaceable and ((out / MANIFEST_FILE).is_file() or not any(out.iterdir())):
        return
    raise ExportError(
        f"{out}: exists and is not a dlscale export (no {MANIFEST_FILE}); --force replaces only an earlier "
        "export or an empty directory: give another --out, or remove it yourself"
    )


def _missing_parents(out: Path) -> list[Path]:
    """The parents of ``out`` that do not exist yet, innermost first (removed again if the export fails)."""
    missing = []
    for parent in out.parents:
        if parent.exists():
            break
        missing.append(parent)
    return missing


def _sync_files(directory: Path) -> None:
    """Flush every file of ``directory`` to disk before its rename publishes them."""
    for path in directory.rglob("*"):
        if path.is_file():
            fsync_file(path)
    for folder in [directory, *(p for p in directory.rglob("*") if p.is_dir())]:
        fsync_directory(folder)


def _publish(tmp: Path, out: Path) -> None:
    """Rename the finished ``tmp`` onto ``out``; an earlier export there is moved aside first, removed after."""
    if out.exists():
        old = out.parent / f".{out.name}.replaced-{os.getpid()}-{secrets.token_hex(4)}"
        os.rename(out, old)
        try:
            os.rename(tmp, out)
        except BaseException:
            os.rename(old, out)  # put the earlier export back
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)
    fsync_directory(out.parent)
