"""One line of an exception inside dlscale's one-line messages (src/dlscale/errors.py: first_line,
exception_line)."""

from __future__ import annotations

from dlscale.errors import exception_line, first_line


def test_the_first_line_of_a_message_or_the_class_name_without_one():
    assert first_line(ValueError("bad value\nmore detail")) == "bad value"
    assert first_line(ValueError("  padded  ")) == "padded"
    assert first_line(KeyError()) == "KeyError"


def test_an_exception_line_names_its_type_and_is_capped():
    assert exception_line(OSError("disk full\nerrno 28")) == "OSError: disk full"
    assert exception_line(ValueError()) == "ValueError"
    assert len(exception_line(RuntimeError("x" * 1000))) == 300
    assert exception_line(RuntimeError("x" * 1000), limit=20) == "RuntimeError: xxxxxx"
    assert len(first_line(RuntimeError("y" * 1000), limit=50)) == 50
