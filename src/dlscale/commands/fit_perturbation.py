"""``dlscale fit-perturbation``: per-channel scales of ``--perturb gaussian`` fitted on the validation split
(:mod:`dlscale.run.perturbation_fit`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from dlscale.commands.trained_run_checks import check_checkpoint_target


def _options(args: argparse.Namespace):
    from dlscale.run.perturbation_fit import FitOptions

    return FitOptions(
        lead=args.lead,
        members=args.members,
        init_count=args.init_count,
        start=args.start,
        length_km=args.length_km,
        iterations=args.iterations,
        out=Path(args.out).expanduser() if args.out else None,
        batch_size=args.batch_size,
        channels=None if args.channels is None else _names(args.channels),
    )


def _names(text: str) -> tuple[str, ...]:
    """``z500, t850,t850`` -> ("z500", "t850"): comma-separated, blanks dropped, each name once."""
    return tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))


def check_fit_perturbation_command(args: argparse.Namespace) -> None:
    """The checks before torch is imported: the run or checkpoint, and every option's bounds."""
    from dlscale.run.perturbation_fit import check_fit_options

    check_checkpoint_target(args.target, args.checkpoint, "fit-perturbation")
    check_fit_options(_options(args))


def run_fit_perturbation(args: argparse.Namespace) -> int:
    """0 once the scales are written; errors a user can fix are raised as DlscaleErrors."""
    from dlscale.run.perturbation_fit import fit_perturbation_scales

    fit_perturbation_scales(args.target, _options(args), args.checkpoint, args.set)
    return 0
