"""benchmarks/mixer_cost.py: the growth exponents it fits hold on known power laws, the verdicts against the
issue's target read them right, and the committed record's Markdown is what the script writes from its
JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
RESULTS = BENCHMARKS / "results"
RECORD = RESULTS / "2026-11-28-cpu-mixer-cost"
sys.path.insert(0, str(BENCHMARKS))  # the script imports its sibling modules, as when it runs from there

import mixer_cost  # noqa: E402

POINTS = [2048.0, 4608.0, 8192.0, 18432.0, 32768.0, 73728.0]


def measurement(mixer: str, points: float, seconds: float, peak: float, flops: float) -> dict:
    return {
        "mixer": mixer,
        "points": points,
        "seconds_min": seconds,
        "peak_bytes_per_sample": peak,
        "forward_flops_per_sample": flops,
    }


def test_a_power_law_gives_its_exponent():
    assert mixer_cost.growth_exponent(POINTS, [3e-6 * p**1.7 for p in POINTS]) == pytest.approx(1.7)
    assert mixer_cost.growth_exponent(POINTS, [5.0 for _ in POINTS]) == pytest.approx(0.0, abs=1e-12)
    assert mixer_cost.growth_exponent(POINTS[:1], [1.0]) is None


def test_each_mixer_and_quantity_is_fitted_on_its_own_rows_and_the_largest_sizes_show_the_asymptote():
    rows = []
    for p in POINTS:
        # attention: a linear part plus a quadratic one that takes over at the large sizes
        rows.append(measurement("attention", p, 1e-5 * p + 1e-9 * p**2, 100 * p, 7 * p**2))
        rows.append(measurement("afno", p, 2e-5 * p**1.1, 50 * p, 3 * p))
        rows.append(measurement("sfno", p, 2e-5 * p**1.3, 60 * p**0.5, 3 * p**1.5))
    rows.append({"mixer": "sfno", "points": 1e6, "skipped": "a step predicted 99 s > 20 s"})
    fitted = mixer_cost.exponents(rows)
    attention = fitted["attention"]["time"]
    assert 1.0 < attention["all"] < attention["largest"] < 2.0
    assert attention["largest"] == pytest.approx(
        mixer_cost.growth_exponent(POINTS[-3:], [1e-5 * p + 1e-9 * p**2 for p in POINTS[-3:]])
    )
    assert fitted["attention"]["flops"]["all"] == pytest.approx(2.0)
    assert fitted["afno"]["time"]["all"] == pytest.approx(1.1)
    assert fitted["afno"]["memory"]["largest"] == pytest.approx(1.0)
    # the skipped size is left out of the fits
    assert fitted["sfno"]["time"]["largest"] == pytest.approx(1.3)
    assert fitted["sfno"]["memory"]["all"] == pytest.approx(0.5)
    assert fitted["sfno"]["flops"]["all"] == pytest.approx(1.5)


def test_the_verdicts_read_the_target_of_the_spectral_mixers():
    assert mixer_cost.verdict("afno", 1.2) == "met"
    assert mixer_cost.verdict("sfno", 1.21) == "missed"
    assert mixer_cost.verdict("attention", 1.8).startswith("above 1.2")
    assert mixer_cost.verdict("afno", None) == "n/a"


def test_the_committed_record_renders_its_markdown():
    record = json.loads(RECORD.with_suffix(".json").read_text())
    assert mixer_cost.markdown(record) == RECORD.with_suffix(".md").read_text()
    refitted = mixer_cost.exponents(record["measurements"])
    for mixer, quantities in record["exponents"].items():
        for quantity, spans in quantities.items():
            assert spans == pytest.approx(refitted[mixer][quantity]), (mixer, quantity)
    assert RECORD.with_suffix(".png").read_bytes().startswith(b"\x89PNG")
