"""A `|` inside inline code in a Markdown table shows as written wherever the page is read.

The renderers disagree: GitHub (and PyPI) split a table row at every unescaped `|`, inline code or not, and want
`\\|` there; Python-Markdown (the docs site) keeps a `|` inside backticks in its cell but shows `\\|` with the
backslash. So docs/*.md, read on the site and on GitHub, write such a cell as `<code>... &#124; ...</code>`
(escape a `[` as `\\[` in it, or Markdown reads `[a] [b]` as a reference link), while README.md, read on GitHub
and PyPI only, keeps GitHub's `\\|`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS_PAGES = sorted((REPO / "docs").glob("*.md"))
README = REPO / "README.md"

# Inline code: a run of backticks, then the shortest text up to a run of the same length.
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")
FENCE = re.compile(r"^\s*(```|~~~)")


def table_rows(text: str) -> list[tuple[int, str]]:
    """(line number, line) of each table row, outside fenced code blocks."""
    rows, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and line.lstrip().startswith("|"):
            rows.append((number, line))
    return rows


def piped_code(text: str, *, unescaped_only: bool) -> list[str]:
    """`line N: code` for each inline code span of a table row holding a `|` (only an unescaped one if asked)."""
    pipe = re.compile(r"(?<!\\)\|" if unescaped_only else r"\|")
    return [
        f"line {number}: {span[0]}"
        for number, row in table_rows(text)
        for span in CODE_SPAN.finditer(row)
        if pipe.search(span[2])
    ]


@pytest.mark.parametrize("page", DOCS_PAGES, ids=lambda page: page.name)
def test_no_docs_table_cell_holds_a_pipe_in_backticks(page):
    assert piped_code(page.read_text(), unescaped_only=False) == [], (
        f"{page.relative_to(REPO)}: a `\\|` in inline code shows its backslash on the site, a `|` splits the cell "
        "on GitHub; write the cell as <code>a &#124; b</code>"
    )


def test_no_readme_table_cell_holds_an_unescaped_pipe_in_backticks():
    assert piped_code(README.read_text(), unescaped_only=True) == [], (
        "README.md: GitHub splits the cell at a `|` in inline code; escape it as `\\|`"
    )


SITE_BREAKS = "| `dlscale evaluate RUN_DIR [--split valid\\|test]` | held-out metrics |"
GITHUB_BREAKS = "| `--tf32 on|off` | TF32 |"
RENDERS_EVERYWHERE = (
    "| <code>dlscale evaluate RUN_DIR \\[--split valid&#124;test]</code> | held-out metrics |"
)


@pytest.mark.parametrize(
    ("row", "on_the_site", "on_github"),
    [(SITE_BREAKS, True, False), (GITHUB_BREAKS, True, True), (RENDERS_EVERYWHERE, False, False)],
)
def test_the_check_flags_the_cells_that_break(row, on_the_site, on_github):
    table = f"| command | what |\n|---|---|\n{row}\n"
    assert bool(piped_code(table, unescaped_only=False)) == on_the_site
    assert bool(piped_code(table, unescaped_only=True)) == on_github


def test_rows_in_a_code_block_are_not_a_table():
    assert piped_code("```\n| `a\\|b` |\n```\n", unescaped_only=False) == []
