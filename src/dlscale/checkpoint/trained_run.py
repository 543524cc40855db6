"""What a command that reads a finished run (``dlscale evaluate``, ``forecast``, ``export``) takes, in the words
of both its checks: the early ones on the command line (:mod:`dlscale.commands.trained_run_checks`, before torch
is imported) and the full ones (:mod:`dlscale.checkpoint.selection`). Torch-free."""

from __future__ import annotations

CONFIG_FILE = "config.yaml"  # a run directory's resolved config
CHOICES = ("latest", "best")  # what --checkpoint takes besides a path


def expects(command: str) -> str:
    """What ``dlscale COMMAND`` takes, for the end of its messages."""
    return (
        f"dlscale {command} takes a run directory (holding checkpoints/ and config.yaml) or a checkpoint file "
        "that dlscale wrote (ckpt_latest.pt, ckpt_best.pt, ckpt_step*.pt)"
    )
