"""The bodies of the ``dlscale`` subcommands (the parsers live in :mod:`dlscale.cli`)."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    """Dispatch a parsed command line; return the exit status."""
    if args.command == "train":
        from dlscale.commands.train import run_train

        return run_train(args)
    if args.command == "bench":
        from dlscale.commands.bench import run_bench_command

        return run_bench_command(args)
    if args.command == "scaling":
        from dlscale.commands.scaling import run_scaling_command

        return run_scaling_command(args)
    if args.command == "monitor":
        from dlscale.commands.monitor import run_monitor_command

        return run_monitor_command(args)
    if args.command == "plan":
        from dlscale.commands.plan import run_plan_command

        return run_plan_command(args)
    if args.command == "data":
        from dlscale.commands.data import run_data

        return run_data(args)
    if args.command == "config":
        from dlscale.commands.info import run_config

        return run_config(args)
    from dlscale.commands.info import run_info

    return run_info(args)
