"""The process group's lifecycle around one command's work on every rank (train and bench share it)."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from dlscale.errors import DlscaleError
from dlscale.runtime.device import Device
from dlscale.runtime.distributed import (
    collective_failure_line,
    process_group_running,
    share_from_main,
    share_text_from_main,
    start_process_group,
    stop_process_group,
)
from dlscale.runtime.launch import ProcessInfo
from dlscale.runtime.strict_json import to_json


@dataclass
class RankEnding:
    """How this rank leaves: ``alike`` when every rank ends at the same point (then they wait for each other
    at a last barrier; after one rank's own failure there is none, since the others may never reach it)."""

    alike: bool = False


@contextlib.contextmanager
def distributed_run(process: ProcessInfo, device: Device, timeout_s: float) -> Iterator[RankEnding]:
    """Start the process group (one rank: nothing to start), run the body, and stop it again.

    The body sets ``ending.alike`` once every rank is known to leave at the same point. The barrier then keeps
    rank 0, which hosts the rendezvous store, alive until every rank has left: a rank still leaving when rank
    0's process exits can wait for the store until the timeout.
    """
    # A command that runs several runs in one group (``dlscale tune`` trains and benches inside its own) keeps
    # it: only the run that started the group stops it.
    owner = not process_group_running()
    ending = RankEnding()
    try:
        # inside: a connection refused while the group starts is a rank's line too
        start_process_group(process, device, timeout_s)
        yield ending
    except Exception as exc:
        line = collective_failure_line(exc, process.rank) if not isinstance(exc, DlscaleError) else None
        if line is None:
            raise
        # A hang, a lost rank or a refused connection: one line per rank (its console and its log file), instead
        # of a traceback.
        logging.getLogger("dlscale.distributed").error("%s", line)
        failure = DlscaleError(line)
        failure.exit_code = 1  # like any crash: torchrun and srun both report 1
        failure.quiet = True  # the line is already logged
        raise failure from exc
    finally:
        if owner:
            stop_process_group(wait_for_others=ending.alike)


def written_on_rank_0(
    process: ProcessInfo, device: Device, document: dict[str, Any], write: Callable[[], None], what: str
) -> dict[str, Any]:
    """Rank 0 runs ``write`` (the files of ``document``, which it may complete); a user's error there
    (a DlscaleError) is raised on every rank, any other ends the other ranks with a line naming ``what`` and rank 0
    with its traceback. Rank 0's document, as strict JSON reads it back (NaN is None), on every rank."""
    problem = None
    if process.is_main:
        try:
            write()
        except DlscaleError as exc:
            problem = exc
        except Exception as exc:
            # The other ranks wait for rank 0's word: they end with a line, and rank 0 with its traceback.
            share_from_main(DlscaleError(f"rank 0 could not write the {what}: {exc}"), device)
            raise
    problem = share_from_main(problem, device)
    if problem is not None:
        raise problem
    shared = share_text_from_main(to_json(document) if process.is_main else None, device)
    return json.loads(shared if shared is not None else to_json(document))
