"""The Python API's old argument order, still accepted: ``dlscale.train(workload, yaml_config, config, ...)``.

``dlscale.train``, ``bench`` and ``load_config`` took the workload first, and ``dlscale.tune`` took it last, by
keyword. They now all take ``(yaml_config, config, overrides, ..., workload=...)``. A call in the old order
still works and says how to write it (a DeprecationWarning, which Python shows once per calling line).

A call is in the old order when its first argument cannot be the YAML file: None (the config's own
workload), a workload object, or a name such as ``"heat2d"`` or ``"package.module:OBJECT"`` (no ``.yaml`` or
``.yml`` ending, no directory part, no such file); or when the YAML file is given after it, as the second
argument or by keyword.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from dlscale.config.yaml_source import YAML_SUFFIXES

Function = TypeVar("Function", bound=Callable[..., Any])


def names_yaml_file(value: Any) -> bool:
    """Whether ``value`` can only be a YAML file's path: a path object, or text ending in .yaml/.yml."""
    return isinstance(value, os.PathLike) or (isinstance(value, str) and value.endswith(YAML_SUFFIXES))


def names_workload(value: Any) -> bool:
    """Whether ``value``, as a first argument, is a workload rather than the YAML file."""
    if value is None or not isinstance(value, (str, os.PathLike)):
        return True  # None or a workload object: no file is either
    if not isinstance(value, str) or names_yaml_file(value):
        return False
    has_directory = "/" in value or os.sep in value
    return not has_directory and not Path(value).is_file()


def workload_first(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether positional ``args`` and keyword ``kwargs`` are a call in the old order."""
    if not args:
        return False
    if "yaml_config" in kwargs or (len(args) > 1 and names_yaml_file(args[1])):
        return True  # the YAML file comes after the first argument, which is then the workload
    return names_workload(args[0])


def accept_workload_first(function: Function) -> Function:
    """``function(yaml_config, config, ..., workload=...)`` that also takes the old order, with a warning."""
    name = function.__name__

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        if workload_first(args, kwargs):
            if "workload" in kwargs:
                raise TypeError(f"dlscale.{name}() got the workload twice: first and as workload=")
            warnings.warn(
                f"dlscale.{name}(workload, yaml_config, config, ...) is deprecated: the YAML file and the config "
                f"come first, the workload by keyword: dlscale.{name}(yaml_config, config, ..., workload=...)",
                DeprecationWarning,
                stacklevel=2,
            )
            kwargs["workload"] = args[0]
            args = args[1:]
        return function(*args, **kwargs)

    return call  # type: ignore[return-value]
