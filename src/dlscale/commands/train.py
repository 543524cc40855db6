"""``dlscale train``: train the config the command line names, as :func:`dlscale.api.train` does; with
``--dry_run``, only the pre-flight check and one timed step (:mod:`dlscale.run.dry_run`)."""

from __future__ import annotations

import argparse

from dlscale.commands.flags import config_flag_values
from dlscale.config import load_run_config


def run_train(args: argparse.Namespace) -> int:
    """0 when the run finished or stopped cleanly; errors a user can fix are raised as DlscaleErrors.

    The config is resolved before the training machinery (and torch) is imported, so that a wrong name, key or
    value is refused at once.
    """
    cfg = load_run_config(args.yaml_config, args.config, args.set, config_flag_values(args))
    if args.dry_run:
        from dlscale.run.dry_run import dry_run

        dry_run(cfg)
        return 0
    from dlscale.run.training import train_and_summarize

    train_and_summarize(cfg)
    return 0
