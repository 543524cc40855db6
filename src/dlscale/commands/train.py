"""``dlscale train``: resolve the config from the command line and train it (see :mod:`dlscale.run.training`)."""

from __future__ import annotations

import argparse

from dlscale.commands.flags import config_flag_values
from dlscale.config import load_run_config
from dlscale.run.training import train


def run_train(args: argparse.Namespace) -> int:
    """The exit status of training the config the command line names."""
    return train(load_run_config(args.yaml_config, args.config, args.set, config_flag_values(args)))
