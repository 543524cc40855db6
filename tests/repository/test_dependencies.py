"""The tested range of dlscale's dependencies: floors that pyproject.toml states and a job installs, the lock of
the versions the suite last passed with, and the docs' table of both (docs/installing.md, "Tested versions"; see
CONTRIBUTING, "Dependencies")."""

from __future__ import annotations

import importlib.util
import os
import re
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "constraints" / "tested.txt"
TESTED_VERSIONS = "docs/installing.md"  # the page that holds the table of tested versions


def load_floors_script():
    spec = importlib.util.spec_from_file_location(
        "dependency_floors", ROOT / "scripts" / "dependency_floors.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


floors_script = load_floors_script()


def pins(path: Path) -> dict[str, str]:
    """name -> version of every ``name==version`` line of a constraints file (names normalized)."""
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, pinned = line.split("==", 1)
            found[normalized(name)] = pinned.strip()
    return found


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project_requirements() -> list[Requirement]:
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [Requirement(text) for text in floors_script.requirements(pyproject)]


# ------------------------------------------------------------------------------------------- the floors


def test_every_requirement_has_a_floor_and_the_constraints_pin_it(tmp_path):
    lines = floors_script.floor_constraints(ROOT / "pyproject.toml")
    floors = dict(line.split("==") for line in lines)
    for requirement in project_requirements():
        floor = floors[normalized(requirement.name)]
        assert requirement.specifier.contains(floor, prereleases=True), (requirement, floor)
    assert floors["torch"] and floors["pyyaml"] and floors["numpy"]


@pytest.mark.parametrize(
    ("requirement", "expected"),
    [
        ("numpy>=1.24", ("numpy", "1.24")),
        ("ruff==0.17.6", ("ruff", "0.17.6")),
        ("PyYAML >=6.0, <7", ("pyyaml", "6.0")),
        ("line_profiler[all]>=4.1; python_version >= '3.10'", ("line-profiler", "4.1")),
    ],
)
def test_a_floor_is_the_lower_bound_or_the_pin(requirement, expected):
    assert floors_script.floor_of(requirement) == expected


@pytest.mark.parametrize("requirement", ["numpy", "numpy<3", "numpy~=1.24", "numpy==1.*"])
def test_a_requirement_without_a_floor_is_refused(requirement):
    with pytest.raises(ValueError, match="has no floor"):
        floors_script.floor_of(requirement)


def test_two_floors_of_one_package_are_refused(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[project]\ndependencies = ["numpy>=1.24"]\n[project.optional-dependencies]\nx = ["numpy>=1.26"]\n'
    )
    with pytest.raises(ValueError, match="numpy has two floors"):
        floors_script.floor_constraints(pyproject)


# ------------------------------------------------------------------------------------------- the lock


def test_the_lock_satisfies_every_requirement_and_pins_each_dependency():
    locked = pins(LOCK)
    for requirement in project_requirements():
        name = normalized(requirement.name)
        if name == "torch":  # a cluster brings its own build; the lock's header names the torch tested
            continue
        assert name in locked, f"{LOCK.name} has no pin of {name}: run `make lock` after `make test`"
        assert requirement.specifier.contains(locked[name], prereleases=True), (requirement, locked[name])
    assert "torch" not in locked and not any(name.startswith("nvidia-cu") for name in locked)
    assert re.search(r"Tested with Python 3\.\d+\.\d+ and torch \d", LOCK.read_text())


# ----------------------------------------------------------------------------- what this venv must hold

DEPENDENCY_SET = os.environ.get("DLSCALE_DEPENDENCY_SET", "")


@pytest.mark.skipif(not DEPENDENCY_SET, reason="a plain `make test` installs the newest releases allowed")
def test_this_environment_holds_exactly_the_versions_its_job_names():
    """`make test-oldest` and `make test LOCKED=1` set DLSCALE_DEPENDENCY_SET=floors:FILE / locked:FILE: a job
    that says it tested the floors (or the lock) must have installed them, not something newer."""
    kind, _, path = DEPENDENCY_SET.partition(":")
    assert kind in ("floors", "locked"), DEPENDENCY_SET
    expected = pins(ROOT / path)
    wrong = {}
    for name, pinned in expected.items():
        try:
            installed = version(name)
        except PackageNotFoundError:
            continue  # e.g. a package of the lock that only another platform installs
        if Version(installed.split("+")[0]) != Version(pinned.split("+")[0]):
            wrong[name] = (pinned, installed)
    assert not wrong, f"installed versions differ from {path}: {wrong}"


# ------------------------------------------------------------------------------ the docs' table of versions

# Tools that develop dlscale (the dev and docs extras) rather than run it: pinned in the lock, not in the table.
DEVELOPER_TOOLS = {
    "pytest",
    "pytest-xdist",
    "ruff",
    "line-profiler",
    "mkdocs",
    "mkdocs-material",
    "mkdocstrings",
}


def table_of_tested_versions() -> dict[str, tuple[str, str]]:
    """package -> (floor, newest tested) from the docs' table of tested versions."""
    text = (ROOT / TESTED_VERSIONS).read_text()
    section = text[text.index("<!-- tested-versions -->") : text.index("<!-- /tested-versions -->")]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip(" `") for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1][:1].isdigit():
            rows[normalized(cells[0].split(" (")[0])] = (cells[1], cells[2])
    return rows


def test_the_docs_state_the_floor_and_the_newest_tested_version_of_each_dependency():
    floors = dict(line.split("==") for line in floors_script.floor_constraints(ROOT / "pyproject.toml"))
    locked = pins(LOCK)
    torch_tested = re.search(r"and torch (\S+?)\.?$", LOCK.read_text(), re.M).group(1)
    table = table_of_tested_versions()
    assert set(table) == set(floors) - DEVELOPER_TOOLS, f"{TESTED_VERSIONS}'s table lists other packages"
    for name, (floor, newest) in table.items():
        assert floor == floors[name], (
            f"{TESTED_VERSIONS}: {name}'s floor {floor}, pyproject.toml says {floors[name]}"
        )
        tested = torch_tested if name == "torch" else locked[name]
        assert newest == tested, (
            f"{TESTED_VERSIONS}: {name} newest tested {newest}, {LOCK.name} says {tested}"
        )
