"""``dlscale forecast``: the Python API's :func:`dlscale.api.forecast` with the run or checkpoint the command line
names."""

from __future__ import annotations

import argparse

from dlscale import api


def run_forecast(args: argparse.Namespace) -> int:
    """0 once the scores are printed and written; errors a user can fix are raised as DlscaleErrors."""
    api.forecast(
        args.target,
        split=args.split,
        lead=args.lead,
        init=args.init,
        init_count=args.init_count,
        batch_size=args.batch_size,
        write=args.write,
        names=args.names or "wb2",
        climatology=args.climatology,
        members=args.members,
        perturb=args.perturb,
        figures=args.figures,
        checkpoint=args.checkpoint,
        overrides=args.set,
    )
    return 0
