"""Strict JSON: every file dlscale writes parses with readers that refuse NaN and Infinity (jq, JavaScript)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from dlscale.runtime.strict_json import to_json

SRC = Path(__file__).resolve().parents[2] / "src" / "dlscale"
HELPER = SRC / "runtime" / "strict_json.py"

NON_FINITE = [float("nan"), float("inf"), float("-inf")]


def strict_loads(text: str):
    """json.loads as a strict reader does it: the NaN / Infinity / -Infinity tokens are an error."""

    def refuse(token: str):
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def test_the_strict_reader_really_refuses_nan():
    # Guards the guard: if parse_constant stopped being called, every test below would pass vacuously.
    with pytest.raises(ValueError, match="NaN"):
        strict_loads(json.dumps({"loss": float("nan")}))


@pytest.mark.parametrize("bad", NON_FINITE, ids=["nan", "inf", "-inf"])
def test_non_finite_floats_become_null_at_any_depth(bad):
    document = {
        "loss": bad,
        "nested": {"deeper": {"value": bad, "fine": 1.5}},
        "listed": [1.0, bad, [bad, {"x": bad}]],
        "tupled": (bad, 2),
    }
    parsed = strict_loads(to_json(document))
    assert parsed == {
        "loss": None,
        "nested": {"deeper": {"value": None, "fine": 1.5}},
        "listed": [1.0, None, [None, {"x": None}]],
        "tupled": [None, 2],
    }


def test_the_input_is_not_changed():
    document = {"values": [float("nan"), 1.0]}
    to_json(document)
    assert math.isnan(document["values"][0])


@pytest.mark.parametrize(
    "number", [0.1, 1 / 3, 5e-4, 1e-308, 5e-324, 1.7976931348623157e308, -2.5, 0.0, -0.0, 123456789.123]
)
def test_finite_floats_round_trip_exactly(number):
    parsed = strict_loads(to_json({"x": number, "listed": [number]}))
    assert parsed["x"] == number and parsed["listed"][0] == number
    assert math.copysign(1.0, parsed["x"]) == math.copysign(1.0, number)  # -0.0 keeps its sign


def test_other_values_are_written_as_json_writes_them():
    document = {"name": "run", "steps": 3, "ok": True, "missing": None, "big": 10**30}
    assert strict_loads(to_json(document)) == document


def test_numpy_floating_scalars_are_checked_and_written_as_numbers():
    document = {
        "f64": np.float64("nan"),
        "f32": np.float32("inf"),
        "f16": np.float16("-inf"),
        "ok32": np.float32(0.5),
        "ok64": np.float64(0.1),
    }
    parsed = strict_loads(to_json(document, default=str))
    assert parsed == {"f64": None, "f32": None, "f16": None, "ok32": 0.5, "ok64": 0.1}


def test_what_default_returns_is_checked_too():
    class Measured:
        value = float("nan")

    parsed = strict_loads(to_json({"m": Measured()}, default=lambda obj: {"value": obj.value}))
    assert parsed == {"m": {"value": None}}


def test_a_leftover_non_finite_value_raises_instead_of_writing_nan():
    with pytest.raises(ValueError, match="not JSON compliant"):
        to_json({float("nan"): 1})  # a key: replacing it with null could merge two keys, so it is refused


def test_indent_and_the_final_newline():
    assert to_json({"a": [1]}) == '{\n  "a": [\n    1\n  ]\n}\n'
    assert to_json({"a": [1]}, indent=None) == '{"a": [1]}\n'


def test_objects_json_cannot_write_need_a_default():
    with pytest.raises(TypeError):
        to_json({"path": Path("/x")})
    assert strict_loads(to_json({"path": Path("/x")}, default=str)) == {"path": "/x"}


# --------------------------------------------------------------------------------------------- the package


JSON_WRITE = re.compile(r"\bjson\.dumps?\(")

# (file relative to src/dlscale, a substring of the line) for the json.dumps calls that may stay.
ALLOWED = [
    # Builds a dict key (one key per distinct setup value), never written anywhere: NaN cannot get out.
    ("perf/bench/scaling.py", "first_file.setdefault(json.dumps(run.setup[key], sort_keys=True)"),
]


def json_writes_outside_the_helper(root: Path) -> list[str]:
    """``file:line: text`` of each json.dump / json.dumps call under ``root`` that is not allowed above."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path == HELPER:
            continue
        relative = path.relative_to(root).as_posix()
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if not JSON_WRITE.search(line):
                continue
            if any(relative == file and fragment in line for file, fragment in ALLOWED):
                continue
            found.append(f"{relative}:{number}: {line.strip()}")
    return found


def test_every_json_file_is_written_through_to_json():
    found = json_writes_outside_the_helper(SRC)
    assert not found, (
        "write JSON with dlscale.runtime.strict_json.to_json, which refuses NaN/Infinity; "
        "found json.dump(s) in:\n" + "\n".join(found)
    )


def test_the_scan_finds_json_dumps_and_json_dump(tmp_path):
    package = tmp_path / "pkg"
    (package / "perf" / "bench").mkdir(parents=True)
    (package / "perf" / "bench" / "scaling.py").write_text(
        "first_file.setdefault(json.dumps(run.setup[key], sort_keys=True), p)\n"
        "text = json.dumps(document, indent=2)\n"
    )
    (package / "other.py").write_text("import json\n\njson.dump(document, handle)\nx = myjson.dumps(1)\n")
    assert json_writes_outside_the_helper(package) == [
        "other.py:3: json.dump(document, handle)",
        "perf/bench/scaling.py:2: text = json.dumps(document, indent=2)",
    ]
