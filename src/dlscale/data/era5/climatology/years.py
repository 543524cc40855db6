"""Which years a climatology averages: ``--years 1990-2019`` (``dlscale data climatology``) and
``--climatology-years`` (``dlscale data import-era5``), checked against the years the data holds."""

from __future__ import annotations

import re
from collections.abc import Collection

from dlscale.errors import ConfigError, DataError

_RANGE = re.compile(r"^\s*(\d{4})\s*(?:-\s*(\d{4}))?\s*$")


def parse_years(text: str, flag: str) -> tuple[int, int]:
    """``"1990-2019"`` -> (1990, 2019); ``"2018"`` -> (2018, 2018). A ConfigError naming ``flag`` otherwise."""
    match = _RANGE.match(str(text))
    if match is None:
        raise ConfigError(f"{flag} {text!r}: expected FIRST-LAST years, e.g. 1990-2019, or one year")
    first, last = int(match.group(1)), int(match.group(2) or match.group(1))
    if last < first:
        raise ConfigError(f"{flag} {text!r}: ends before it starts; expected FIRST-LAST with FIRST <= LAST")
    return first, last


def check_years_held(years: tuple[int, int], held: Collection[int], flag: str, where: str) -> None:
    """Every year of the range must be in ``held`` (the years the data has): a climatology over years it
    lacks would silently be over fewer."""
    missing = [year for year in range(years[0], years[1] + 1) if year not in held]
    if missing:
        have = _span_text(sorted(held)) if held else "no dated year"
        raise DataError(
            f"{flag} {years[0]}-{years[1]}: {where} holds no data for {_span_text(missing)}; it has {have}"
        )


def years_text(years: tuple[int, int]) -> str:
    """``1990-2019``, or ``2018`` for one year."""
    return str(years[0]) if years[0] == years[1] else f"{years[0]}-{years[1]}"


def _span_text(years: list[int]) -> str:
    """``1979-1985, 1990`` for the years 1979..1985 and 1990."""
    spans: list[list[int]] = []
    for year in years:
        if spans and year == spans[-1][1] + 1:
            spans[-1][1] = year
        else:
            spans.append([year, year])
    return ", ".join(years_text((first, last)) for first, last in spans)
