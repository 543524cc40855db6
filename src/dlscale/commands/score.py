"""``dlscale score``: the Python API's :func:`dlscale.api.score` with the forecasts, truth and climatology the
command line names."""

from __future__ import annotations

import argparse

from dlscale.run.score_inputs import check_score_inputs


def check_score_command(args: argparse.Namespace) -> None:
    """``dlscale score``'s checks before torch is imported: the paths and labels (the API makes them again)."""
    check_score_inputs(
        [args.forecast, *args.compare], args.truth, args.climatology, args.out, args.channels, args.times
    )


def run_score(args: argparse.Namespace) -> int:
    """0 once the scores are printed and written; errors a user can fix are raised as DlscaleErrors."""
    from dlscale import api  # torch and the scoring code: after the early checks

    api.score(
        args.forecast,
        args.truth,
        climatology=args.climatology,
        out=args.out,
        compare=args.compare,
        figures=args.figures,
        channels=args.channels,
        times=args.times,
    )
    return 0
