"""The import structure of ``src/dlscale``: packages in layers (the order is written once, in CONTRIBUTING.md),
no import from a lower layer to a higher one, no circle of modules, config sections that import no torch."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "dlscale"


def layer_order() -> list[list[str]]:
    """The rows of the layer table in CONTRIBUTING.md, top first; each row lists packages (or top modules)."""
    text = (REPO / "CONTRIBUTING.md").read_text()
    block = re.search(r"<!-- layers -->\n```\n(.*?)```", text, re.S)
    assert block, "CONTRIBUTING.md has no `<!-- layers -->` block"
    rows = []
    for line in block.group(1).splitlines():
        names = line.split("#")[0].replace("|", " ").replace(",", " ").split()
        if names and not set(line.strip()) <= set("|v-^ "):
            rows.append(names)
    return rows


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> list[tuple[str, bool]]:
    """(imported dlscale module, only under ``if TYPE_CHECKING``) for every import in ``path``."""
    tree = ast.parse(path.read_text())
    own = module_name(path)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    type_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_only |= {id(inner) for stmt in node.body for inner in ast.walk(stmt)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                names = [".".join([*base, node.module] if node.module else base)]
            else:
                names = [node.module or ""]
            # `from dlscale.checkpoint import files` imports the module dlscale.checkpoint.files
            names = [
                f"{names[0]}.{a.name}"
                if (PACKAGE.parent / f"{names[0]}.{a.name}".replace(".", "/")).with_suffix(".py").exists()
                else names[0]
                for a in node.names
            ]
        else:
            continue
        found += [(name, id(node) in type_only) for name in names if name.split(".")[0] == "dlscale"]
    return found


def unit_of(module: str) -> str:
    """The layer unit of a module: its package below dlscale, or the top-level module's own name."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "dlscale"


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def test_every_package_has_a_layer_and_no_import_points_up():
    rows = layer_order()
    rank = {name: len(rows) - i for i, row in enumerate(rows) for name in row}
    units = {unit_of(m) for m in all_modules()} | {"dlscale"}
    assert units <= set(rank), f"packages missing from CONTRIBUTING.md's layer table: {units - set(rank)}"
    upward = []
    for module, path in all_modules().items():
        for target, _ in imports_of(path):
            source_unit, target_unit = unit_of(module), unit_of(target)
            if source_unit != target_unit and rank[target_unit] >= rank[source_unit]:
                upward.append(f"{module} -> {target}")
    assert not upward, "imports that do not point down the layers:\n" + "\n".join(sorted(upward))


def test_no_circle_of_modules():
    """Imports under ``if TYPE_CHECKING`` count too: a type hint that needs the module calling it (an observer
    annotating the trainer that calls it) is the same tangle for a reader, so such code names what it needs in a
    Protocol of its own (``training/observer.py``'s ``TrainerView``)."""
    graph = defaultdict(set)
    modules = all_modules()
    for module, path in modules.items():
        for target, _ in imports_of(path):
            while target not in modules and "." in target:
                target = target.rpartition(".")[0]
            if target != module:
                graph[module].add(target)
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt] if nxt in path else [node, nxt]
            if nxt not in state:
                found = visit(nxt, [*path, nxt])
                if found:
                    return found
        state[node] = 2
        return None

    for module in sorted(modules):
        if module not in state:
            circle = visit(module, [module])
            assert circle is None, "import circle: " + " -> ".join(circle)


def test_config_sections_are_leaves():
    """A ``*_config.py`` (or a package's ``config.py``) section module imports nothing of dlscale but the errors (so reading a config loads no
    torch, and any layer may read a section)."""
    leaves = {
        m: p
        for m, p in all_modules().items()
        if (m.endswith("_config") or m.endswith(".config")) and unit_of(m) != "config"
    }
    assert len(leaves) >= 15
    for module, path in leaves.items():
        imported = {target for target, _ in imports_of(path)}
        assert imported <= {"dlscale.errors"}, f"{module} imports {imported - {'dlscale.errors'}}"


@pytest.mark.parametrize(
    "code",
    [
        "import dlscale.config",
        "from dlscale.config import load_run_config; load_run_config('configs/vit_era5.yaml', 'short')",
        "from dlscale.config import config_reference; [config_reference(w) for w in "
        "__import__('dlscale.workloads').workloads.BUILT_IN]",
    ],
)
def test_reading_a_config_imports_no_torch(code):
    check = f"import sys; {code}; heavy = [m for m in ('torch', 'numpy', 'h5py', 'matplotlib') if m in sys.modules]; "
    check += "print(heavy); sys.exit(1 if heavy else 0)"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run([sys.executable, "-c", check], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{code!r} imported {done.stdout.strip()} {done.stderr[-2000:]}"


def test_built_in_workloads_resolve_like_any_other():
    """A built-in name is only an import path; the object found there is checked like a user's workload."""
    from dlscale.workloads import BUILT_IN, get_workload
    from dlscale.workloads.protocol import Workload
    from dlscale.workloads.references import as_workload, load_workload

    for name, path in BUILT_IN.items():
        workload = get_workload(name)
        assert isinstance(workload, Workload) and workload.name == name
        assert load_workload(path, path) is as_workload(
            workload, path
        )  # a subclass instance is used as it is
