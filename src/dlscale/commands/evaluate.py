"""``dlscale evaluate``: the Python API's :func:`dlscale.api.evaluate` with the run or checkpoint the command line
names."""

from __future__ import annotations

import argparse

from dlscale import api


def run_evaluate(args: argparse.Namespace) -> int:
    """0 once the metrics are printed and written; errors a user can fix are raised as DlscaleErrors."""
    api.evaluate(args.target, args.split, args.checkpoint, args.set)
    return 0
