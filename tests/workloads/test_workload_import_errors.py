"""A workload module that cannot be imported, found by import path or through an installed package's entry
point: ``dlscale train`` (run in this process) prints one ``dlscale: error:`` line naming the file and line at
fault, or the entry point and the package that declared it, and exits 2.

A SyntaxError has no frame in the file it is in, so it gets its own test: the compiler's filename and line
decide, also for a module that the workload's module imports. Each test writes its modules in tmp_path under
a fresh name (a workload is imported once per process) and works in tmp_path, where messages show paths
relative to it.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

import dlscale.errors
from dlscale.cli import main
from dlscale.workloads.user_code import WorkloadFiles, error_from_user_code

CONFIG = "base:\n  workload: {workload}\n"


@pytest.fixture
def fresh(tmp_path, monkeypatch, request) -> str:
    """A module name no other test uses; tmp_path on sys.path and the working directory."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return "user_" + re.sub(r"\W", "_", request.node.name)


def write(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source).lstrip("\n"))
    return path


def install_entry_point(tmp_path: Path, distribution: str, name: str, value: str) -> None:
    """An installed package that registers ``name = value`` as a workload: its dist-info directory on sys.path,
    as pip writes it."""
    dist_info = tmp_path / f"{distribution.replace('-', '_')}-1.0.dist-info"
    write(dist_info / "METADATA", f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n")
    write(dist_info / "entry_points.txt", f"[dlscale.workloads]\n{name} = {value}\n")


def train(tmp_path: Path, workload: str) -> int:
    config = write(tmp_path / "config.yaml", CONFIG.format(workload=workload))
    return main(
        ["train", "--yaml_config", str(config), "--config", "base", "--expdir", str(tmp_path / "runs")]
    )


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("dlscale: error: "), err
    assert "Traceback" not in err
    return lines[0]


def line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


# Modules that do not compile; the compiler points at the line marked HERE. A few good lines come first, so
# that the line is not the first.
NOT_PYTHON = [
    pytest.param("SyntaxError", "def build(:  # HERE\n    pass\n", id="syntax"),
    pytest.param("IndentationError", "def build():\nreturn 1  # HERE\n", id="indentation"),
    pytest.param("TabError", "if True:\n        x = 1\n\ty = 2  # HERE\n", id="tabs"),
]
GOOD_START = "import math\n\nRADIUS = 2.0\n"


@pytest.mark.parametrize(("kind", "source"), NOT_PYTHON)
def test_a_module_named_by_import_path_that_does_not_compile_is_one_line_at_its_file_and_line(
    tmp_path, fresh, capsys, kind, source
):
    module = write(tmp_path / f"{fresh}.py", GOOD_START + source)
    assert train(tmp_path, f"{fresh}:WORKLOAD") == 2
    message = one_error_line(capsys)
    assert f"importing module {fresh!r} raised {kind}: " in message, message
    assert f"(at {fresh}.py:{line_of(module, '# HERE')}, column " in message, message


def test_a_syntax_error_in_another_file_of_the_users_names_that_file(tmp_path, fresh, capsys):
    """The workload's module imports a helper module of the same package, and the helper does not compile."""
    write(tmp_path / fresh / "__init__.py", "")
    write(
        tmp_path / fresh / "workload.py",
        f"""
        from {fresh} import helpers

        WORKLOAD = helpers.make()
        """,
    )
    helpers = write(tmp_path / fresh / "helpers.py", "def make():\n    return {'a': 1,, }  # HERE\n")
    assert train(tmp_path, f"{fresh}.workload:WORKLOAD") == 2
    message = one_error_line(capsys)
    assert f"importing module '{fresh}.workload' raised SyntaxError" in message, message
    assert f"(at {fresh}/helpers.py:{line_of(helpers, '# HERE')}, column " in message, message


def test_a_module_found_through_an_entry_point_that_does_not_compile_is_one_line_at_its_file_and_line(
    tmp_path, fresh, capsys
):
    module = write(tmp_path / f"{fresh}.py", GOOD_START + "WORKLOAD = [1, 2  # HERE\n")
    install_entry_point(tmp_path, "unclosed-bracket", fresh, f"{fresh}:WORKLOAD")
    assert train(tmp_path, fresh) == 2
    message = one_error_line(capsys)
    assert f"workload {fresh!r}: importing module {fresh!r} raised SyntaxError: " in message, message
    assert f"(at {fresh}.py:{line_of(module, '# HERE')}, column " in message, message


def test_a_syntax_error_the_users_code_makes_at_run_time_is_at_the_users_line(tmp_path, fresh, capsys):
    """A SyntaxError of a string the module compiles (``<string>``, no file): the frames decide, as for any
    other exception, and they name the user's line that compiled it."""
    module = write(tmp_path / f"{fresh}.py", GOOD_START + "LIMIT = eval('RADIUS *')  # HERE\n")
    assert train(tmp_path, f"{fresh}:WORKLOAD") == 2
    message = one_error_line(capsys)
    assert "raised SyntaxError: " in message, message
    assert f"(at {fresh}.py:{line_of(module, '# HERE')}, in <module>)" in message, message


def test_a_syntax_error_in_a_file_of_dlscales_is_dlscales_bug(tmp_path, fresh):
    """Even raised under the user's frame (the user's module importing dlscale), a SyntaxError in dlscale's
    file keeps its traceback."""
    user_file = write(tmp_path / f"{fresh}.py", "import dlscale.errors\n")
    location = (dlscale.errors.__file__, 3, 1, "broken", 3, 2)
    code = compile(f"raise SyntaxError('invalid syntax', {location!r})", str(user_file), "exec")
    with pytest.raises(SyntaxError) as raised:
        exec(code)
    assert error_from_user_code(raised.value, fresh, "importing", WorkloadFiles(tmp_path)) is None


# ------------------------------------------------------------------ an entry point that names nothing there


def test_an_entry_point_naming_a_missing_object_names_the_package_and_the_close_name(tmp_path, fresh, capsys):
    write(tmp_path / f"{fresh}.py", "WORKLOAD = object()\nOTHER = object()\n")
    install_entry_point(tmp_path, "misspelt-workload", fresh, f"{fresh}:WORKLAOD")
    assert train(tmp_path, fresh) == 2
    message = one_error_line(capsys)
    assert f"{fresh}:WORKLAOD has no attribute 'WORKLAOD' (did you mean 'WORKLOAD'?)" in message, message
    assert f"the entry point '{fresh} = {fresh}:WORKLAOD'" in message, message
    assert "of the installed package 'misspelt-workload'" in message, message


def test_an_entry_point_naming_a_missing_module_names_the_package(tmp_path, fresh, capsys):
    install_entry_point(tmp_path, "moved-workload", fresh, f"{fresh}_gone.workload:WORKLOAD")
    assert train(tmp_path, fresh) == 2
    message = one_error_line(capsys)
    assert f"cannot import module '{fresh}_gone.workload' (no module named '{fresh}_gone')" in message, (
        message
    )
    assert f"the entry point '{fresh} = {fresh}_gone.workload:WORKLOAD'" in message, message
    assert "of the installed package 'moved-workload'" in message and "reinstall" in message, message


def test_an_import_path_naming_a_missing_object_suggests_the_close_name(tmp_path, fresh, capsys):
    write(tmp_path / f"{fresh}.py", "WORKLOAD = object()\n")
    assert train(tmp_path, f"{fresh}:WORKLAOD") == 2
    message = one_error_line(capsys)
    assert f"{fresh}:WORKLAOD has no attribute 'WORKLAOD' (did you mean 'WORKLOAD'?)" in message, message
    assert "entry point" not in message, message
