"""How every ``dlscale data synth-*`` generator puts a data set on disk: all of it or nothing, with a manifest.

The files are written into ``<out>.partial`` and moved into place at the end, so an interrupted run never
leaves something that looks complete; ``manifest.json`` (written last) records the generator and its spec, which
is how ``--if-missing`` recognises a data set it already wrote and how a directory that is not a generated data
set is refused instead of being replaced.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from dlscale.errors import ConfigError, DataError, DlscaleError
from dlscale.runtime.storage import as_storage_error, require_free_space
from dlscale.runtime.strict_json import to_json

Spec = TypeVar("Spec")

MANIFEST = "manifest.json"
OUT_OPTION = "--out"  # the generators' option that chooses where they write, for a failed write's advice


def preset_spec(
    command: str,
    presets: Mapping[str, Spec],
    preset: str,
    error: type[DlscaleError] = ConfigError,
    **changes: Any,
) -> Spec:
    """Preset ``preset`` of ``command`` (e.g. ``synth-mnist``) with the fields in ``changes`` that are not None
    replaced; an unknown name raises ``error``, naming the presets there are."""
    if preset not in presets:
        raise error(f"{command}: unknown preset {preset!r}; choose one of {', '.join(presets)}")
    return replace(presets[preset], **{k: v for k, v in changes.items() if v is not None})  # type: ignore[type-var]


def read_manifest(out: Path, spec_type: type) -> tuple[Any, dict[str, Any]] | None:
    """(spec, manifest) of the generated data set in ``out``, or None when there is no readable manifest whose
    ``spec`` makes a valid ``spec_type``."""
    try:
        manifest = json.loads((Path(out) / MANIFEST).read_text())
        return spec_type(**manifest["spec"]), manifest
    except (OSError, ValueError, KeyError, TypeError, DlscaleError):
        return None


def write_data_set(
    out: Path,
    generator: str,
    recognized: Callable[[Path], bool],
    fill: Callable[[Path], dict[str, Any]],
    size_bytes: int | None = None,
) -> Path:
    """Write a data set into ``out`` all at once; return ``out``.

    ``fill(partial)`` writes the files into the (existing, empty) directory ``partial`` and returns the manifest
    to record. An existing ``out`` is replaced only when ``recognized(out)`` (a data set this generator wrote) or
    when it is an empty directory; anything else is refused with a DataError naming it. ``size_bytes``: what the
    data set takes, checked against the free space before anything is written. A write that fails (a full or
    read-only disk) removes ``partial`` and is one StorageError line naming ``--out``.
    """
    out = Path(out)
    if out.exists() and not recognized(out) and (not out.is_dir() or any(out.iterdir())):
        raise DataError(
            f"{generator}: {out} exists and is not a dlscale synthetic data set (no {MANIFEST}); "
            "refusing to replace it: choose another --out"
        )
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        partial.mkdir(parents=True)
        if size_bytes is not None:  # before the first file: HDF5 may not close a file the disk filled up in
            require_free_space(partial, size_bytes, f"the data set of {generator}", OUT_OPTION, named=out)
        manifest = fill(partial)
        (partial / MANIFEST).write_text(to_json(manifest))
    except BaseException as exc:
        shutil.rmtree(partial, ignore_errors=True)
        storage = as_storage_error(exc, out, f"cannot write the data set of {generator}", OUT_OPTION)
        if storage is not None and not isinstance(exc, DlscaleError):
            raise storage from exc
        raise
    if out.exists():  # a previous data set of this generator (checked above), or an empty directory
        shutil.rmtree(out)
    partial.rename(out)
    return out
