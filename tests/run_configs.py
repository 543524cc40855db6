"""Run configs for tests: a shipped config on a test's data set, writing its runs under a test's directory, with
no progress bar and (unless asked) no TensorBoard events.

tests/ is on sys.path (pytest's default prepend import mode puts the directory of tests/conftest.py there), so
every test folder imports this module as ``run_configs``, as it imports its own neighbours.
"""

from __future__ import annotations

from pathlib import Path

from dlscale.config import RunConfig, load_run_config


def run_settings(data: Path | str, expdir: Path | str, *, tensorboard: bool = False) -> list[str]:
    """The ``--set`` settings every test run shares: its data, where its runs go, no progress bar, and no
    TensorBoard events unless ``tensorboard``."""
    settings = [f"data.root={data}", f"log.expdir={expdir}", "log.progress=none"]
    return settings if tensorboard else [*settings, "log.tensorboard=false"]


def tiny_run_config(
    config_file: Path | str,
    data: Path | str,
    expdir: Path | str,
    *overrides: str,
    name: str = "tiny",
    tensorboard: bool = False,
    **flags: object,
) -> RunConfig:
    """Config ``name`` of ``config_file`` on ``data``, writing under ``expdir``; ``overrides`` are ``--set``
    strings applied after the shared settings, ``flags`` dotted keys (``**{"train.num_iters": 1}``) applied
    last, as the command line's flags are."""
    settings = run_settings(data, expdir, tensorboard=tensorboard)
    return load_run_config(config_file, name, [*settings, *overrides], flags)
