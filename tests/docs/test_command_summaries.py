"""The command summaries are complete: docs/after-training.md's synopsis of ``dlscale forecast`` names every
option of its parser, the climatology section every option of ``dlscale data climatology``, the front page's
table every forecast option that changes the results, and both ``--help``'s epilog and "Where the results go"
every kind of part a forecast's directory name can have."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from dlscale.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
AFTER_TRAINING = (REPO / "docs" / "after-training.md").read_text()
INDEX = (REPO / "docs" / "index.md").read_text()
# The options that name a forecast's directory (dlscale.run.results_directory), and an example of each part.
RESULT_OPTIONS = ("--lead", "--init", "--init-count", "--write", "--climatology", "--members", "--perturb")
PARTS = (
    "lead2d",
    "every1d",
    "init8",
    "netcdf",
    "clim-timemean",
    "clim-<",
    "clim-none",
    "ens8-gaussian0.75",
    "set-",
)


def subcommand(*path: str) -> argparse.ArgumentParser:
    parser = build_parser()
    for name in path:
        (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parser = action.choices[name]
    return parser


def long_options(parser: argparse.ArgumentParser) -> list[str]:
    return [
        option
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    ]


def section(text: str, heading: str) -> str:
    """The text of the ``## heading`` section, up to the next heading of its level."""
    start = text.index(f"\n## {heading}\n")
    following = text.find("\n## ", start + 1)
    return text[start : following if following >= 0 else len(text)]


def test_the_forecast_synopsis_names_every_option():
    synopsis = re.search(r"```bash\n(dlscale forecast RUN_DIR.*?)```", AFTER_TRAINING, re.S).group(1)
    missing = [option for option in long_options(subcommand("forecast")) if option not in synopsis]
    assert not missing, f"after-training.md's forecast synopsis lacks {missing}"


def test_the_climatology_section_names_every_option_of_data_climatology():
    text = section(AFTER_TRAINING, "The climatology")
    missing = [option for option in long_options(subcommand("data", "climatology")) if option not in text]
    assert not missing, f"after-training.md's climatology section lacks {missing}"


def test_the_front_pages_table_names_every_forecast_option_that_changes_the_results():
    (row,) = [line for line in INDEX.splitlines() if line.startswith("| <code>dlscale forecast")]
    missing = [option for option in RESULT_OPTIONS if option not in row]
    assert not missing, f"docs/index.md's forecast row lacks {missing}"


def test_help_and_where_the_results_go_name_every_kind_of_part():
    epilog = " ".join(subcommand("forecast").epilog.split())
    documented = section(AFTER_TRAINING, "Where the results go")
    for where, text in (("--help", epilog), ("Where the results go", documented)):
        missing = [part for part in PARTS if part not in text]
        assert not missing, f"{where} lacks {missing}"
