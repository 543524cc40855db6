"""Errors a user can fix. The CLI prints them as one clear message, without a traceback.

Every message names the file, key or value at fault and says what was expected instead. Each class carries the
exit status the CLI returns for it, so a batch script can tell the cases apart (docs/troubleshooting.md).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class DlscaleError(Exception):
    """Base class: bad input that the user can correct (config, data, checkpoint, launch)."""

    exit_code = 2


class ConfigError(DlscaleError):
    """A config file, section, key or value is wrong."""


class InvalidValue(ConfigError):
    """Raised by a component's config dataclass when one of its own fields is wrong.

    The component only knows the field name; the config loader catches this and re-raises a
    ConfigError that also names the YAML file and section, so the component stays free of file handling.
    """

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


class DataError(DlscaleError):
    """A data set on disk is missing, malformed, truncated or does not match the config."""


class CheckpointError(DlscaleError):
    """A checkpoint cannot be read, or does not fit the model or run it is loaded into."""


class ExportError(DlscaleError):
    """A model export cannot be written where asked, or an exported model's directory is incomplete or changed."""


class WorkloadError(DlscaleError):
    """A workload's own code failed or returned something dlscale cannot train on: an exception raised in the
    user's files (import, build_datasets, build_model, forward, loss, evaluator), or a pre-flight check
    (splits, sample types and dtypes, shapes, loss, evaluator summary). The message names the member and the
    user's file:line; ``details`` (the whole traceback, when there is one) goes to the run's out.log and is
    printed with ``--debug``."""

    def __init__(self, message: str, details: str = ""):
        super().__init__(message)
        self.message = message
        self.details = details
        self.logged_to: str | None = None  # the out.log that holds ``details``, once it is written there

    def __str__(self) -> str:
        if not self.details:
            return self.message
        where = f"the traceback is in {self.logged_to}" if self.logged_to else "--debug shows the traceback"
        return f"{self.message}; {where}"


class TrainingDiverged(DlscaleError):
    """The loss or the gradients became NaN or infinite and the divergence policy stopped the run."""

    exit_code = 3


class StorageError(DlscaleError):
    """A file or directory cannot be written: read-only, permission denied, not a directory, disk full, quota."""

    exit_code = 74  # EX_IOERR of sysexits.h


class RunDirectoryLocked(DlscaleError):
    """Another run holds the run directory; starting a second one there would corrupt both."""

    exit_code = 75  # EX_TEMPFAIL of sysexits.h: the same command works once the other run has ended


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """Return ``" (did you mean 'x'?)"`` for the closest candidate, or an empty string when none is close."""
    matches = difflib.get_close_matches(str(word), [str(c) for c in candidates], n=1, cutoff=0.5)
    return f" (did you mean {matches[0]!r}?)" if matches else ""


def config_location(source: str, name: str) -> str:
    """``file [config 'name']``: how messages name a config (its file and its section)."""
    return f"{source} [config {name!r}]"


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of ``exc``'s message, at most ``limit`` characters; its class's name when it has
    none."""
    lines = str(exc).strip().splitlines()
    return lines[0][:limit] if lines else type(exc).__name__


def exception_line(exc: BaseException, limit: int = 300) -> str:
    """``TypeName: first line of the message`` (the name alone when there is no message), at most ``limit``
    characters: a library's exception inside one of our one-line messages."""
    lines = str(exc).strip().splitlines()
    return (f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__)[:limit]
