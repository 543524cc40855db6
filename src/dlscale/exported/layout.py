"""What an exported model's directory holds, its manifest, and the check of every file against the manifest.

    DIR/model.safetensors   the weights: the serial model's state dict (safetensors: no pickle, no code on load)
    DIR/config.yaml         the run's resolved config (``--yaml_config DIR/config.yaml --config <name>``)
    DIR/stats/<name>.npy    the workload's normalization statistics (numpy.save; no pickled objects)
    DIR/model.pt2           the torch.export program, when the model exports (torch.export.load)
    DIR/manifest.json       versions, source checkpoint and step, shapes, and the sha256 of each file above

The manifest is written last, and the directory appears under its name only when complete (see
:mod:`dlscale.exported.writer`). The sha256s tell a changed, damaged or half-copied file from the one the export
wrote; they are no signature (whoever can change the files can change the manifest too).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path, PurePosixPath
from typing import Any

from dlscale.checkpoint.files import check_format_version
from dlscale.errors import ExportError

EXPORT_FORMAT = "dlscale-export"
EXPORT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.yaml"
PROGRAM_FILE = "model.pt2"
MANIFEST_FILE = "manifest.json"
STATS_DIR = "stats"
# The files every export has; the program and the statistics are listed in the manifest when there are some.
REQUIRED_FILES = (WEIGHTS_FILE, CONFIG_FILE)
STAT_NAME = re.compile(r"^[A-Za-z0-9_]+$")

_CHUNK = 1 << 20


def sha256_of(path: Path) -> str:
    """The hex sha256 of the file at ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of the export in ``directory``; ExportError naming the directory or the manifest when it is
    not one (no such directory, no manifest, not JSON, another format, a newer export version)."""
    if not directory.exists():
        raise ExportError(f"{directory}: no such directory; expected a model exported by dlscale export")
    if not directory.is_dir():
        raise ExportError(f"{directory}: is not a directory; expected a model exported by dlscale export")
    path = directory / MANIFEST_FILE
    if not path.is_file():
        raise ExportError(
            f"{path}: missing, so {directory} is no complete dlscale export (an export writes its manifest last); "
            "export the run again"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ExportError(f"{path}: cannot be read as JSON ({exc}); export the run again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != EXPORT_FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise ExportError(f"{path}: is not the manifest of a dlscale export (format {found!r})")
    check_format_version(
        path, manifest.get("format_version"), EXPORT_VERSION, "export format_version", ExportError
    )
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(isinstance(e, dict) for e in files.values()):
        raise ExportError(f"{path}: has no valid 'files' table (name -> sha256)")
    for name in REQUIRED_FILES:
        if name not in files:
            raise ExportError(f"{path}: lists no {name}; every export has one: export the run again")
    return manifest


def verify_files(directory: Path, manifest: dict[str, Any]) -> None:
    """Check that every file the manifest lists is in ``directory`` with its sha256; ExportError naming the first
    that is missing or changed."""
    for name, entry in manifest["files"].items():
        relative = PurePosixPath(name)
        if relative.is_absolute() or ".." in relative.parts or not relative.parts:
            raise ExportError(
                f"{directory / MANIFEST_FILE}: lists {name!r}, which is not a file of the export"
            )
        path = directory.joinpath(*relative.parts)
        if not path.is_file():
            raise ExportError(
                f"{path}: missing (manifest.json lists it): the export is incomplete; copy the whole directory, "
                "or export the run again"
            )
        expected = entry.get("sha256")
        try:
            actual = sha256_of(path)
        except OSError as exc:
            raise ExportError(f"{path}: cannot be read ({exc.strerror or exc})") from None
        if actual != expected:
            raise ExportError(
                f"{path}: changed since the export (its sha256 is {actual[:16]}..., manifest.json records "
                f"{str(expected)[:16]}...): damaged, or edited after the export; export the run again"
            )
