"""The docs' table of config keys (docs/configs.md) lists every key of every section, and no key that does not
exist."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from dlscale.config.run_config import GENERIC_SECTIONS, section_classes

KEY_TABLE = Path(__file__).resolve().parents[2] / "docs" / "configs.md"


def table_keys() -> dict[str, set[str]]:
    rows = {}
    for line in KEY_TABLE.read_text().splitlines():
        match = re.match(r"\| `(\w+)` \| (.*) \|$", line)
        if match:
            rows[match.group(1)] = set(re.findall(r"`(\w+)`", match.group(2)))
    return rows


@pytest.mark.parametrize("section", ["data", "model", *GENERIC_SECTIONS])
def test_the_key_table_matches_the_config(section):
    documented = table_keys()
    assert section in documented, f"docs/configs.md has no row for the {section!r} section"
    fields = {field.name for field in dataclasses.fields(section_classes("era5_vit")[section])}
    assert documented[section] == fields, (
        f"docs/configs.md's {section!r} row: missing {sorted(fields - documented[section])}, "
        f"unknown {sorted(documented[section] - fields)}"
    )
