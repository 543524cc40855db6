"""``dlscale tune``: climb the optimization ladder automatically and write the tuned config.

dlscale tune --yaml_config configs/vit_era5.yaml --config short --budget 60     # -> tuned/short_tuned.yaml
dlscale train --yaml_config tuned/short_tuned.yaml --config short_tuned

Running the same command again after an interruption (a Slurm time limit) continues from the cache of
finished trials beside the output. The climb itself: :mod:`dlscale.tuning.climb`.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path

from dlscale.commands.flags import config_flag_values
from dlscale.config import load_run_config
from dlscale.errors import InvalidValue
from dlscale.tuning.climb import TuneOptions
from dlscale.tuning.knobs import SETTING_KEYS, tunable_key


def tune_options(args: argparse.Namespace) -> TuneOptions:
    """The climb's options from the command line; every option, the trials' lengths too, is checked here."""
    if not (math.isfinite(args.budget) and args.budget > 0):
        raise InvalidValue("--budget", f"must be a number of minutes > 0, got {args.budget}")
    if not (math.isfinite(args.loss_tolerance) and args.loss_tolerance >= 0):
        raise InvalidValue(
            "--loss_tolerance", f"must be a fraction >= 0 (0.05 = 5%), got {args.loss_tolerance}"
        )
    if not (math.isfinite(args.min_gain) and args.min_gain >= 0):
        raise InvalidValue("--min_gain", f"must be a fraction >= 0 (0.02 = 2%), got {args.min_gain}")
    for name in ("ntrials", "nbatches", "check_steps"):
        if getattr(args, name) < 1:
            raise InvalidValue(f"--{name}", f"must be >= 1, got {getattr(args, name)}")
    if args.ntrials < 2:
        raise InvalidValue("--ntrials", "must be >= 2: one trial gives no interval to compare speeds with")
    if args.nwarmup < 0:
        raise InvalidValue("--nwarmup", f"must be >= 0, got {args.nwarmup}")
    leave_alone = []
    for name in args.skip:
        try:
            leave_alone.append(tunable_key(name))
        except ValueError:
            raise InvalidValue(
                "--skip", f"{name!r} is no setting the tune changes; it changes {', '.join(SETTING_KEYS)}"
            ) from None
    options = TuneOptions(
        budget_s=args.budget * 60,
        loss_tolerance=args.loss_tolerance,
        min_gain=args.min_gain,
        confirm=args.confirm,
        leave_alone=tuple(leave_alone),
    )
    return options


def run_tune_command(args: argparse.Namespace) -> int:
    """Tune the config on every rank of the launch; 0 when the tuned config was written.

    The options, --out and the config are checked before the tune's machinery (and torch) is imported.
    """
    options = tune_options(args)
    out = Path(args.out).expanduser() if args.out else None
    if out is not None and out.suffix not in (".yaml", ".yml"):
        raise InvalidValue(
            "--out", f"the tuned config is a YAML file: give a name ending in .yaml, got {out}"
        )
    # --nwarmup/--ntrials/--nbatches are the tune's trial lengths, not bench keys of the config it writes.
    flags = {key: value for key, value in config_flag_values(args).items() if not key.startswith("bench.")}
    load_run_config(args.yaml_config, args.config, args.set, flags)
    from dlscale.tuning.run_backend import ConfigSource, TrialLengths
    from dlscale.tuning.session import default_out, run_tune

    source = ConfigSource(args.yaml_config, args.config, tuple(args.set), flags)
    lengths = TrialLengths(args.nwarmup, args.ntrials, args.nbatches, args.check_steps)
    command = shlex.join(["dlscale", *sys.argv[1:]]) if sys.argv[1:2] == ["tune"] else "dlscale tune"
    run_tune(source, out or default_out(args.config), options, lengths, command)
    return 0
