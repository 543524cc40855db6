"""The ``torch.export`` program of an exported model: a graph of ATen operations with the weights inside, which
``torch.export.load`` runs in a process that has torch and nothing of dlscale.

The batch dimension is left free (``torch.export.Dim``), so the program takes any batch size; a model whose code
fixes it is exported for the example's batch size instead. A model that torch.export cannot trace (data-dependent
control flow, an operation it cannot capture) gets no program: the export says why, once, and goes on (the
weights and ``dlscale.load_model`` do not need it).
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from dlscale.errors import exception_line

log = logging.getLogger(__name__)


def export_program(model: torch.nn.Module, example: torch.Tensor, path: Path) -> dict[str, Any]:
    """Write ``model``'s torch.export program for inputs like ``example`` (a batch) to ``path``.

    Returns the manifest's ``program`` entry: ``{"file": ..., "batch": "any" | N, "matches_model": bool}``, where
    ``matches_model`` says whether the program, loaded back from ``path``, gives the model's outputs on
    ``example`` bit for bit; or ``{"file": None, "skipped": reason}`` when the model does not export.
    """
    attempts = (("any", ({0: torch.export.Dim("batch")},)), (int(example.shape[0]), None))
    program, batch, reasons = None, None, []
    for batch, dynamic_shapes in attempts:  # noqa: B007 - the batch of the attempt that works is kept
        try:
            with _quiet_torch():
                program = torch.export.export(model, (example,), dynamic_shapes=dynamic_shapes)
            break
        # torch.export raises many kinds (UserError, Unsupported, GuardOnDataDependentSymNode, ...)
        except Exception as exc:
            reasons.append(exception_line(exc))
    if program is None:
        reason = f"torch.export cannot export {type(model).__name__} ({reasons[-1]})"
        log.warning(
            "dlscale export: no model.pt2: %s; the weights and dlscale.load_model do not need it", reason
        )
        return {"file": None, "skipped": reason}
    torch.export.save(program, path)
    loaded = torch.export.load(path)
    with torch.no_grad():
        expected = model(example)
        actual = loaded.module()(example)
    return {"file": path.name, "batch": batch, "matches_model": _identical(actual, expected)}


@contextlib.contextmanager
def _quiet_torch() -> Iterator[None]:
    """Without torch's warnings, log lines and prints: a model that does not export makes torch log and print
    its traced graph several times over, where the export says why in one line."""
    drop_all = logging.Filter("no record passes: a filter on a name no logger has")
    handlers = logging.getLogger("torch").handlers  # where torch's own loggers write (they do not propagate)
    loggers = [
        logging.getLogger(n) for n in list(logging.root.manager.loggerDict) if n.split(".")[0] == "torch"
    ]
    disabled = [logger.disabled for logger in loggers]
    for handler in handlers:
        handler.addFilter(drop_all)
    for logger in loggers:
        logger.disabled = True
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, was in zip(loggers, disabled, strict=True):
            logger.disabled = was
        for handler in handlers:
            handler.removeFilter(drop_all)


def _identical(actual: Any, expected: Any) -> bool:
    if isinstance(expected, torch.Tensor):
        return (
            isinstance(actual, torch.Tensor)
            and actual.dtype == expected.dtype
            and torch.equal(actual, expected)
        )
    if isinstance(expected, (tuple, list)):
        return (
            isinstance(actual, (tuple, list))
            and len(actual) == len(expected)
            and all(_identical(a, e) for a, e in zip(actual, expected, strict=True))
        )
    return actual == expected
