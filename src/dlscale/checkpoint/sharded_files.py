"""Sharded checkpoints on disk: a directory that every rank writes its own shards into, through PyTorch's
Distributed Checkpoint (DCP), plus dlscale's header file, written last.

A sharded checkpoint is a directory ``ckpt_step<global step>`` holding DCP's ``*.distcp`` files and ``.metadata``
(the shards' places in the serial tensors), and ``dlscale_state.pt``: everything that is not a shard of a
tensor (the position, the config, the RNG, the optimizer's hyper-parameters), written by rank 0 with the
single-file format's atomic writer once every rank's shards and DCP's metadata are on disk. That file is the
marker: a directory without it is an interrupted save, which nothing loads (it names the checkpoints that do).

Only tensors go through DCP: its loader unpickles non-tensor entries with ``weights_only=False``, so dlscale never
writes any there, and reads ``.metadata`` (a pickle too) with an unpickler that accepts DCP's metadata classes
only. The tensors themselves are read with ``torch.load(weights_only=True)`` by DCP.
"""

from __future__ import annotations

import contextlib
import importlib
import pickle
import re
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from dlscale.checkpoint.single_file import load_checkpoint_file, save_checkpoint
from dlscale.errors import CheckpointError, exception_line

HEADER_NAME = "dlscale_state.pt"
DCP_METADATA_NAME = ".metadata"
MODEL_PREFIX = "model."
OPTIMIZER_PREFIX = "optimizer."

SINGLE_PROCESS_WARNING = "torch.distributed is disabled, unavailable or uninitialized"
_STEP_DIRECTORY = re.compile(r"ckpt_step\d{8,}(-\d+)?")  # how dlscale names a sharded checkpoint's directory

# The classes DCP's .metadata pickle is made of (torch 2.11 to 2.13), and nothing else.
_DCP_MODULES = ("torch.distributed.checkpoint.metadata",)
_OTHER_GLOBALS = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
}


def is_sharded_checkpoint(path: Path) -> bool:
    """Whether ``path`` is (or points to) a sharded checkpoint's directory, complete or not (also one whose
    save was interrupted before it wrote anything: a ``ckpt_step<step>`` directory)."""
    if not path.is_dir():
        return False
    if _STEP_DIRECTORY.fullmatch(path.resolve().name):
        return True
    return (
        (path / HEADER_NAME).is_file() or (path / DCP_METADATA_NAME).is_file() or any(path.glob("*.distcp"))
    )


def is_complete(path: Path) -> bool:
    """Whether the save of ``path`` ran to its end (its header, written last, is there)."""
    return (path / HEADER_NAME).is_file() and (path / DCP_METADATA_NAME).is_file()


def check_complete(path: Path) -> None:
    """CheckpointError naming ``path`` when its save did not finish."""
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    if not is_complete(path):
        missing = HEADER_NAME if not (path / HEADER_NAME).is_file() else DCP_METADATA_NAME
        raise CheckpointError(
            f"{path}: is an incomplete sharded checkpoint (no {missing}): its save was interrupted before every "
            "rank had written its shards, so it holds no consistent state"
        )


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if not _allowed_global(module, name):
            raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP's checkpoint metadata")
        return super().find_class(module, name)


def _allowed_global(module: str, name: str) -> bool:
    """A class that DCP's metadata is made of: one defined in DCP's metadata module (dataclasses and enums), its
    ``_StorageInfo``, a torch dtype, or one of a few plain ones. Never a dotted name (``os.system`` reached through
    a module that imports ``os``) and never a function."""
    if "." in name:
        return False
    if (module, name) in _OTHER_GLOBALS:
        return True
    if module == "torch":
        return isinstance(getattr(torch, name, None), torch.dtype)
    if module not in _DCP_MODULES:
        return False
    found = getattr(importlib.import_module(module), name, None)
    return isinstance(found, type) and found.__module__ == module


def safe_reader(path: Path) -> Any:
    """DCP's file reader for ``path``, reading ``.metadata`` with an unpickler that accepts DCP's own metadata
    classes only (DCP's reader would unpickle whatever the file holds)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            return read_metadata(Path(self.path), self.load_id, StorageMeta)

    return SafeReader(str(path))


def read_metadata(path: Path, load_id: Any = None, storage_meta: Any = None) -> Any:
    """DCP's Metadata of the checkpoint in ``path`` (CheckpointError when it is missing or not DCP's)."""
    file = path / DCP_METADATA_NAME
    try:
        with open(file, "rb") as stream:
            metadata = _MetadataUnpickler(stream).load()
    except FileNotFoundError:
        raise CheckpointError(
            f"{path}: has no {DCP_METADATA_NAME}; it is not a complete sharded checkpoint"
        ) from None
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, ValueError, TypeError) as exc:
        raise CheckpointError(
            f"{file}: is corrupt or not DCP's checkpoint metadata ({type(exc).__name__}: {exc}); dlscale reads it "
            "with an unpickler that accepts DCP's metadata classes only"
        ) from exc
    if not hasattr(metadata, "state_dict_metadata"):
        raise CheckpointError(f"{file}: holds a {type(metadata).__name__}, not DCP's checkpoint metadata")
    if storage_meta is not None:
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = storage_meta()
        metadata.storage_meta.load_id = load_id
    return metadata


def tensor_entries(path: Path) -> dict[str, Any]:
    """{name: DCP's TensorStorageMetadata (size, dtype)} of the tensors in the checkpoint at ``path``."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    entries = read_metadata(path).state_dict_metadata
    return {name: md for name, md in entries.items() if isinstance(md, TensorStorageMetadata)}


def read_header(path: Path) -> dict[str, Any]:
    """The header (``dlscale_state.pt``) of a complete sharded checkpoint: everything but the tensors."""
    check_complete(path)
    header = load_checkpoint_file(path / HEADER_NAME)
    if not isinstance(header.get("sharded"), dict):
        raise CheckpointError(f"{path / HEADER_NAME}: is not the header of a sharded checkpoint")
    return header


def write_header(path: Path, header: Mapping[str, Any]) -> None:
    """Write the header last, atomically: from here on the checkpoint in ``path`` is complete."""
    save_checkpoint(header, path / HEADER_NAME)


def load_tensors(
    template: dict[str, Any], path: Path, entries: Mapping[str, Any], no_dist: bool = False
) -> None:
    """Fill ``template`` ({name: tensor or DTensor shaped as this rank holds it}) from the checkpoint in ``path``,
    whose tensors ``entries`` lists (:func:`tensor_entries`); DCP reads each rank's part of every serial tensor,
    whatever layout wrote it (a collective on the default group unless ``no_dist``)."""
    import torch.distributed.checkpoint as dcp

    missing = [name for name in template if name not in entries]
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise CheckpointError(f"{path}: the checkpoint has no tensor {shown}")
    for name, value in template.items():
        saved = tuple(entries[name].size)
        if tuple(value.shape) != saved:
            raise CheckpointError(
                f"{path}: {name} is {saved} in the checkpoint and {tuple(value.shape)} in this run's model"
            )
    try:
        with single_process_quiet():
            dcp.load(template, storage_reader=safe_reader(path), no_dist=no_dist)
    except CheckpointError:
        raise
    except dcp_failures() as exc:  # a damaged shard file, in DCP's wrapping
        raise CheckpointError(
            f"{path}: its shards cannot be read ({exception_line(root_cause(exc))})"
        ) from exc


def load_consolidated(path: Path, entries: Iterable[str] = ("model", "optimizer")) -> dict[str, Any]:
    """The whole checkpoint in ``path`` as the single-file format holds it (the serial model's tensors), read on
    one process without a process group: for ``dlscale export``, ``evaluate`` and ``forecast``. ``entries``
    chooses which tensors are read (``("model",)`` skips the optimizer's moments)."""
    header = read_header(path)
    wanted = tuple(f"{entry}." for entry in entries)
    saved = tensor_entries(path)
    template = {
        name: torch.empty(tuple(md.size), dtype=md.properties.dtype)
        for name, md in saved.items()
        if name.startswith(wanted)
    }
    load_tensors(template, path, saved, no_dist=True)
    payload = {key: value for key, value in header.items() if key != "sharded"}
    if "model" in entries:
        payload["model"] = {
            name[len(MODEL_PREFIX) :]: value
            for name, value in template.items()
            if name.startswith(MODEL_PREFIX)
        }
    if "optimizer" in entries and isinstance(payload.get("optimizer"), dict):
        payload["optimizer"] = with_optimizer_tensors(payload["optimizer"], template)
    return payload


@contextlib.contextmanager
def single_process_quiet() -> Iterator[None]:
    """DCP warns at every single-process save and load that it assumes one process: dlscale chose that."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="torch.distributed is disabled, unavailable or uninitialized"
        )
        yield


def optimizer_name(index: int, key: str) -> str:
    """The DCP name of the optimizer state ``key`` (e.g. ``exp_avg``) of the parameter at ``index``."""
    return f"{OPTIMIZER_PREFIX}{index}.{key}"


def parse_optimizer_name(name: str) -> tuple[int, str] | None:
    """(parameter index, state key) of an optimizer tensor's DCP name; None for another name."""
    if not name.startswith(OPTIMIZER_PREFIX):
        return None
    index, _, key = name[len(OPTIMIZER_PREFIX) :].partition(".")
    return (int(index), key) if index.isdigit() and key else None


def with_optimizer_tensors(optimizer: Mapping[str, Any], tensors: Mapping[str, Any]) -> dict[str, Any]:
    """The optimizer's state dict from its header part (param groups, non-tensor state) and its tensors."""
    state: dict[int, dict[str, Any]] = {
        int(index): dict(entries) for index, entries in (optimizer.get("state") or {}).items()
    }
    for name, value in tensors.items():
        parsed = parse_optimizer_name(name)
        if parsed is not None:
            state.setdefault(parsed[0], {})[parsed[1]] = value
    return {**optimizer, "state": dict(sorted(state.items()))}


def dcp_failures() -> tuple[type[BaseException], ...]:
    """What a failed DCP save or load raises: DCP gathers every rank's failure into a CheckpointException, which
    is a BaseException (so ``except Exception`` lets it through)."""
    from torch.distributed.checkpoint.api import CheckpointException

    return (Exception, CheckpointException)


def root_cause(exc: BaseException) -> BaseException:
    """The first OSError inside DCP's wrapped failures (a full disk on one rank), else the first rank's failure,
    else ``exc``."""
    queue: list[BaseException] = [exc]
    first_failure: BaseException | None = None
    while queue:
        current = queue.pop(0)
        if isinstance(current, OSError):
            return current
        failures = getattr(current, "failures", None)  # CheckpointException: {rank: exception}
        if isinstance(failures, dict):
            found = [f for f in failures.values() if isinstance(f, BaseException)]
            first_failure = first_failure or (found[0] if found else None)
            queue.extend(found)
        queue.extend(linked for linked in (current.__cause__, current.__context__) if linked is not None)
    return first_failure or exc
