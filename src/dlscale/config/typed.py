"""Typed config sections: turn a YAML mapping into a component's dataclass, or say exactly what is wrong.

Each component owns a ``@dataclass`` of its keys. This module checks names and types against the dataclass's
annotations (bool, int, float, str, ``X | None``, ``tuple[int, int]``, ``list[str]``, ``Literal[...]``) and
then calls the dataclass, whose ``__post_init__`` checks meaning and raises
:class:`~dlscale.errors.InvalidValue`. Every error names the file, the config and the dotted key.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, Union

from dlscale.errors import ConfigError, InvalidValue, did_you_mean

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}
_NONE = {"none", "null", "~", ""}


def field_types(cls: type) -> dict[str, Any]:
    """The resolved type annotation of every field of dataclass ``cls``."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def check_section_class(cls: type, section: str, owner: str) -> None:
    """ConfigError unless every field of ``cls`` (``owner``'s ``section:`` dataclass) has a type a config
    value can be read as, and a default (a section may be left out of a config)."""
    try:
        types_by_name = field_types(cls)
    except Exception as exc:  # any failure to resolve an annotation: the user's module, not dlscale
        raise ConfigError(
            f"{owner}: the annotations of {cls.__qualname__} ({section}: section) cannot be resolved: {exc}"
        ) from None
    for field in dataclasses.fields(cls):
        if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError(
                f"{owner}: {section}.{field.name} ({cls.__qualname__}) has no default; give every field of a "
                "config section a default"
            )
        if not _readable(types_by_name[field.name]):
            raise ConfigError(
                f"{owner}: {section}.{field.name} ({cls.__qualname__}) has the type "
                f"{types_by_name[field.name]!r}, which a config value cannot be read as; use bool, int, float, "
                "str, X | None, tuple[...], list[...] or Literal[...]"
            )


def _readable(annotation: Any) -> bool:
    """True for the annotations :func:`coerce` converts values to."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType, tuple, list):
        return all(a is Ellipsis or a is type(None) or _readable(a) for a in typing.get_args(annotation))
    return origin is Literal or annotation in (bool, int, float, str, Any)


def build_section(cls: type, values: dict[str, Any], where: str, section: str) -> Any:
    """Build dataclass ``cls`` from ``values``; ``where`` says which file and config they came from."""
    types_by_name = field_types(cls)
    kwargs = {}
    for key, value in values.items():
        if key not in types_by_name:
            raise ConfigError(
                f"{where}: unknown key {section}.{key}{did_you_mean(key, types_by_name)}; "
                f"valid keys of '{section}': {', '.join(types_by_name)}"
            )
        kwargs[key] = coerce(value, types_by_name[key], f"{where}: {section}.{key}")
    try:
        return cls(**kwargs)
    except InvalidValue as exc:
        raise ConfigError(f"{where}: {section}.{exc.key}: {exc.message}") from None


def coerce(value: Any, annotation: Any, where: str) -> Any:
    """Return ``value`` converted to ``annotation``, or raise ConfigError naming ``where``."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        if type(None) in args and (
            value is None or (isinstance(value, str) and value.strip().lower() in _NONE)
        ):
            return None
        if len(members) == 1:
            return coerce(value, members[0], where)
        for member in members:  # e.g. `int | str`: first member that accepts the value wins
            try:
                return coerce(value, member, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where}: expected {describe(annotation)}, got {value!r}")
    if origin is Literal:
        choices = list(args)
        if value in choices:
            return value
        text = str(value).strip()
        if text in [str(c) for c in choices]:
            return choices[[str(c) for c in choices].index(text)]
        raise ConfigError(
            f"{where}: {value!r} is not one of {', '.join(map(str, choices))}{did_you_mean(text, map(str, choices))}"
        )
    if origin in (tuple, list):
        return _coerce_sequence(value, annotation, origin, args, where)
    if annotation is bool:
        return _coerce_bool(value, where)
    if annotation is int:
        return _coerce_int(value, where)
    if annotation is float:
        return _coerce_float(value, where)
    if annotation is str:
        if isinstance(value, str):
            return value
        raise ConfigError(
            f"{where}: expected a string, got {value!r} ({type(value).__name__}); put it in quotes, e.g. '{value}'"
        )
    if annotation is Any:
        return value
    raise TypeError(
        f"{where}: unsupported config annotation {annotation!r}"
    )  # a dlscale bug, not a user error


def _coerce_bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ConfigError(f"{where}: expected true or false, got {value!r}")


def _coerce_int(value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        text = value.strip().replace("_", "")
        try:
            return int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                number = None
            if number is not None and number.is_integer():
                return int(number)
    raise ConfigError(f"{where}: expected an integer, got {value!r}")


def _coerce_float(value: Any, where: str) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip().replace("_", ""))
        except ValueError:
            pass
    raise ConfigError(f"{where}: expected a number, got {value!r}")


def _coerce_sequence(value: Any, annotation: Any, origin: type, args: tuple, where: str) -> Any:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise ConfigError(f"{where}: expected {describe(annotation)}, got {value!r}")
    if origin is tuple and args and args[-1] is not Ellipsis:
        if len(value) != len(args):
            raise ConfigError(f"{where}: expected {describe(annotation)} ({len(args)} values), got {value!r}")
        return tuple(coerce(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True)))
    item_type = args[0] if args else Any
    items = [coerce(v, item_type, f"{where}[{i}]") for i, v in enumerate(value)]
    return tuple(items) if origin is tuple else items


def describe(annotation: Any) -> str:
    """A human description of a field type, for error messages and ``dlscale config --keys``."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (Union, types.UnionType):
        return " or ".join("null" if a is type(None) else describe(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(map(str, args))
    if origin is tuple and args and args[-1] is not Ellipsis:
        return "a list [" + ", ".join(describe(a) for a in args) + "]"
    if origin in (tuple, list):
        return f"a list of {describe(args[0]) if args else 'values'}"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(
        annotation, getattr(annotation, "__name__", str(annotation))
    )


def section_to_dict(instance: Any) -> dict[str, Any]:
    """A dataclass section as plain YAML-friendly values (tuples become lists)."""

    def plain(value: Any) -> Any:
        if isinstance(value, (tuple, list)):
            return [plain(v) for v in value]
        return value

    return {f.name: plain(getattr(instance, f.name)) for f in dataclasses.fields(instance)}
