"""Exceptions raised in a workload's own code: one line naming the member, the exception and the user's
file:line, instead of a traceback through dlscale.

The rule that tells a user's mistake from a bug of dlscale's: of the exception's traceback, take the innermost
frame that lies either in the workload's own files or in dlscale's. Frames of other libraries (torch, numpy,
the standard library) are skipped, so a torch error inside the user's ``forward`` is the user's line that
called torch. When that frame is the workload's, the exception becomes a one-line
:class:`~dlscale.errors.WorkloadError` (exit 2) whose ``details`` hold the whole traceback (the run's
out.log, and ``--debug``); when it is dlscale's (dlscale's own code, or a dlscale helper the workload
called), or when no frame is either, the exception keeps its traceback: that is a bug of dlscale's.

A :class:`SyntaxError` (``IndentationError``, ``TabError``) is the exception to the rule: the compiler raises
it while importing a file, and no frame of that file exists yet. Its own ``filename`` and ``lineno`` decide
instead: a file of the workload's is the user's mistake at that line, even when it is a module that the
workload's module imports; a file of dlscale's keeps the traceback; any other file (``<string>`` of an
``eval``, a library's) leaves the decision to the frames.

The workload's own files: the directory of the top-level package whose module defines the workload's class
(so the data set and model modules beside it count too); for a workload in a top-level module (a file on
``PYTHONPATH``), that module's directory, or the file alone when the directory is a library directory
(``site-packages``). Library directories below it (a ``.venv`` beside the module) are not the workload's. A
workload inside dlscale (the built-in ones) has no files of its own: its exceptions are dlscale's.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import os
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from dlscale.errors import DlscaleError, WorkloadError, exception_line

DLSCALE_DIRECTORY = Path(__file__).resolve().parents[1]
LIBRARY_DIRECTORIES = frozenset({"site-packages", "dist-packages"})


@dataclass(frozen=True)
class WorkloadFiles:
    """The files that are a workload's own code: everything under ``root`` (or ``root`` alone when
    ``single_file``); ``root`` None for a workload that has none (one of dlscale's)."""

    root: Path | None
    single_file: bool = False

    def contain(self, filename: str) -> bool:
        if self.root is None or not filename or filename.startswith("<"):
            return False
        path = Path(filename).resolve()
        if is_dlscale_file(path):
            return False
        if self.single_file:
            return path == self.root
        if not path.is_relative_to(self.root):
            return False
        return not LIBRARY_DIRECTORIES & set(path.relative_to(self.root).parts)


def is_dlscale_file(path: Path) -> bool:
    return path.is_relative_to(DLSCALE_DIRECTORY)


def files_of_module(module_name: str) -> WorkloadFiles:
    """The files of the workload whose class is defined in ``module_name`` (see the module docstring)."""
    top_level = module_name.split(".")[0]
    if top_level == "dlscale":
        return WorkloadFiles(None)
    module = sys.modules.get(top_level)
    origin = getattr(module, "__file__", None) if module is not None else None
    if origin is None:
        with contextlib.suppress(ImportError, ValueError):
            spec = importlib.util.find_spec(top_level)
            origin = spec.origin if spec is not None else None
    if not origin or not os.path.isfile(origin):
        return WorkloadFiles(None)  # a notebook's __main__, a namespace package: no files to point at
    path = Path(origin).resolve()
    if path.name == "__init__.py":
        return WorkloadFiles(path.parent)
    if LIBRARY_DIRECTORIES & set(path.parent.parts):
        return WorkloadFiles(path, single_file=True)
    return WorkloadFiles(path.parent)


def files_of_workload(workload: Any) -> WorkloadFiles:
    """The files of ``workload``'s own code (an object wrapped with the defaults is looked at inside)."""
    inner = getattr(workload, "inner", workload)
    return files_of_module(type(inner).__module__)


def shown_path(filename: str) -> str:
    """A path as messages show it: relative to the working directory when it lies below it."""
    path = Path(filename)
    with contextlib.suppress(ValueError):
        return str(path.resolve().relative_to(Path.cwd()))
    return filename


def location(function: Any) -> str | None:
    """``file:line`` where ``function`` (a function, a bound method, a class) is defined; None for built-ins."""
    function = getattr(function, "__func__", function)
    with contextlib.suppress(TypeError, OSError):
        filename = inspect.getsourcefile(function)
        if filename is None:
            return None
        if isinstance(function, type):
            return f"{shown_path(filename)}:{inspect.getsourcelines(function)[1]}"
        return f"{shown_path(filename)}:{function.__code__.co_firstlineno}"
    return None


def location_in(function: Any, files: WorkloadFiles) -> str | None:
    """:func:`location` of ``function`` when it is defined in the workload's ``files``, else None (a torch
    class such as ``nn.Sequential``, a ``list``)."""
    with contextlib.suppress(TypeError, OSError):
        filename = inspect.getsourcefile(getattr(function, "__func__", function))
        if filename is not None and files.contain(filename):
            return location(function)
    return None


def member_location(workload: Any, member: str) -> str:
    """`` (file:line)`` of a workload member's definition, or "" when it has none (a built-in, a lambda's
    source that cannot be found)."""
    where = location(getattr(workload, member, None))
    return f" ({where})" if where else ""


def _innermost_decisive_frame(tb: TracebackType | None, files: WorkloadFiles) -> tuple[bool, Any] | None:
    """(whether it is the workload's, the frame) for the innermost frame in the workload's or dlscale's files."""
    frames = []
    while tb is not None:
        frames.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    for frame, line in reversed(frames):
        filename = frame.f_code.co_filename
        if files.contain(filename):
            return True, (frame, line)
        if filename and not filename.startswith("<") and is_dlscale_file(Path(filename).resolve()):
            return False, (frame, line)
    return None


def error_from_user_code(
    exc: BaseException, workload_name: str, member: str | None, files: WorkloadFiles
) -> WorkloadError | None:
    """The one-line error for ``exc`` raised while dlscale called ``member`` of the workload, or None when the
    rule of the module docstring makes it dlscale's (it then keeps its traceback)."""
    if isinstance(exc, SyntaxError) and exc.filename and not exc.filename.startswith("<"):
        if files.contain(exc.filename):
            return _syntax_error_in_user_file(exc, workload_name, member)
        if is_dlscale_file(Path(exc.filename).resolve()):
            return None
    decisive = _innermost_decisive_frame(exc.__traceback__, files)
    if decisive is None or not decisive[0]:
        return None
    frame, line = decisive[1]
    code = frame.f_code
    function = getattr(code, "co_qualname", code.co_name)
    what = member if member is not None else function
    message = (
        f"workload {workload_name!r}: {what} raised {exception_line(exc)} "
        f"(at {shown_path(code.co_filename)}:{line}, in {function})"
    )
    return WorkloadError(message, "".join(traceback.format_exception(exc)))


# The offending line is quoted in the one-line error up to this length (a longer one is in the traceback).
QUOTED_LINE_LIMIT = 80


def _syntax_error_in_user_file(exc: SyntaxError, workload_name: str, member: str | None) -> WorkloadError:
    """``... raised SyntaxError: invalid syntax (at mine.py:2, column 7: 'def f(:')``: the place the compiler
    gives, since no frame of the file is in the traceback."""
    where = shown_path(str(exc.filename))
    if exc.lineno:
        where += f":{exc.lineno}"
        if exc.offset:
            where += f", column {exc.offset}"
    quoted = (exc.text or "").strip()
    if quoted and len(quoted) <= QUOTED_LINE_LIMIT:
        where += f": {quoted!r}"
    what = member if member is not None else "its code"
    message = f"workload {workload_name!r}: {what} raised {type(exc).__name__}: {exc.msg} (at {where})"
    return WorkloadError(message, "".join(traceback.format_exception(exc)))


@contextlib.contextmanager
def raised_by_workload(workload: Any, member: str | None) -> Iterator[None]:
    """Turn an exception raised in the workload's own code inside the block into a one-line WorkloadError
    naming ``member`` (None: named by the user's function the traceback ends in). DlscaleErrors (a user's
    data set may raise them too) and dlscale's own bugs pass unchanged."""
    try:
        yield
    except (DlscaleError, KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:
        name = getattr(workload, "name", None) or type(workload).__name__
        error = error_from_user_code(exc, name, member, files_of_workload(workload))
        if error is None:
            raise
        raise error from exc
