"""``dlscale train``: the Python API's :func:`dlscale.api.train` with the config the command line names;
with ``--dry_run``, only the pre-flight check and one timed step (:mod:`dlscale.run.dry_run`)."""

from __future__ import annotations

import argparse

from dlscale import api
from dlscale.commands.flags import config_flag_values


def run_train(args: argparse.Namespace) -> int:
    """0 when the run finished or stopped cleanly; errors a user can fix are raised as DlscaleErrors."""
    if args.dry_run:
        from dlscale.run.dry_run import dry_run

        dry_run(api.load_config(None, args.yaml_config, args.config, args.set, **config_flag_values(args)))
        return 0
    api.train(None, args.yaml_config, args.config, args.set, **config_flag_values(args))
    return 0
