"""``dlscale export``: a checkpoint's model as a directory that works without the run.

    dlscale export runs/short/00 --out exports/short [--checkpoint best|latest|PATH] [--force]

What the directory holds: :mod:`dlscale.exported`; loading it: ``dlscale.load_model(DIR)``, or
``torch.export.load(DIR/model.pt2)`` where dlscale is not installed.
"""

from __future__ import annotations

import argparse

from dlscale.commands.trained_run_checks import check_checkpoint_target


def run_export_command(args: argparse.Namespace) -> int:
    """Export, print what was written; 0 on success (bad input raises a DlscaleError: one line, exit 2).

    The run directory and --checkpoint are checked before the export's machinery (and torch) is imported.
    """
    check_checkpoint_target(args.source, args.checkpoint, "export")
    from dlscale.api import export

    summary = export(args.source, args.out, checkpoint=args.checkpoint, force=args.force)
    for line in summary.lines():
        print(line)
    return 0
