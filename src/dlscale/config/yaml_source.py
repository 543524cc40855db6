"""Reading named config sections from a YAML file.

A config file is a mapping of *section names* (``base``, ``short``, ``bs64_opt``...) to sections. A section
inherits from others with ``extends: base`` (or a list, merged left to right); YAML anchors with
``<<: *base`` work too. Both merge *deeply*: a child that sets ``optim: {lr: 1e-3}`` keeps the rest of its
parent's ``optim`` keys. (Plain YAML merge keys are shallow, which would silently reset every other key of a
nested mapping to its default; for nested configs that is never what the author meant.)

Values are read with a safe loader that also reads ``5E-4`` and ``1e-3`` as numbers (YAML 1.1, and so plain
PyYAML, reads them as strings) and expands ``${VAR}`` / ``${VAR:-default}`` in strings.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from dlscale.config.suggest import did_you_mean
from dlscale.errors import ConfigError

INHERIT_KEY = "extends"

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
    """A SafeLoader that reads ``5E-4`` as a float and merges ``<<`` keys deeply."""

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        super().flatten_mapping(node)
        node.value = _deep_merge_node_pairs(node.value)


def _deep_merge_node_pairs(pairs: list[tuple[yaml.Node, yaml.Node]]) -> list[tuple[yaml.Node, yaml.Node]]:
    """After a ``<<`` merge, later pairs override earlier ones; merge them when both values are mappings."""
    merged: dict[Any, tuple[yaml.Node, yaml.Node]] = {}
    order: list[Any] = []
    for key_node, value_node in pairs:
        key = key_node.value if isinstance(key_node, yaml.ScalarNode) else id(key_node)
        if key in merged:
            previous = merged[key][1]
            if isinstance(previous, yaml.MappingNode) and isinstance(value_node, yaml.MappingNode):
                value_node = yaml.MappingNode(
                    value_node.tag,
                    _deep_merge_node_pairs(previous.value + value_node.value),
                    previous.start_mark,
                    value_node.end_mark,
                    value_node.flow_style,
                )
        else:
            order.append(key)
        merged[key] = (key_node, value_node)
    return [merged[key] for key in order]


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
    shipped = SHIPPED_CONFIGS / path.name
    if not path.is_absolute() and path.parent in (Path("."), Path("configs")) and shipped.is_file():
        return shipped
    raise ConfigError(
        f"config file {path} does not exist (pass --yaml_config with the path of a YAML file; "
        f"dlscale ships {', '.join(shipped_config_names())}, usable by name from any directory)"
    )


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a config file (see :func:`locate_config_file`): a mapping of section names to sections."""
    path = locate_config_file(path)
    try:
        with path.open() as handle:
            document = yaml.load(handle, Loader=ConfigLoader)  # noqa: S506 - ConfigLoader is a SafeLoader
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(document, dict) or not document:
        raise ConfigError(f"{path}: expected a mapping of config names (base, short, ...) to config sections")
    for name, section in document.items():
        if not isinstance(section, dict):
            raise ConfigError(
                f"{path}: config {name!r} must be a mapping of keys, got {type(section).__name__}"
            )
    return document


Normalizer = Callable[[dict[str, Any], str], dict[str, Any]]


def resolve_section(
    document: dict[str, Any], name: str, source: str | Path, normalize: Normalizer | None = None
) -> dict[str, Any]:
    """Return config ``name`` with its ``extends`` chain merged in (deeply) and ``${VAR}`` expanded.

    ``normalize(section, config_name)`` rewrites each config's own keys before it is merged with its parents
    (the run config uses it to put flat tutorial-style keys into their sections, so that a child may override
    a parent's key whichever style either is written in).
    """
    if name not in document:
        raise ConfigError(
            f"{source}: no config named {name!r}{did_you_mean(name, document)}; it has: {', '.join(document)}"
        )
    merged = _resolve(document, name, source, (), normalize or (lambda section, _: section))
    return _expand_env(merged, source, name, path="")


def _resolve(
    document: dict[str, Any], name: str, source: str | Path, chain: tuple[str, ...], normalize: Normalizer
) -> dict[str, Any]:
    if name in chain:
        raise ConfigError(f"{source}: configs inherit in a cycle: {' -> '.join((*chain, name))}")
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
        if parent not in document:
            raise ConfigError(
                f"{source}: config {name!r} extends {parent!r}, which is not defined{did_you_mean(parent, document)}"
            )
        merged = deep_merge(merged, _resolve(document, parent, source, (*chain, name), normalize))
    return deep_merge(merged, normalize(section, name))


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Merge ``override`` into a copy of ``base``; nested mappings merge, everything else is replaced."""
    result = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = deep_merge(result[key], value)
        else:
            result[key] = value
    return result


def _expand_env(value: Any, source: str | Path, section: str, path: str) -> Any:
    if isinstance(value, dict):
        return {
            k: _expand_env(v, source, section, f"{path}.{k}" if path else str(k)) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_expand_env(v, source, section, path) for v in value]
    if not isinstance(value, str) or "${" not in value:
        return value

    def substitute(match: re.Match[str]) -> str:
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

    return _ENV_PATTERN.sub(substitute, value)
