"""The checks of ``dlscale evaluate``, ``forecast`` and ``export`` that need only the command line and the file
system, made before torch is imported: the bodies of these commands import it with the checkpoint machinery,
which takes seconds (tens of seconds on a busy machine) before a mistyped option could be reported.

Checked here: the run directory or checkpoint file exists; ``--checkpoint PATH`` names a file that exists; the
forecast's ``--lead`` and ``--init`` are written as they must be and its counts are >= 1. The full checks stay
where the work is done (:mod:`dlscale.checkpoint.selection`, :mod:`dlscale.run.forecast_times`, for the Python
API too) and give the same messages: tests/commands/test_early_errors.py compares them. What needs the run's data or
its workload (a lead beyond the data, a split the workload has not) is checked there alone.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dlscale.checkpoint.trained_run import CHOICES, CONFIG_FILE, expects
from dlscale.errors import CheckpointError, ConfigError
from dlscale.run.durations import init_every_hours, lead_hours, parse_init_date
from dlscale.scoring.perturbation_scales import read_scales, scales_source
from dlscale.scoring.perturbation_spec import AUTO, check_ensemble_options


def check_checkpoint_target(target: str | Path, checkpoint: str | None, command: str) -> None:
    """CheckpointError when ``target`` does not exist, or when ``checkpoint`` names a file that a run directory
    ``target`` does not lead to (neither as a path nor inside its ``checkpoints/``)."""
    path = Path(target).expanduser()
    if not path.exists():
        raise CheckpointError(f"{path} does not exist; {expects(command)}")
    if not path.is_dir() or checkpoint is None or checkpoint in CHOICES:
        return
    nested = path.name == "checkpoints" and not (path / "checkpoints").is_dir()
    run_dir = path.parent if nested else path
    if not ((run_dir / "checkpoints").is_dir() or (run_dir / CONFIG_FILE).is_file()):
        return  # not a run directory (a sharded checkpoint's, say): the command says what it is
    chosen = Path(checkpoint).expanduser()
    if not (chosen.exists() or (run_dir / "checkpoints" / chosen).exists()):
        raise CheckpointError(
            f"--checkpoint {checkpoint}: does not exist; --checkpoint takes {' or '.join(CHOICES)} (of {run_dir}) "
            "or the path of a checkpoint file"
        )


def check_init(init: str) -> None:
    """``--init``: ``every:DURATION``, ``every:N`` (model steps) or comma-separated dates."""
    text = str(init).strip()
    if init_every_hours(text, step_hours=1.0) is not None:  # the model's step is unknown here: any will do
        return
    for item in (part.strip() for part in text.split(",") if part.strip()):
        parse_init_date(item)


def check_evaluate_command(args: argparse.Namespace) -> None:
    """``dlscale evaluate``'s checks before torch is imported."""
    check_checkpoint_target(args.target, args.checkpoint, "evaluate")


def check_forecast_command(args: argparse.Namespace) -> None:
    """``dlscale forecast``'s checks before torch is imported."""
    check_checkpoint_target(args.target, args.checkpoint, "forecast")
    lead_hours(args.lead)
    check_init(args.init)
    if args.init_count is not None and args.init_count < 1:
        raise ConfigError(f"--init-count {args.init_count}: expected a number of initial times >= 1")
    if args.batch_size is not None and args.batch_size < 1:
        raise ConfigError(f"--batch-size {args.batch_size}: expected a number of initial times >= 1")
    perturbation = check_ensemble_options(args.members, args.perturb, noise_model=None)  # model read later
    if perturbation is not None and perturbation.scales_from not in (None, AUTO):
        # a scales file that cannot be read is said now (its channels are checked against the data's later, and
        # gaussian:auto's file once the run directory is known)
        read_scales(scales_source(perturbation.scales_from, None))
    if args.names is not None and args.write is None:
        raise ConfigError(
            f"--names {args.names}: names the variables of the file --write writes; add --write netcdf or zarr"
        )
