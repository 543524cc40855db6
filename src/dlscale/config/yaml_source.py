"""Reading named config sections from a YAML file.

A config file is a mapping of *section names* (``base``, ``short``, ``bs64_opt``...) to sections. A section
inherits from others with ``extends: base`` (or a list, merged left to right); YAML anchors with
``<<: *base`` work too. Both merge *deeply*: a child that sets ``optim: {lr: 1e-3}`` keeps the rest of its
parent's ``optim`` keys. (Plain YAML merge keys are shallow, which would silently reset every other key of a
nested mapping to its default; for nested configs that is never what the author meant.)

A parent may also be a config of another file: ``extends: ../configs/vit_era5.yaml:demo`` (``FILE:NAME``,
where FILE ends in ``.yaml`` or ``.yml``) names config ``demo`` of that file, found relative to the directory
of the file that holds the ``extends`` (else as ``--yaml_config`` would find it). Inside that file, names
refer to its own configs. A tuned file can so change a few keys of a config and inherit everything else.

Values are read with a safe loader that also reads ``5E-4`` and ``1e-3`` as numbers (YAML 1.1, and so plain
PyYAML, reads them as strings) and expands ``${VAR}`` / ``${VAR:-default}`` in strings.

An alias (``*name``) does not copy its anchor's value: it refers to it, so a file of a few lines can nest
aliases into a value of billions of items ("billion laughs"). Reading refuses a file whose values, with every
alias written out, would exceed :data:`MAX_EXPANDED_NODES`, and aliased values stay shared when resolved.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from dlscale.errors import ConfigError, did_you_mean

INHERIT_KEY = "extends"

# Real configs hold a few hundred values; a hundred thousand leaves room for long lists (e.g. of file names)
# while refusing an alias bomb long before it costs noticeable memory or time.
MAX_EXPANDED_NODES = 100_000

# YAML 1.2 floats: a mantissa with or without a dot, and an optional exponent with or without a sign.
_FLOAT_PATTERN = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
    re.X,
)
_ENV_PATTERN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ConfigLoader(yaml.SafeLoader):
    """A SafeLoader that reads ``5E-4`` as a float and merges ``<<`` keys deeply.

    The merge rule is dlscale's own, not the installed PyYAML's: PyYAML 6.0.4 changed which mapping of
    ``<<: [*a, *b]`` wins (and so the learning rate a config file trains with). Here, as in the YAML 1.1
    merge-key spec, the earlier mapping of a merge list wins over later ones, keys written in the mapping
    itself win over every merged one, and mappings found under the same key merge deeply.
    """

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        node.value = _deep_merge_node_pairs(_merge_key_pairs(node, set()), {})


MERGE_TAG = "tag:yaml.org,2002:merge"


def _merge_key_pairs(node: yaml.MappingNode, flattening: set[int]) -> list[tuple[yaml.Node, yaml.Node]]:
    """The pairs of ``node`` with its ``<<`` keys replaced by the pairs they merge, lowest priority first.

    The result is read "later wins" (by :func:`_deep_merge_node_pairs`): the merged mappings come first, the
    last of a merge list first of all, then the mapping's own keys. Each merged mapping is flattened first
    (in place, as PyYAML does, so an anchor is flattened once however often it is merged).
    """
    if id(node) in flattening:
        raise yaml.constructor.ConstructorError(
            "while merging a mapping", node.start_mark, "the mapping merges itself (<<: *name inside &name)"
        )
    merge_values = [value for key, value in node.value if key.tag == MERGE_TAG]
    if len(merge_values) > 1:
        raise yaml.constructor.ConstructorError(
            "while constructing a mapping",
            node.start_mark,
            "found more than one << merge key; write one list instead (<<: [*a, *b], the first one wins)",
            merge_values[1].start_mark,
        )
    merged: list[tuple[yaml.Node, yaml.Node]] = []
    if merge_values:
        value = merge_values[0]
        sources = value.value if isinstance(value, yaml.SequenceNode) else [value]
        flattening.add(id(node))
        for source in reversed(sources):  # the first mapping of the list wins: it comes last
            if not isinstance(source, yaml.MappingNode):
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"expected a mapping or a list of mappings for merging (<<), but found {source.id}",
                    source.start_mark,
                )
            source.value = _deep_merge_node_pairs(_merge_key_pairs(source, flattening), {})
            merged.extend(source.value)
        flattening.discard(id(node))
    own: list[tuple[yaml.Node, yaml.Node]] = []
    for key, value in node.value:
        if key.tag == MERGE_TAG:
            continue
        if (
            key.tag == "tag:yaml.org,2002:value"
        ):  # the YAML 1.1 "=" key, read as a plain string as PyYAML does
            key.tag = "tag:yaml.org,2002:str"
        own.append((key, value))
    return merged + own


MergedNodes = dict[tuple[int, int], yaml.MappingNode]

DEFAULT_YAML = "configs/vit_era5.yaml"  # what --yaml_config defaults to (found from any directory)


def _deep_merge_node_pairs(
    pairs: list[tuple[yaml.Node, yaml.Node]], merged_nodes: MergedNodes
) -> list[tuple[yaml.Node, yaml.Node]]:
    """After a ``<<`` merge, later pairs override earlier ones; merge them when both values are mappings.

    ``merged_nodes`` holds each merge of two mapping nodes made so far, by their ids: two anchors whose keys
    alias the same deeper anchors would otherwise be merged once per path through them, which grows
    exponentially with the depth of the aliases (a "billion laughs" through ``<<:``).
    """
    merged: dict[Any, tuple[yaml.Node, yaml.Node]] = {}
    order: list[Any] = []
    for key_node, value_node in pairs:
        key = key_node.value if isinstance(key_node, yaml.ScalarNode) else id(key_node)
        if key in merged:
            previous = merged[key][1]
            if (
                isinstance(previous, yaml.MappingNode)
                and isinstance(value_node, yaml.MappingNode)
                and previous is not value_node  # a mapping merged with itself is itself
            ):
                value_node = _merged_mapping_node(previous, value_node, merged_nodes)
        else:
            order.append(key)
        merged[key] = (key_node, value_node)
    return [merged[key] for key in order]


def _merged_mapping_node(
    previous: yaml.MappingNode, override: yaml.MappingNode, merged_nodes: MergedNodes
) -> yaml.MappingNode:
    # merged_nodes keeps both nodes alive (through the merged node's pairs), so their ids stay unique.
    identity = (id(previous), id(override))
    if identity not in merged_nodes:
        merged_nodes[identity] = yaml.MappingNode(
            override.tag,
            _deep_merge_node_pairs(previous.value + override.value, merged_nodes),
            previous.start_mark,
            override.end_mark,
            override.flow_style,
        )
    return merged_nodes[identity]


# Replace the YAML 1.1 float resolver with the YAML 1.2 one.
ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:float"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_PATTERN, list("-+0123456789."))


class ConfigDumper(yaml.SafeDumper):
    """A SafeDumper that quotes every string ConfigLoader would read back as something else (e.g. '1e-3')."""


ConfigDumper.yaml_implicit_resolvers = ConfigLoader.yaml_implicit_resolvers


def dump_yaml(document: Any) -> str:
    """YAML text that ConfigLoader reads back to ``document`` exactly (keys in their given order)."""
    return yaml.dump(document, Dumper=ConfigDumper, sort_keys=False)


def parse_yaml_value(text: str) -> Any:
    """Parse one command-line value the way the config file would (``5E-4`` -> 0.0005, ``[1, 2]`` -> list)."""
    try:
        return yaml.load(text, Loader=ConfigLoader)  # noqa: S506 - ConfigLoader is a SafeLoader
    except yaml.YAMLError as exc:
        raise ConfigError(f"cannot parse value {text!r}: {exc}") from None


SHIPPED_CONFIGS = Path(__file__).resolve().parent.parent / "configs"  # the repository's configs/, installed


def shipped_config_names() -> list[str]:
    """The config files that come with dlscale (``vit_era5.yaml``, ...)."""
    return sorted(p.name for p in SHIPPED_CONFIGS.glob("*.yaml"))


def locate_config_file(path: str | Path) -> Path:
    """``path`` if it exists; otherwise the shipped config file of that name (``configs/vit_era5.yaml`` or
    ``vit_era5.yaml`` work from any directory, also for an installed dlscale)."""
    path = Path(path).expanduser()
    if path.is_file():
        return path
    shipped = _shipped_candidate(path)
    if shipped is not None and shipped.is_file():
        return shipped
    raise ConfigError(
        f"config file {path} does not exist (pass --yaml_config with the path of a YAML file; "
        f"dlscale ships {', '.join(shipped_config_names())}, usable by name from any directory)"
    )


def _shipped_candidate(path: Path) -> Path | None:
    """The shipped config file that ``path`` may name (``vit_era5.yaml``, ``configs/vit_era5.yaml``), if any."""
    if path.is_absolute() or path.parent not in (Path("."), Path("configs")):
        return None
    return SHIPPED_CONFIGS / path.name


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a config file (see :func:`locate_config_file`): a mapping of section names to sections."""
    path = locate_config_file(path)
    try:
        with path.open() as handle:
            document = yaml.load(handle, Loader=ConfigLoader)  # noqa: S506 - ConfigLoader is a SafeLoader
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    _check_expanded_size(document, path)
    if not isinstance(document, dict) or not document:
        raise ConfigError(f"{path}: expected a mapping of config names (base, short, ...) to config sections")
    for name, section in document.items():
        if not isinstance(section, dict):
            raise ConfigError(
                f"{path}: config {name!r} must be a mapping of keys, got {type(section).__name__}"
            )
    return document


def _check_expanded_size(document: Any, source: str | Path) -> None:
    """Refuse a document that is huge once its aliases are written out, or that contains itself.

    PyYAML builds an alias as a second reference to its anchor's object, so the document is a graph. Its
    expanded size is summed with one visit per distinct object (memoized by id), which keeps this check
    linear in the size of the file however deeply aliases nest.
    """
    sizes: dict[int, int] = {}
    visiting: set[int] = set()

    def expanded_size(value: Any, key_path: tuple[str, ...]) -> int:
        if not isinstance(value, (dict, list)):
            return 1
        identity = id(value)
        if identity in sizes:
            return sizes[identity]
        if identity in visiting:
            where = ".".join(key_path) or "the top level"
            raise ConfigError(
                f"{source}: a YAML alias refers to itself (at {where}: an alias *name inside the value of its "
                "own anchor &name, e.g. `a: &a [*a]`, makes a value that contains itself, without end)"
            )
        visiting.add(identity)
        items = value.items() if isinstance(value, dict) else enumerate(value)
        total = 1
        for key, item in items:
            total += expanded_size(item, (*key_path, str(key)))
            if total > MAX_EXPANDED_NODES:
                raise ConfigError(
                    f"{source}: expands to more than {MAX_EXPANDED_NODES} values through YAML aliases "
                    f"(*name references to an &name anchor), at {'.'.join(key_path) or 'the top level'}; "
                    "a config file this large is almost certainly an alias bomb or a mistake"
                )
        visiting.discard(identity)
        sizes[identity] = total
        return total

    expanded_size(document, ())


Normalizer = Callable[[dict[str, Any], str, str | Path], dict[str, Any]]

# A parent `FILE:NAME` names a config of another file when FILE ends so; a same-file name never does.
YAML_SUFFIXES = (".yaml", ".yml")


def resolve_section(
    document: dict[str, Any], name: str, source: str | Path, normalize: Normalizer | None = None
) -> dict[str, Any]:
    """Return config ``name`` with its ``extends`` chain merged in (deeply) and ``${VAR}`` expanded.

    ``normalize(section, config_name, source)`` rewrites each config's own keys before it is merged with its
    parents (the run config uses it to put flat tutorial-style keys into their sections, so that a child may
    override a parent's key whichever style either is written in); ``source`` is the file that config is
    written in, which differs from this ``source`` for a parent ``FILE:NAME`` of another file.

    A value reached through several YAML aliases is one shared object in the result, as in the file: copy
    it before changing it in place.
    """
    if name not in document:
        raise ConfigError(
            f"{source}: no config named {name!r}{did_you_mean(name, document)}; it has: {', '.join(document)}"
        )
    resolver = _Resolver(normalize or (lambda section, _name, _source: section))
    merged = resolver.resolve(resolver.add(source, document), name, ())
    return _expand_env(merged, source, name)


_Link = tuple[Path, str]  # a config: its file (resolved, absolute) and its name


class _Resolver:
    """One resolution of a config: the files read so far, each once, by resolved path."""

    def __init__(self, normalize: Normalizer) -> None:
        self.normalize = normalize
        # resolved path -> (how messages name the file, its document)
        self.files: dict[Path, tuple[str | Path, dict[str, Any]]] = {}

    def add(self, source: str | Path, document: dict[str, Any]) -> Path:
        """Register an already-read file; its key is its resolved path (so that two spellings are one file)."""
        key = Path(source).resolve()
        self.files.setdefault(key, (source, document))
        return key

    def resolve(self, key: Path, name: str, chain: tuple[_Link, ...]) -> dict[str, Any]:
        source, document = self.files[key]
        if (key, name) in chain:
            raise ConfigError(
                f"{source}: configs inherit in a cycle: {self._describe((*chain, (key, name)))}"
            )
        section = copy.deepcopy(document[name])
        parents = section.pop(INHERIT_KEY, [])
        if isinstance(parents, str):
            parents = [parents]
        if not isinstance(parents, list) or not all(isinstance(p, str) for p in parents):
            raise ConfigError(
                f"{source}: config {name!r}: '{INHERIT_KEY}' must be a config name or a list of names"
            )
        merged: dict[str, Any] = {}
        for parent in parents:
            parent_key, parent_name = self._parent(key, name, parent)
            merged = deep_merge(merged, self.resolve(parent_key, parent_name, (*chain, (key, name))))
        return deep_merge(merged, self.normalize(section, name, source))

    def _describe(self, chain: tuple[_Link, ...]) -> str:
        """``a -> b -> a`` within one file; ``a.yaml:x -> b.yaml:y -> a.yaml:x`` across files."""
        if len({key for key, _ in chain}) == 1:
            return " -> ".join(name for _, name in chain)
        return " -> ".join(f"{self.files[key][0]}:{name}" for key, name in chain)

    def _parent(self, key: Path, name: str, parent: str) -> _Link:
        """The config that ``parent`` (in config ``name`` of file ``key``) refers to."""
        source, document = self.files[key]
        file_part, sep, parent_name = parent.rpartition(":")
        if not (sep and file_part.endswith(YAML_SUFFIXES)):
            if parent not in document:
                raise ConfigError(
                    f"{source}: config {name!r} extends {parent!r}, which is not defined"
                    f"{did_you_mean(parent, document)}"
                )
            return key, parent
        other_key = self._read(source, name, parent, file_part)
        other_source, other_document = self.files[other_key]
        if parent_name not in other_document:
            raise ConfigError(
                f"{source}: config {name!r} extends {parent!r}: {other_source} has no config named "
                f"{parent_name!r}{did_you_mean(parent_name, other_document)}; it has: {', '.join(other_document)}"
            )
        return other_key, parent_name

    def _read(self, source: str | Path, name: str, parent: str, file_part: str) -> Path:
        """Find and read (once) the file ``file_part`` that config ``name`` of ``source`` refers to."""
        relative = Path(file_part).expanduser()
        beside = Path(source).parent / relative  # relative to the including file, wherever we run from
        if beside.is_file():
            path = beside
        else:
            try:
                path = locate_config_file(relative)
            except ConfigError:
                places = [str(Path(source).parent.resolve())]
                if not relative.is_absolute():
                    places.append(f"the current directory {Path.cwd()}")
                if _shipped_candidate(relative) is not None:
                    places.append(f"dlscale's shipped configs {SHIPPED_CONFIGS}")
                raise ConfigError(
                    f"{source}: config {name!r} extends {parent!r}: no such file (looked in "
                    f"{', '.join(places[:-1])}{' and ' if len(places) > 1 else ''}{places[-1]})"
                ) from None
        key = path.resolve()
        if key not in self.files:
            self.files[key] = (key, read_config_file(key))
        return key


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Merge ``override`` into a copy of ``base``; nested mappings merge, everything else is replaced."""
    result = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = deep_merge(result[key], value)
        else:
            result[key] = value
    return result


def _expand_env(document: dict[str, Any], source: str | Path, section: str) -> dict[str, Any]:
    """``document`` with ``${VAR}`` expanded in every string (a new document; the input is not changed).

    Each distinct dict and list is expanded once (memoized by id), so a value reached through several YAML
    aliases stays one shared object rather than one copy per alias; an error names the key path where the
    value was reached first.
    """
    expanded: dict[int, Any] = {}

    def expand(value: Any, path: str) -> Any:
        if isinstance(value, (dict, list)) and id(value) in expanded:
            return expanded[id(value)]
        # Each copy is registered before its items are expanded, so that a value containing itself ends too.
        if isinstance(value, dict):
            mapping: dict[Any, Any] = {}
            expanded[id(value)] = mapping
            for key, item in value.items():
                mapping[key] = expand(item, f"{path}.{key}" if path else str(key))
            return mapping
        if isinstance(value, list):
            items: list[Any] = []
            expanded[id(value)] = items
            items.extend(expand(item, path) for item in value)
            return items
        if not isinstance(value, str) or "${" not in value:
            return value
        return _ENV_PATTERN.sub(lambda match: _substitute(match, source, section, path), value)

    return expand(document, "")


def _substitute(match: re.Match[str], source: str | Path, section: str, path: str) -> str:
    variable, default = match.group(1), match.group(2)
    value = os.environ.get(variable)
    if value or (value is not None and default is None):
        return value
    if default is not None:  # as in the shell, ${VAR:-default} also replaces a variable set to ""
        return default
    raise ConfigError(
        f"{source}: config {section!r}, key {path}: environment variable {variable} is not set "
        f"(set it, or write ${{{variable}:-default}} in the file)"
    )
