"""The shape of the code: no import cycle between any two modules, no module of `nosync/`
over 600 lines, and no import of the project's own modules placed inside a function (the way
a cycle is usually hidden). The layers themselves are `lint-imports`' contracts (pyproject)."""

from __future__ import annotations

import ast
import pathlib

import grimp

ROOT = pathlib.Path(__file__).resolve().parents[3]
PACKAGES = ("cli", "experiments", "nosync", "lsm", "lineage")
ENGINE = ("nosync", "lsm", "lineage")
"""The engine: the commands and the experiments import it inside their functions, so that
`nosync --help` does not pay for pyarrow and Spark."""
MAX_LINES = 600


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph.modules):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle(tmp_path, monkeypatch):
    """The check below can fail: two modules that import each other are one cycle."""
    pkg = tmp_path / "cyclepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyclepkg import b\n")
    (pkg / "b.py").write_text("from cyclepkg import a\n")
    (pkg / "c.py").write_text("from cyclepkg import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("cyclepkg", cache_dir=None)
    assert _cycles(graph) == [["cyclepkg.a", "cyclepkg.b"]]


def test_no_two_modules_import_each_other():
    graph = grimp.build_graph(*PACKAGES, cache_dir=None, exclude_type_checking_imports=True)
    assert _cycles(graph) == []


def test_no_module_of_nosync_is_over_600_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / "nosync").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def _imports_inside_functions(path: pathlib.Path) -> list[str]:
    """`file:line module` of each import of a project module inside a function body."""
    tree = ast.parse(path.read_text())
    out = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                if name.split(".")[0] in PACKAGES:
                    out.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    return out


def test_no_project_import_is_placed_inside_a_function():
    found = [hit for pkg in ENGINE for p in sorted((ROOT / pkg).rglob("*.py")) for hit in _imports_inside_functions(p)]
    assert found == []
