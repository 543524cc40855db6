"""How a progress display shows itself (src/dlscale/runtime/progress_text.py): the mode for a terminal or a batch
log, and durations as a clock reads them."""

from __future__ import annotations

import io
import math

import pytest

from dlscale.runtime.progress_text import choose_progress_mode, format_duration


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_auto_is_a_bar_on_a_terminal_and_lines_in_a_log():
    assert choose_progress_mode("auto", Terminal()) == "bar"
    assert choose_progress_mode("auto", io.StringIO()) == "lines"
    for mode in ("bar", "lines", "none"):
        assert choose_progress_mode(mode, io.StringIO()) == mode


def test_an_unknown_mode_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="auto, bar, lines or none, got 'fancy'"):
        choose_progress_mode("fancy", io.StringIO())


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (6.4, "6s"), (59.6, "1m00s"), (245, "4m05s"), (3723, "1h02m03s"), (-5, "0s"),
     (math.nan, "?"), (math.inf, "?")],
)  # fmt: skip
def test_a_duration_reads_as_a_clock_and_an_unknown_one_as_a_question_mark(seconds, text):
    assert format_duration(seconds) == text
