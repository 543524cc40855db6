"""A zarr store's metadata, checked before xarray or zarr reads any of it.

zarr decodes a chunk with the codecs its array's metadata names, found by name among every codec registered
in the process (numcodecs' ``pickle`` among them: unpickling a chunk runs whatever code it holds, and zarr 2
reads an object array through it). A store is a download or a copy from anywhere, so its metadata is a list of
instructions to check, not to follow:

- every array's codecs (format 2's ``compressor`` and ``filters``, format 3's ``codecs``, sharding's inner ones
  included) must be among :data:`NUMCODECS_IDS` / :data:`ZARR3_CODECS`: the compressors, filters and checksums
  that turn bytes into numbers (or strings, for coordinates), none of which runs code from the store;
- a metadata file must be a regular file (not a directory, pipe, link loop) of at most
  :data:`MAX_METADATA_BYTES` (WeatherBench2's and ARCO-ERA5's are well under 1 MB; attributes of hundreds of MB
  would be read and kept whole), JSON, and nested at most :data:`MAX_NESTING` deep (deeper JSON exhausts the
  parser's recursion or that of the code that copies attributes);
- the store has some metadata at its root (``.zgroup``, ``.zmetadata`` or ``zarr.json``): an empty directory, or
  one of other files, is no store.

Each finding is one DataError naming the store, the file or variable, and the way out. The arrays checked are
those of the root group (what ``xarray.open_dataset`` reads): from the consolidated metadata and, on a local
disk, from each array's own files as well (a reader may use either); a remote store's own files are read only
where it has no consolidated metadata (listing a bucket of millions of chunks is no check).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from dlscale.errors import DataError
from dlscale.runtime.file_status import why_not_a_file

MAX_METADATA_BYTES = 16 << 20
MAX_NESTING = 64
# numcodecs' codec ids that decode bytes into numbers or strings and run no code from the store (not ``pickle``).
NUMCODECS_IDS = frozenset(
    {
        "blosc", "zstd", "lz4", "zlib", "gzip", "bz2", "lzma", "zfpy", "pcodec",  # compressors
        "delta", "fixedscaleoffset", "quantize", "bitround", "packbits", "categorize", "astype", "shuffle",
        "crc32", "crc32c", "adler32", "fletcher32", "jenkins_lookup3",  # checksums
        "vlen-utf8", "vlen-bytes", "vlen-array", "json2", "msgpack2", "base64",  # strings of coordinates
    }
)  # fmt: skip
ZARR3_CODECS = frozenset(
    {"bytes", "endian", "transpose", "blosc", "gzip", "zstd", "crc32c", "sharding_indexed", "vlen-utf8"}
    | {"vlen-bytes"}
    | {f"numcodecs.{codec}" for codec in NUMCODECS_IDS}
)
ROOT_FILES = (".zmetadata", "zarr.json", ".zgroup", ".zattrs")
ARRAY_FILES = (".zarray", "zarr.json", ".zattrs", ".zgroup")
CONSOLIDATED = ".zmetadata"
RUNS_CODE = {"pickle", "numcodecs.pickle"}
COMPRESSORS = ("blosc", "zstd", "lz4", "zlib", "gzip", "bz2", "lzma")  # as a message names them


class StoreFiles(Protocol):
    """The files of a store, by key (``.zmetadata``, ``temperature/.zarray``)."""

    where: str
    local: bool

    def read(self, key: str) -> bytes | None:
        """The file's bytes, None where there is none; a DataError for one that cannot be metadata."""

    def children(self) -> list[str]:
        """The names at the store's root that may be arrays."""


class LocalFiles:
    """A store on a local disk."""

    local = True

    def __init__(self, root: Path):
        self.root = Path(root)
        self.where = str(root)

    def read(self, key: str) -> bytes | None:
        path = self.root / key
        if not os.path.lexists(path):
            return None
        why = why_not_a_file(path)
        if why is not None:
            raise DataError(
                f"{self.where}: its metadata file {key} {why}; repair the store or download it again"
            )
        _check_size(self.where, key, path.stat().st_size)
        try:
            return path.read_bytes()
        except OSError as exc:
            raise DataError(f"{self.where}: its metadata file {key} cannot be read: {exc.strerror}") from exc

    def children(self) -> list[str]:
        try:
            with os.scandir(self.root) as entries:
                return sorted(entry.name for entry in entries if _is_directory(entry))
        except OSError as exc:
            raise DataError(f"{self.where}: cannot be listed: {exc.strerror}") from exc


class MappedFiles:
    """A remote store through an fsspec mapper (``fsspec.get_mapper('gs://...')``)."""

    local = False

    def __init__(self, where: str, mapper: Any):
        self.where = where
        self.fs = mapper.fs
        self.root = mapper.root.rstrip("/")

    def read(self, key: str) -> bytes | None:
        path = f"{self.root}/{key}"
        try:
            size = self.fs.size(path)
        except FileNotFoundError:
            return None
        if size is not None:
            _check_size(self.where, key, int(size))
        return self.fs.cat_file(path)

    def children(self) -> list[str]:
        return [name.rstrip("/").rsplit("/", 1)[-1] for name in self.fs.ls(self.root, detail=False)]


def check_zarr_metadata(files: StoreFiles) -> None:
    """Refuse the store ``files`` before it is opened: metadata that is no small JSON file, or an array whose
    codecs are not those of numeric data (see the module's docstring)."""
    where = files.where
    roots = {key: _parse(where, key, raw) for key in ROOT_FILES if (raw := files.read(key)) is not None}
    if not roots.keys() - {".zattrs"}:
        raise DataError(
            f"{where}: holds no zarr metadata (no .zgroup, .zmetadata or zarr.json at its top): not a zarr store, "
            "or one still being copied"
        )
    arrays = dict(_consolidated_arrays(where, roots))
    if files.local or not arrays:
        for child in files.children():
            for name in ARRAY_FILES:
                raw = files.read(f"{child}/{name}")
                if raw is None:
                    continue
                document = _parse(where, f"{child}/{name}", raw)
                if name == ".zarray" or (name == "zarr.json" and document.get("node_type") == "array"):
                    arrays[f"{child}/{name}"] = document
    for key, metadata in arrays.items():
        _check_codecs(where, key, metadata)


def check_local_zarr_metadata(store: Path) -> None:
    """:func:`check_zarr_metadata` of the store at ``store`` on a local disk."""
    check_zarr_metadata(LocalFiles(store))


def array_metadata(store: Path, array: str) -> dict | None:
    """The metadata of ``array`` (in the root group of the local store ``store``): its own ``.zarray`` or
    ``zarr.json``, else its entry in the consolidated metadata; None where there is none."""
    files = LocalFiles(store)
    for name in (".zarray", "zarr.json"):
        raw = files.read(f"{array}/{name}")
        if raw is not None:
            return _parse(str(store), f"{array}/{name}", raw)
    roots = {
        key: _parse(str(store), key, raw) for key in (CONSOLIDATED, "zarr.json") if (raw := files.read(key))
    }
    for key, metadata in _consolidated_arrays(str(store), roots):
        if key.rsplit("/", 1)[0] == array:
            return metadata
    return None


def _consolidated_arrays(where: str, roots: dict[str, Any]) -> Iterator[tuple[str, dict]]:
    """(key, metadata) of every array the consolidated metadata (format 2's or 3's) describes."""
    consolidated = roots.get(CONSOLIDATED, {}).get("metadata", {})
    consolidated3 = ((roots.get("zarr.json") or {}).get("consolidated_metadata") or {}).get("metadata", {})
    if not isinstance(consolidated, dict) or not isinstance(consolidated3, dict):
        raise DataError(f"{where}: its consolidated metadata is not a JSON object of arrays")
    for key, metadata in consolidated.items():
        if key.endswith(".zarray"):
            yield key, metadata
    for name, metadata in consolidated3.items():
        if isinstance(metadata, dict) and metadata.get("node_type") == "array":
            yield f"{name}/zarr.json", metadata


def _check_codecs(where: str, key: str, metadata: Any) -> None:
    array = key.rsplit("/", 1)[0]
    if not isinstance(metadata, dict):
        raise DataError(f"{where}: the metadata of variable {array!r} ({key}) is not a JSON object")
    for name in _codec_names(metadata):
        known = ZARR3_CODECS if metadata.get("zarr_format") == 3 else NUMCODECS_IDS
        if name in known:
            continue
        why = (
            "it unpickles the store's bytes, which runs any code they hold"
            if name in RUNS_CODE
            else "it is not one of the codecs of numeric data dlscale reads"
        )
        raise DataError(
            f"{where}: variable {array!r} names the codec {name!r} in {key}, which dlscale refuses to decode: "
            f"{why}; write the store again with the compressors of numeric data ({', '.join(COMPRESSORS)}; "
            "xarray's to_zarr uses blosc or zstd)"
        )


def _codec_names(metadata: dict) -> Iterator[object]:
    """The name of every codec an array's metadata names (format 2 ``id``s, format 3 ``name``s)."""
    compressor = metadata.get("compressor")
    if compressor is not None:
        yield _codec_name(compressor, "id")
    for entry in _as_list(metadata.get("filters")):
        yield _codec_name(entry, "id")
    yield from _zarr3_codec_names(metadata.get("codecs"))


def _zarr3_codec_names(codecs: object) -> Iterator[object]:
    for codec in _as_list(codecs):
        yield _codec_name(codec, "name")
        configuration = codec.get("configuration") if isinstance(codec, dict) else None
        if isinstance(configuration, dict):  # sharding's chunks and index have codecs of their own
            yield from _zarr3_codec_names(configuration.get("codecs"))
            yield from _zarr3_codec_names(configuration.get("index_codecs"))


def _codec_name(entry: object, field: str) -> object:
    return entry.get(field) if isinstance(entry, dict) else entry


def _as_list(value: object) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def _parse(where: str, key: str, raw: bytes) -> Any:
    try:
        document = json.loads(raw)
    except RecursionError:
        raise DataError(_too_deep(where, key)) from None
    except ValueError as exc:  # UnicodeDecodeError and json.JSONDecodeError alike
        raise DataError(
            f"{where}: its metadata file {key} is not JSON ({exc}); not a zarr store, or damaged"
        ) from None
    if _nesting(document) > MAX_NESTING:
        raise DataError(_too_deep(where, key))
    if not isinstance(document, dict):
        raise DataError(
            f"{where}: its metadata file {key} is not a JSON object; not a zarr store, or damaged"
        )
    return document


def _too_deep(where: str, key: str) -> str:
    return (
        f"{where}: its metadata file {key} nests JSON more than {MAX_NESTING} levels deep, which dlscale does not "
        "read (zarr metadata and attributes are a few levels deep); remove the attribute that does"
    )


def _nesting(document: Any) -> int:
    """How deep lists and objects nest in ``document`` (without recursion; stops past MAX_NESTING)."""
    deepest, pending = 0, [(document, 1)]
    while pending:
        node, depth = pending.pop()
        if not isinstance(node, (dict, list)):
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_NESTING:
            break
        pending.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def _check_size(where: str, key: str, size: int) -> None:
    if size > MAX_METADATA_BYTES:
        raise DataError(
            f"{where}: its metadata file {key} is {size:,} bytes, more than the {MAX_METADATA_BYTES:,} dlscale reads "
            "(a store's metadata and attributes take kilobytes); remove the large attributes"
        )


def _is_directory(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False
