"""The reST cross-reference roles of dlscale's docstrings (``:class:`~dlscale.errors.DlscaleError```), rewritten
for the Markdown that mkdocstrings renders.

Each role becomes an *optional* cross-reference of mkdocs-autorefs around the name as inline code: autorefs
makes it a link when the site renders the object it names, and leaves the inline code alone (no warning, so
``mkdocs build --strict`` passes) when it does not. Which objects the site renders is thus decided by the site
itself, never by a second list kept here. The name shown is Sphinx's: the target as written, or only its last
component for the ``~`` form; leading dots (Sphinx's "search by suffix" form) are not shown.

No griffe or mkdocs import here, so that the tests run without the docs extra; the griffe extension that applies
this to every docstring is rest_roles_extension.py beside it.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable

# The Python-domain roles that name an object (with or without Sphinx's `py:` domain prefix). A role's target may
# be wrapped onto a second line of the docstring; the whitespace is dropped from the name.
ROLE = re.compile(r":(?:py:)?(?P<role>class|func|meth|mod|attr|data|exc|obj|const):`(?P<target>[^`]+)`")


def shown_name(target: str) -> str:
    """The text Sphinx shows for a role's target: the last component for `~name`, else the name as written
    without leading dots."""
    name = "".join(target.split()).lstrip("~").lstrip(".")
    return name.rsplit(".", 1)[-1] if target.lstrip().startswith("~") else name


def referenced_name(target: str) -> str:
    """The dotted name a role's target refers to, as written (without `~` and whitespace; leading dots kept)."""
    return "".join(target.split()).lstrip("~")


def optional_reference(identifier: str, shown: str) -> str:
    """Markdown for `shown` as inline code that autorefs links to `identifier` if the site documents it.

    The code span stays Markdown (not a raw `<code>`), so that names such as `__init__` are not read as
    emphasis; the autoref tag around it is raw HTML, which Markdown passes through to autorefs.
    """
    return f'<autoref identifier="{html.escape(identifier)}" optional>`{shown}`</autoref>'


def rewrite_roles(text: str, resolve: Callable[[str], str]) -> str:
    """`text` with each cross-reference role replaced by an optional reference to `resolve(name)`.

    `resolve` turns the name as written (e.g. `Trainer`, `.final_weights`, `dlscale.api.train`) into the full
    dotted path of the object, as the site's headings are identified; it returns the name unchanged when it
    knows no better.
    """

    def replace(role: re.Match[str]) -> str:
        target = role["target"]
        return optional_reference(resolve(referenced_name(target)), shown_name(target))

    return ROLE.sub(replace, text)
