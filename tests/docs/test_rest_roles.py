"""The docstrings' reST roles render on the API page as a link where the site documents the object, else as the
name in inline code, showing what Sphinx would show (docs/hooks/rest_roles.py).

The rendering tests run a docstring through what the site runs it through: Python-Markdown with mkdocs.yml's
extensions, then mkdocs-autorefs' reference fixing with a site that documents only the objects of DOCUMENTED.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]

# The objects the pretend site renders, and the address of each one's heading.
DOCUMENTED = {
    "dlscale.api": "api/#dlscale.api",
    "dlscale.api.train": "api/#dlscale.api.train",
    "dlscale.training.trainer.Trainer": "api/#dlscale.training.trainer.Trainer",
    "dlscale.training.trainer.Trainer.fit": "api/#dlscale.training.trainer.Trainer.fit",
    "dlscale.exported.loader.ExportedModel.config": "api/#dlscale.exported.loader.ExportedModel.config",
    "dlscale.models.vit.ViT.__init__": "api/#dlscale.models.vit.ViT.__init__",
}
# What a docstring of dlscale.api may call an object by: scope resolution is the griffe extension's job
# (test_rest_roles_extension.py); here a name resolves to itself unless listed.
IN_SCOPE = {"train": "dlscale.api.train"}
# A reST role that reached the page as text.
ROLE_LEFT = re.compile(r":[\w:]+:`")


def resolve_in_scope(name: str) -> str:
    return IN_SCOPE.get(name, name)


class CodeSpans(HTMLParser):
    """Each `<code>` element's text, with the `href` of the link around it (None outside a link)."""

    def __init__(self) -> None:
        super().__init__()
        self.spans: list[tuple[str, str | None]] = []
        self._href: str | None = None
        self._code: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href")
        elif tag == "code":
            self._code = []
        elif self._code is not None:
            self._code.append(f"<{tag}>")  # markup inside inline code: the name did not render as written

    def handle_endtag(self, tag: str) -> None:
        if tag == "a":
            self._href = None
        elif tag == "code" and self._code is not None:
            self.spans.append(("".join(self._code), self._href))
            self._code = None

    def handle_data(self, data: str) -> None:
        if self._code is not None:
            self._code.append(data)


@pytest.fixture(scope="module")
def render(rest_roles):
    """A docstring's text as the site shows it: (HTML, identifiers autorefs would warn about)."""
    markdown = pytest.importorskip("markdown")
    autorefs = pytest.importorskip("mkdocs_autorefs", reason="the docs extra is not installed (make docs)")
    site = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    extensions = [
        next(iter(entry)) if isinstance(entry, dict) else entry for entry in site["markdown_extensions"]
    ]
    configs = {
        next(iter(entry)): entry[next(iter(entry))]
        for entry in site["markdown_extensions"]
        if isinstance(entry, dict)
    }

    def url_of(identifier: str) -> tuple[str, str | None]:
        return DOCUMENTED[identifier], None  # KeyError: not on the site

    def rendered(docstring: str) -> tuple[str, list]:
        text = rest_roles.rewrite_roles(docstring, resolve_in_scope)
        page = markdown.markdown(text, extensions=extensions, extension_configs=configs)
        return autorefs.fix_refs(page, url_of)

    return rendered


def code_spans(page: str) -> list[tuple[str, str | None]]:
    parser = CodeSpans()
    parser.feed(page)
    return parser.spans


@pytest.mark.parametrize(
    ("docstring", "shown", "linked_to"),
    [
        ("Runs a :class:`~dlscale.training.trainer.Trainer`.", "Trainer", "dlscale.training.trainer.Trainer"),
        (
            "A :class:`dlscale.training.trainer.Trainer`.",
            "dlscale.training.trainer.Trainer",
            "dlscale.training.trainer.Trainer",
        ),
        ("Calls :func:`train`.", "train", "dlscale.api.train"),
        ("Calls :func:`dlscale.api.train`.", "dlscale.api.train", "dlscale.api.train"),
        (
            "Then :meth:`~dlscale.training.trainer.Trainer.fit`.",
            "fit",
            "dlscale.training.trainer.Trainer.fit",
        ),
        (
            "Then :meth:`dlscale.training.trainer.Trainer.fit`.",
            "dlscale.training.trainer.Trainer.fit",
            "dlscale.training.trainer.Trainer.fit",
        ),
        ("See :mod:`dlscale.api`.", "dlscale.api", "dlscale.api"),
        (
            "Its :attr:`~dlscale.exported.loader.ExportedModel.config`.",
            "config",
            "dlscale.exported.loader.ExportedModel.config",
        ),
        ("A :py:class:`~dlscale.training.trainer.Trainer`.", "Trainer", "dlscale.training.trainer.Trainer"),
        # names that Markdown would otherwise take for emphasis
        ("Built by :meth:`~dlscale.models.vit.ViT.__init__`.", "__init__", "dlscale.models.vit.ViT.__init__"),
        # a target wrapped onto the next line of the docstring
        (
            "A :class:`~dlscale.training.trainer.\n    Trainer` here.",
            "Trainer",
            "dlscale.training.trainer.Trainer",
        ),
        (
            "A :class:`dlscale.training.\n    trainer.Trainer` here.",
            "dlscale.training.trainer.Trainer",
            "dlscale.training.trainer.Trainer",
        ),
    ],
)
def test_a_role_naming_a_documented_object_is_a_link(render, docstring, shown, linked_to):
    page, unresolved = render(docstring)
    assert code_spans(page) == [(shown, DOCUMENTED[linked_to])], page
    assert unresolved == []
    assert not ROLE_LEFT.search(page) and "<autoref" not in page, page


@pytest.mark.parametrize(
    ("docstring", "shown"),
    [
        ("Raises :class:`~dlscale.errors.InvalidValue`.", "InvalidValue"),
        ("Raises :class:`dlscale.errors.InvalidValue`.", "dlscale.errors.InvalidValue"),
        ("See :mod:`dlscale.run.results_directory`.", "dlscale.run.results_directory"),
        ("See :mod:`.final_weights`.", "final_weights"),
        ("Uses :data:`~dlscale.data.era5.synth.PRESETS`.", "PRESETS"),
        ("Calls :func:`split_not_offered`.", "split_not_offered"),
        ("Calls :meth:`~dlscale.training.trainer.Trainer.no_such_method`.", "no_such_method"),
    ],
)
def test_a_role_naming_an_object_the_site_does_not_render_is_inline_code(render, docstring, shown):
    page, unresolved = render(docstring)
    assert code_spans(page) == [(shown, None)], page
    assert unresolved == [], "an unresolved reference would fail mkdocs build --strict"
    assert not ROLE_LEFT.search(page) and "<autoref" not in page, page


def test_text_around_the_roles_is_kept(render):
    page, _ = render("Runs a :class:`~dlscale.training.trainer.Trainer`, then *writes* `summary.json`.")
    assert "Runs a " in page and ", then <em>writes</em> " in page
    assert code_spans(page) == [
        ("Trainer", DOCUMENTED["dlscale.training.trainer.Trainer"]),
        ("summary.json", None),
    ]


def test_each_role_name_is_resolved_as_written(rest_roles):
    asked = []

    def resolve(name: str) -> str:
        asked.append(name)
        return name

    rest_roles.rewrite_roles(
        ":class:`~dlscale.training.trainer.Trainer`, :func:`train`, :mod:`.final_weights` and :attr:`~a.\n  b`",
        resolve,
    )
    assert asked == ["dlscale.training.trainer.Trainer", "train", ".final_weights", "a.b"]


@pytest.mark.parametrize(
    ("target", "shown"),
    [
        ("~dlscale.training.trainer.Trainer", "Trainer"),
        ("dlscale.training.trainer.Trainer", "dlscale.training.trainer.Trainer"),
        ("Trainer.fit", "Trainer.fit"),
        ("~Trainer.fit", "fit"),
        (".final_weights", "final_weights"),
        ("~.final_weights", "final_weights"),
        ("dlscale.training.\n    trainer.Trainer", "dlscale.training.trainer.Trainer"),
    ],
)
def test_the_name_shown_is_what_sphinx_shows(rest_roles, target, shown):
    assert rest_roles.shown_name(target) == shown
